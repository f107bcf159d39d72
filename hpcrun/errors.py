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
        return head + "\n\n" + "\n\n".join(p.render() for p in self.problems)


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
