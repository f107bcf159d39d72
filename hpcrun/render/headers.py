"""Per-job scripts rendered at submission: one template, one table of what varies per job.

A plan of 10^5 jobs that each need their own directives (``#DW stage_in`` lines) would otherwise
write 10^5 files, one metadata operation each on the site's Lustre or GPFS, and render them all
at plan time. Instead the plan renders the job template once with markers where a job's values
go (``jobs/job.header``) and writes one table line per job (``jobs/headers.tsv``: index, job
name, its comment lines, its burst-buffer lines; every value already rendered and checked here).
``fill`` puts a job's line into the template: the text submitted, and what ``hpcrun plan show``
prints. Before using this, the plan renders its first, middle and last job both ways and
requires the same bytes (a site template that lays a job out in a way the markers cannot carry
falls back to a file per job).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import jinja2

from hpcrun.backends.burstbuffer.base import grammar_checked
from hpcrun.backends.burstbuffer.grammar import check_script
from hpcrun.backends.scheduler import scheduler_for
from hpcrun.plan.values import Job, Plan
from hpcrun.render.scripts import RenderedFile, job_comments, render_job, render_script
from hpcrun.shell import Shell

SCRIPT_FILES_MAX = 1000          # jobs.script_files: auto writes a file per job up to this many jobs
TEMPLATE_NAME = "job.header"
TABLE_NAME = "headers.tsv"
_MARK = "HPCRUN_FILL_"          # letters and _ only: no quoting rule of a scheduler or the shell changes it
NAME, INDEX, NUMBER, COMMENTS, BB = (_MARK + k for k in ("NAME", "INDEX", "NUMBER", "COMMENTS", "BB"))
_SLOTS = (COMMENTS, BB)


def at_submission(plan: Plan) -> bool:
    """Whether this plan's per-job scripts are rendered at submission instead of written as files."""
    per_job = [s for s in plan.scripts if s.array is None]
    mode = plan.campaign.jobs.script_files
    if len(per_job) < 2 or mode == "always":
        return False
    return mode == "never" or len(per_job) > SCRIPT_FILES_MAX


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
        out: List[str] = []
        for part in self.parts:
            if isinstance(part, Slot):
                lines = comments if part.marker == COMMENTS else bb_lines
                out.extend(f"{part.before}{line}{part.after}\n" for line in lines)
            else:
                out.append(part.replace(NAME, name).replace(NUMBER, str(index + 1)).replace(INDEX, str(index)))
        return "".join(out)


def row_of(job: Job, name: str, comments: Sequence[str], bb_lines: Sequence[str]) -> str:
    """A job's line of headers.tsv (rendered values carry no TAB or line break: checked by the caller)."""
    return "\t".join([str(job.index), name, str(len(comments)), *comments, *bb_lines]) + "\n"


def parse_row(line: str) -> Tuple[int, str, List[str], List[str]]:
    """(index, name, comment lines, burst-buffer lines) of a headers.tsv line."""
    fields = line.rstrip("\n").split("\t")
    n = int(fields[2])
    return int(fields[0]), fields[1], fields[3:3 + n], fields[3 + n:]


def header_files(env: jinja2.Environment, template: str, plan: Plan, common: Dict[str, Any],
                 plan_dir: str) -> Optional[List[RenderedFile]]:
    """The template and the table of a plan's per-job scripts, or None when filling the template
    does not give, byte for byte, what rendering gives (then every job gets its file)."""
    first = plan.scripts[0]
    assert first.request is not None
    text = render_job(env, template, plan, common, plan_dir, replace(first.request, name=NAME), (BB,),
                      Shell(INDEX), f"job {NUMBER} of {len(plan.jobs)}", [COMMENTS], False)
    parsed = HeaderTemplate.parse(text)
    scripts = plan.scripts
    for k in sorted({0, len(scripts) // 2, len(scripts) - 1}):
        s = scripts[k]
        assert s.request is not None
        real = render_script(env, template, plan, s, common, plan_dir)
        if parsed.fill(s.jobs[0].index, s.request.name, job_comments(s.jobs[0]), s.bb_lines) != real:
            return None
    own = plan.seat.subdir
    return [RenderedFile(f"{own}jobs/{TEMPLATE_NAME}", text),
            RenderedFile(f"{own}jobs/{TABLE_NAME}", "", chunks=_rows(plan))]


def _rows(plan: Plan) -> Iterator[str]:
    """headers.tsv, 2000 jobs per piece; each job's directive lines checked against the grammar, as
    every job script's are when it is a file."""
    prefix, grammar = "#" + plan.profile.burst_buffer.directive, grammar_checked(plan.profile.burst_buffer.system)
    directive = scheduler_for(plan.scheduler).directive
    chunk: List[str] = []
    for script in plan.scripts:
        job = script.jobs[0]
        assert script.request is not None
        comments = job_comments(job)
        fields = [script.request.name, *comments, *script.bb_lines]
        bad = [f for f in fields if "\t" in f or "\n" in f or "\r" in f] or check_script(
            list(script.bb_lines), prefix, grammar, job_directive=directive)
        if bad:   # a bug in hpcrun or a site's profile: rendered values are single, valid lines
            raise ValueError(f"job {script.request.name}: rendered header lines are invalid: {bad}")
        chunk.append(row_of(job, script.request.name, comments, script.bb_lines))
        if len(chunk) >= 2000:
            yield "".join(chunk)
            chunk = []
    yield "".join(chunk)
