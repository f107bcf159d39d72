"""Filling a plan's script template at submission (render/headers.py writes the template and its table): the
markers, the template's parts, the table's lines. Only the standard library: ``hpcrun submit`` and ``hpcrun run``
fill a big plan's scripts (above SCRIPT_FILES_MAX jobs) without the renderer's jinja2 and the plan's models, which
took 0.2-0.3 s to import in the first round of every such campaign, before its first jobs were queued (issue 55).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Mapping, Sequence, Tuple, Union

TEMPLATE_NAME = "job.header"
TABLE_NAME = "headers.tsv"
ARRAY_TEMPLATE_NAME = "array.header"
ARRAY_TABLE_NAME = "arrays.tsv"
_MARK = "HPCRUN_FILL_"          # letters and _ only: no quoting rule of a scheduler or the shell changes it
NAME, INDEX, NUMBER, LAST, SPEC, COMMENTS, BB = (
    _MARK + k for k in ("NAME", "INDEX", "NUMBER", "LAST", "ARRAY", "COMMENTS", "BB"))
_SLOTS = (COMMENTS, BB)
_WORDS = re.compile("|".join((NAME, INDEX, NUMBER, LAST, SPEC)))


@dataclass(frozen=True)
class Slot:
    """A line of the template that stands for zero or more lines of a job (text around the marker kept)."""
    marker: str
    before: str
    after: str


Part = Union[str, Slot]


@dataclass(frozen=True)
class HeaderTemplate:
    parts: Tuple[Part, ...]

    @classmethod
    def parse(cls, text: str) -> HeaderTemplate:
        parts: List[Part] = []
        rest = text
        while True:
            found = [(rest.find(m), m) for m in _SLOTS if rest.find(m) >= 0]
            if not found:
                parts.append(rest)
                return cls(tuple(parts))
            at, marker = min(found)
            start = rest.rfind("\n", 0, at) + 1
            end = rest.find("\n", at)
            end = len(rest) if end < 0 else end + 1
            parts.append(rest[:start])
            parts.append(Slot(marker, rest[start:at], rest[at + len(marker):end].rstrip("\n")))
            rest = rest[end:]

    def fill(self, index: int, name: str, comments: Sequence[str], bb_lines: Sequence[str]) -> str:
        """A job's script: the markers replaced by its values (the values are not searched again)."""
        return self.fill_words({NAME: name, NUMBER: str(index + 1), INDEX: str(index)}, comments, bb_lines)

    def fill_words(self, words: Mapping[str, str], comments: Sequence[str], bb_lines: Sequence[str]) -> str:
        """The markers replaced in one pass (a value holding a marker's text is left as it is)."""
        out: List[str] = []
        for part in self.parts:
            if isinstance(part, Slot):
                lines = comments if part.marker == COMMENTS else bb_lines
                out.extend(f"{part.before}{line}{part.after}\n" for line in lines)
            else:
                out.append(_WORDS.sub(lambda m: words.get(m.group(0), m.group(0)), part))
        return "".join(out)

    def fill_array(self, first: int, last: int, name: str, spec: str, bb_lines: Sequence[str]) -> str:
        """An array's script: jobs first..last (indices), its name and its ``--array`` spec."""
        words = {NAME: name, INDEX: str(first), NUMBER: str(first + 1), LAST: str(last + 1), SPEC: spec}
        return self.fill_words(words, (), bb_lines)


def parse_row(line: str) -> Tuple[int, str, List[str], List[str]]:
    """(index, name, comment lines, burst-buffer lines) of a headers.tsv line."""
    fields = line.rstrip("\n").split("\t")
    n = int(fields[2])
    return int(fields[0]), fields[1], fields[3:3 + n], fields[3 + n:]


def array_row(first: int, last: int, name: str, spec: str, bb_lines: Sequence[str]) -> str:
    """An array's line of arrays.tsv."""
    return "\t".join([str(first), str(last), name, spec, *bb_lines]) + "\n"


def parse_array_row(line: str) -> Tuple[int, int, str, str, List[str]]:
    """(first, last, name, spec, burst-buffer lines) of an arrays.tsv line."""
    fields = line.rstrip("\n").split("\t")
    return int(fields[0]), int(fields[1]), fields[2], fields[3], fields[4:]
