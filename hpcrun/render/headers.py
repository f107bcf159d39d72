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

Array plans do the same with their array scripts above the same number of jobs: one template
(``jobs/array.header``) and one line per array (``jobs/arrays.tsv``: first and last job, array
name, the ``--array`` spec, its burst-buffer lines), so an array plan of 10^6 jobs writes no
thousand scripts either.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import jinja2

from hpcrun.backends.burstbuffer.base import grammar_checked
from hpcrun.backends.burstbuffer.grammar import check_script
from hpcrun.backends.scheduler import scheduler_for
from hpcrun.plan.values import Job, Plan, ScriptPlan, index_range
from hpcrun.render.header_fill import (
    ARRAY_TABLE_NAME,
    ARRAY_TEMPLATE_NAME,
    BB,
    COMMENTS,
    INDEX,
    LAST,
    NAME,
    NUMBER,
    SPEC,
    TABLE_NAME,
    TEMPLATE_NAME,
    HeaderTemplate,
    array_row,
)
from hpcrun.render.scripts import RenderedFile, job_comments, render_job, render_script
from hpcrun.shell import Shell

SCRIPT_FILES_MAX = 1000          # jobs.script_files: auto writes script files up to this many jobs


def at_submission(plan: Plan) -> bool:
    """Whether this plan's scripts (per-job, or arrays) are rendered at submission instead of written
    as files: above SCRIPT_FILES_MAX jobs under ``auto``, always under ``never``."""
    scripts = plan.scripts
    mode = plan.campaign.jobs.script_files
    if not scripts or mode == "always" or len({s.array is None for s in scripts}) > 1:
        return False
    return mode == "never" or len(plan.jobs) > SCRIPT_FILES_MAX


def row_of(job: Job, name: str, comments: Sequence[str], bb_lines: Sequence[str]) -> str:
    """A job's line of headers.tsv (rendered values carry no TAB or line break: checked by the caller)."""
    return "\t".join([str(job.index), name, str(len(comments)), *comments, *bb_lines]) + "\n"


def header_files(env: jinja2.Environment, template: str, plan: Plan, common: Dict[str, Any],
                 plan_dir: str) -> Optional[List[RenderedFile]]:
    """The template and the table of a plan's scripts (per-job or arrays), or None when filling the
    template does not give, byte for byte, what rendering gives (then every script is a file)."""
    arrays = plan.scripts[0].array is not None
    first = plan.scripts[0]
    assert first.request is not None
    if arrays:
        text = render_job(env, template, plan, common, plan_dir, replace(first.request, array=SPEC), (BB,),
                          Shell(INDEX), f"array {NAME}: jobs {NUMBER}..{LAST}", [], True)
    else:
        text = render_job(env, template, plan, common, plan_dir, replace(first.request, name=NAME), (BB,),
                          Shell(INDEX), f"job {NUMBER} of {len(plan.jobs)}", [COMMENTS], False)
    parsed = HeaderTemplate.parse(text)
    scripts = plan.scripts
    for k in sorted({0, len(scripts) // 2, len(scripts) - 1}):
        s = scripts[k]
        if _filled(parsed, s) != render_script(env, template, plan, s, common, plan_dir):
            return None
    own = plan.seat.subdir
    if arrays:
        return [RenderedFile(f"{own}jobs/{ARRAY_TEMPLATE_NAME}", text),
                RenderedFile(f"{own}jobs/{ARRAY_TABLE_NAME}", "", chunks=_array_rows(plan))]
    return [RenderedFile(f"{own}jobs/{TEMPLATE_NAME}", text),
            RenderedFile(f"{own}jobs/{TABLE_NAME}", "", chunks=_rows(plan))]


def _filled(template: HeaderTemplate, script: ScriptPlan) -> str:
    """A script of the plan as the template filled with its line gives it."""
    assert script.request is not None
    if script.array is not None:
        first, last = index_range(script.jobs)
        return template.fill_array(first, last, script.name, script.array, script.bb_lines)
    return template.fill(script.jobs[0].index, script.request.name, job_comments(script.jobs[0]), script.bb_lines)


def _checker(plan: Plan) -> Callable[[str, Sequence[str], Sequence[str]], None]:
    """Checks of a script's rendered values (made once per plan, called once per script): single lines
    without TAB, directive lines valid; a failure is a bug in hpcrun or a site's profile (every script
    file's lines are checked the same way)."""
    prefix, grammar = "#" + plan.profile.burst_buffer.directive, grammar_checked(plan.profile.burst_buffer.system)
    directive = scheduler_for(plan.scheduler).directive

    def check(name: str, fields: Sequence[str], bb_lines: Sequence[str]) -> None:
        bad = [f for f in fields if "\t" in f or "\n" in f or "\r" in f] or check_script(
            list(bb_lines), prefix, grammar, job_directive=directive)
        if bad:
            raise ValueError(f"{name}: rendered header lines are invalid: {bad}")
    return check


def _array_rows(plan: Plan) -> Iterator[str]:
    """arrays.tsv: one line per array script (10^3 at 10^6 jobs: one piece)."""
    rows = []
    check = _checker(plan)
    for script in plan.scripts:
        assert script.array is not None
        first, last = index_range(script.jobs)
        check(script.name, [script.name, script.array, *script.bb_lines], script.bb_lines)
        rows.append(array_row(first, last, script.name, script.array, script.bb_lines))
    yield "".join(rows)


def _rows(plan: Plan) -> Iterator[str]:
    """headers.tsv, 2000 jobs per piece; each job's directive lines checked against the grammar, as
    every job script's are when it is a file."""
    chunk: List[str] = []
    check = _checker(plan)
    for script in plan.scripts:
        job = script.jobs[0]
        assert script.request is not None
        comments = job_comments(job)
        check(f"job {script.request.name}", [script.request.name, *comments, *script.bb_lines], script.bb_lines)
        chunk.append(row_of(job, script.request.name, comments, script.bb_lines))
        if len(chunk) >= 2000:
            yield "".join(chunk)
            chunk = []
    yield "".join(chunk)
