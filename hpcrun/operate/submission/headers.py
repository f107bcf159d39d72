"""The scripts of jobs whose headers are rendered at submission: read from the plan's template
and table (``jobs/job.header``, ``jobs/headers.tsv``), one job at a time.

The table is read once per process to note where each job's line starts (8 bytes per job: 8 MB
at 10^6 jobs), then each job's line is read alone; nothing else of it is kept. An array plan's
table (``jobs/arrays.tsv``, a line per array: 10^3 at 10^6 jobs) is read whole.
"""

from __future__ import annotations

import hashlib
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from hpcrun.errors import InputError, Problem
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.results import ScriptInfo

# render.header_fill is imported by the first script filled from a template: the standard library alone (the
# renderer's jinja2 and the plan's models, 0.2-0.3 s, are the plan's, not a submission's)
if TYPE_CHECKING:
    from hpcrun.render.header_fill import HeaderTemplate


def _render() -> Any:
    """render/header_fill.py, imported when a script is first filled from its template."""
    from hpcrun.render import header_fill

    return header_fill


class HeaderBook:
    """Job scripts filled from one template and its table; ``text(job)`` is what is submitted."""

    def __init__(self, plan_dir: Path, template: str, table: str):
        self.template_path = plan_dir / template
        self.table_path = plan_dir / table
        self._template: Optional[HeaderTemplate] = None
        self._offsets: Optional[array] = None   # where the line of job first + k starts
        self._first = 0
        self._arrays: Optional[Dict[int, Tuple[int, int, str, str, List[str]]]] = None

    def _problem(self, path: Path, why: str) -> InputError:
        return InputError([Problem(str(path), None, "", f"{why}; re-run `hpcrun plan` (the plan directory "
                                                        "is incomplete or was edited)")])

    def _parsed(self) -> HeaderTemplate:
        if self._template is None:
            try:
                self._template = _render().HeaderTemplate.parse(self.template_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise self._problem(self.template_path, f"cannot be read: {exc}") from None
        return self._template

    def _line_offsets(self) -> array:
        """Where each job's line of the per-job table starts (read once)."""
        if self._offsets is None:
            offsets = array("q")
            try:
                with open(self.table_path, "rb") as f:
                    at = 0
                    for line in f:
                        if not offsets:
                            self._first = int(line[:line.index(b"\t")])
                        offsets.append(at)
                        at += len(line)
            except (OSError, ValueError) as exc:
                raise self._problem(self.table_path, f"cannot be read: {exc}") from None
            self._offsets = offsets
        return self._offsets

    def row(self, job_index: int) -> Tuple[int, str, List[str], List[str]]:
        offsets = self._line_offsets()
        k = job_index - self._first
        row = None
        if 0 <= k < len(offsets):
            with open(self.table_path, "rb") as f:
                f.seek(offsets[k])
                row = _render().parse_row(f.readline().decode("utf-8"))
        if row is None or row[0] != job_index:
            raise self._problem(self.table_path, f"has no line for job {job_index}")
        return row

    def text(self, job_index: int) -> str:
        """Job ``job_index``'s script (an array's: its first job's), byte for byte what the scheduler
        is handed."""
        if self.table_path.name == _render().ARRAY_TABLE_NAME:
            return self._parsed().fill_array(*self._array_row(job_index))
        index, name, comments, bb_lines = self.row(job_index)
        return self._parsed().fill(index, name, comments, bb_lines)

    def _array_row(self, first: int) -> Tuple[int, int, str, str, List[str]]:
        if self._arrays is None:
            try:
                with open(self.table_path, encoding="utf-8") as f:
                    self._arrays = {row[0]: row for row in map(_render().parse_array_row, f)}
            except (OSError, ValueError, IndexError) as exc:
                raise self._problem(self.table_path, f"cannot be read: {exc}") from None
        row = self._arrays.get(first)
        if row is None:
            raise self._problem(self.table_path, f"has no array starting at job {first}")
        return row


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def job_script(plan_dir: Path, manifest: Manifest, word: str) -> str:
    """The script of one job for ``hpcrun plan show``: JOB is a plan job's name (``camp.00042``), its
    number (``42``) or its script's name (``job00042``)."""
    index = _job_index(manifest, word)
    for s in manifest.scripts:
        first, last = s["jobs"]
        if first <= index <= last:
            headers = s.get("headers")
            if headers:
                return HeaderBook(plan_dir, s["path"], headers).text(first if s["array"] else index)
            try:
                return (plan_dir / s["path"]).read_text(encoding="utf-8")
            except OSError as exc:
                raise InputError([Problem(str(plan_dir / s["path"]), None, "", f"cannot be read: {exc}")]) from None
    raise InputError([Problem(str(plan_dir / "manifest.json"), None, "", f"has no script for job {index + 1}")])


def _job_index(manifest: Manifest, word: str) -> int:
    total = manifest.total_jobs
    prefix = manifest.campaign + "."
    digits = word[len(prefix):] if word.startswith(prefix) else word[3:] if word.startswith("job") else word
    if digits.isdigit() and 1 <= int(digits) <= total:
        return int(digits) - 1
    raise InputError([Problem(word, None, "JOB", (
        f"is not a job of campaign {manifest.campaign}: give its name ({prefix}{1:05d}), its number "
        f"(1 to {total}) or its script's name (job00001)"))])


def text_key(script: ScriptInfo, job_index: int) -> int:
    """Whose text a job is submitted with: its own, or its array's (named by the array's first job)."""
    return script.first if script.is_array else job_index
