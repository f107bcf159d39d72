"""``--local``: run a planned sweep on this node now, leaving the same ``raw/`` files a batch
job leaves (so one collector reads both). fio runs as a plain process; IOR under the
profile's ``iotune.mpirun``. Each point writes in its own directory, removed afterwards.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Callable, List, Optional

from hpcrun.backends.scheduler import scheduler_for
from hpcrun.errors import InputError, Problem
from hpcrun.iotune.engines import engine_for
from hpcrun.iotune.points import Point, Step, substitute
from hpcrun.iotune.sweeps.plan import SUBDIR, SweepPlan


def _fstype(path: Path) -> str:
    """Filesystem type as the job script finds it: findmnt (ext4, lustre ...), else stat -f."""
    for argv in (["findmnt", "-n", "-o", "FSTYPE", "-T", str(path)], ["stat", "-f", "-c", "%T", str(path)]):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip().splitlines()[0]
    return "unknown"


def _write(path: Path, text: str) -> None:
    path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")


def argv_for(plan: SweepPlan, step: Step, point_dir: str, raw: str) -> List[str]:
    words: List[str] = []
    if step.ranks is not None:
        nodes, per_node = step.ranks
        words += list(plan.profile.iotune.mpirun) + ["-np", str(nodes * per_node)]
    if step.env:
        words += ["env"] + [f"{k}={substitute(v, point_dir, raw)}" for k, v in step.env]
    return words + [substitute(w, point_dir, raw) for w in step.argv]


def _engine_version(plan: SweepPlan) -> str:
    argv = engine_for(plan.engine).version_argv(plan.engine_bin)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return (proc.stdout + proc.stderr).strip() or "unknown"
    except OSError:
        return "unknown"


def run(plan: SweepPlan, sweep_dir: Path, progress: Optional[Callable[[Point, Step], None]] = None) -> None:
    """Run every step; a failing step is recorded in raw/<step>.rc, the sweep goes on."""
    engine = shutil.which(plan.engine_bin)
    if engine is None:
        raise InputError([Problem("<command line>", None, "--engine", (
            f"the {plan.engine} binary '{plan.engine_bin}' is not on PATH here; install it, set its path "
            f"in the profile ({engine_for(plan.engine).binary_key}) or choose "
            "another --engine"))])
    why = engine_for(plan.engine).local_problem(plan.profile)
    if why:
        raise InputError([Problem("<command line>", None, "--engine", why)])
    bad = [t for t in plan.targets if t.path is None or not Path(t.path).is_dir()
           or not os.access(t.path, os.W_OK | os.X_OK)]
    if bad:
        raise InputError([Problem("<command line>", None, "--target", (
            f"target directory '{t.path}' ({t.name}) does not exist or is not writable here; the sweep "
            "writes in a new subdirectory of an existing directory")) for t in bad])
    raw = sweep_dir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    _write(raw / "node", socket.gethostname())
    _write(raw / "started", dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    _write(raw / "job_id", scheduler_for(plan.profile.scheduler.kind).job_env() or "")
    _write(raw / "engine-version", _engine_version(plan))
    if plan.darshan_lib:
        (raw / "darshan").mkdir(exist_ok=True)
    for target in plan.targets:
        assert target.path is not None
        top = Path(target.path) / f"{SUBDIR}.{os.getpid()}"
        try:
            top.mkdir(exist_ok=True)
        except OSError as exc:
            raise InputError([Problem("<command line>", None, "--target", (
                f"cannot create {top}: {exc.strerror}; choose a writable target"))]) from None
        _write(raw / f"target-{target.index}.path", str(top))
        _write(raw / f"target-{target.index}.fstype", _fstype(top))
        try:
            for point in plan.points:
                if point.target != target.name:
                    continue
                point_dir = top / point.id
                point_dir.mkdir(exist_ok=True)
                try:
                    for step in plan.steps_of(point):
                        if progress:
                            progress(point, step)
                        _run_step(plan, step, str(point_dir), raw)
                finally:
                    shutil.rmtree(point_dir, ignore_errors=True)
        finally:
            shutil.rmtree(top, ignore_errors=True)
    _write(raw / "exit_code", "0")


def _run_step(plan: SweepPlan, step: Step, point_dir: str, raw: Path) -> None:
    if step.darshan and not step.darshan.endswith(".darshan"):
        (raw / step.darshan).mkdir(parents=True, exist_ok=True)
    argv = argv_for(plan, step, point_dir, str(raw))
    with open(raw / step.stdout, "wb") as out, open(raw / f"{step.name}.err", "wb") as err:
        try:
            rc = subprocess.run(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL).returncode
        except OSError as exc:
            err.write(f"cannot run {argv[0]}: {exc}\n".encode())
            rc = 127
    _write(raw / f"{step.name}.rc", str(rc))
