"""Slurm's words live in one room: outside ``hpcrun/backends/scheduler/`` no module or template
names sbatch, srun, sacct, squeue, scontrol or a ``SLURM_``/``SLURMD_`` variable.

A second scheduler is then one new module there, not a hunt through the package. The only
exception is the spec key ``extra_sbatch``, whose name users write (its values are checked by
the Slurm backend).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

import pytest

from hpcrun.backends.scheduler import names, scheduler_for
from hpcrun.backends.scheduler.base import JobRequest

REPO = Path(__file__).resolve().parents[1]
COMMANDS = re.compile(r"(?<![A-Za-z])(sbatch|srun|sacct|squeue|scontrol)(?![A-Za-z])", re.IGNORECASE)
VARIABLES = re.compile(r"SLURMD?_")
ALLOWED = ("extra_sbatch",)   # user-facing spec key


def _files() -> List[Path]:
    files = sorted((REPO / "hpcrun").rglob("*.py")) + sorted((REPO / "templates").rglob("*.j2"))
    room = REPO / "hpcrun" / "backends" / "scheduler"
    return [f for f in files if room not in f.parents]


def _offences(text: str) -> List[str]:
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        bare = line
        for word in ALLOWED:
            bare = bare.replace(word, "")
        hit = COMMANDS.search(bare) or VARIABLES.search(bare)
        if hit:
            found.append(f"{n}: {hit.group(0)}: {line.strip()}")
    return found


def test_no_scheduler_words_outside_the_scheduler_room():
    files = _files()
    assert len(files) > 50, "the package and templates were not found"
    bad = {str(f.relative_to(REPO)): o for f in files if (o := _offences(f.read_text(encoding="utf-8")))}
    assert not bad, "scheduler words outside hpcrun/backends/scheduler/:\n" + "\n".join(
        f"{path}:{line}" for path, lines in bad.items() for line in lines)


@pytest.mark.parametrize("text,hit", [
    ("run it with sbatch", True), ("SRUN", True), ("${SLURM_JOB_ID}", True), ("$SLURMD_NODENAME", True),
    ("extra_sbatch: []", False), ("slurm_partition", False), ("a .sbatch file", True), ("sbatched", False),
])
def test_the_grep_finds_what_it_should(text, hit):
    assert bool(_offences(text)) is hit


def test_every_registered_scheduler_answers_the_renderer():
    """Each backend gives directive lines for a request and the identity every template reads."""
    request = JobRequest(name="c", nodes=2, walltime_s=600, signal_before_s=60, log_dir="/p/logs",
                         comment="hpcrun:c", tasks_per_node=4, array="0-3%2")
    for name in names():
        sched = scheduler_for(name)
        lines = sched.directive_lines(request)
        assert lines and all(line.startswith(sched.directive + " ") for line in lines)
        job = "\n".join(sched.job_identity(True))
        for var in ("HPCRUN_JOB_ID", "HPCRUN_NODES", "HPCRUN_ARRAY_INDEX"):
            assert f"export {var}=" in job
        assert "HPCRUN_ARRAY_INDEX" not in "\n".join(sched.job_identity(False))
        task = "\n".join(sched.task_identity())
        for var in ("HPCRUN_RANK", "HPCRUN_NRANKS", "HPCRUN_NODE"):
            assert f"export {var}=" in task
        assert sched.launch.command and sched.script_suffix.startswith(".")
