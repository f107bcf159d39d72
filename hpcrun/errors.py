"""Problems found in user input, reported together and without tracebacks."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Tuple

Path = Tuple[object, ...]


@dataclass(frozen=True)
class Problem:
    """One thing wrong in one file: where it is and what would be valid."""

    file: str
    line: Optional[int]
    key: str
    message: str
    # many values failing one check are told once (InputError.render): what they share, the value, the fix
    cause: str = ""       # e.g. "do not exist here and have no size"
    subject: str = ""     # the value this problem is about (a path)
    fix: str = ""         # what to do, said once for all of them

    def render(self) -> str:
        where = self.file if self.line is None else f"{self.file}, line {self.line}"
        key = f", key '{self.key}'" if self.key else ""
        return f"{where}{key}: {self.message}"


class HpcrunError(Exception):
    """Base class: anything the CLI reports as a message and exit code, never a traceback."""

    exit_code = 1


class InputError(HpcrunError):
    """Invalid user input (spec, profile, command-line value). Exit code 2."""

    exit_code = 2

    def __init__(self, problems: Sequence[Problem]):
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.problems)
        head = "1 problem found:" if n == 1 else f"{n} problems found:"
        return head + "\n\n" + "\n\n".join(paragraphs(self.problems))


GROUP_MIN = 3        # this many problems of one cause become one paragraph
EXAMPLES = 3         # values shown in such a paragraph


def paragraphs(problems: Sequence[Problem]) -> list:
    """One paragraph per problem, except that problems of one cause in one file are told together:
    how many, where (file and lines), a few of the values, and the fix once."""
    groups: dict = {}
    for p in problems:
        key = (p.cause, p.fix, p.file, p.key) if p.cause else id(p)
        groups.setdefault(key, []).append(p)
    out = []
    for group in groups.values():
        if len(group) < GROUP_MIN:
            out += [p.render() for p in group]
            continue
        first = group[0]
        lines = sorted({p.line for p in group if p.line is not None})
        where = f"{first.file} {'line' if len(lines) == 1 else 'lines'} {line_ranges(lines)}" if lines else first.file
        at_key = f", key '{first.key}'" if first.key else ""
        shown = ", ".join(p.subject for p in group[:EXAMPLES]) + (", ..." if len(group) > EXAMPLES else "")
        out.append(f"{where}{at_key}: {len(group)} inputs {first.cause} (e.g. {shown})"
                   + (f"; {first.fix}" if first.fix else ""))
    return out


def line_ranges(lines: Sequence[int], most: int = 6) -> str:
    """[1, 2, 3, 7, 9, 10] -> '1-3, 7, 9-10' (the first ``most`` ranges, then how many more lines)."""
    spans: list = []
    for n in lines:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans[:most])
    rest = sum(b - a + 1 for a, b in spans[most:])
    return text + (f" and {rest} more" if rest else "")


def dotted(path: Iterable[object]) -> str:
    """``('inputs', 'files', 3)`` -> ``inputs.files[3]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A short suggestion clause, or an empty string when nothing is close."""
    close = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


class SourceError(HpcrunError):
    """One input file (a result file, a log) that cannot be read: the message names it and says why.

    Tools that read many files report one such error per file and go on with the others.
    """

    exit_code = 1

    def __init__(self, source: str, problem: str):
        self.source = source
        self.problem = problem
        super().__init__(f"{source}: {problem}")
