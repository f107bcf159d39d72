"""The fio engine: sweep parameters -> fio argv, and fio's JSON output -> a measurement.

Mapping: transfer size -> ``bs``, block size -> ``size`` (per writer), writers -> ``numjobs``
with ``group_reporting`` (one aggregate figure), operation -> ``rw``. File per process: each
job its own file (``filename_format``); shared file: one file, job k at offset k x block
(``offset_increment``). Writes end with an fsync (``end_fsync``), like IOR's ``-e``, so the
figure includes getting the data to the device. fio itself repeats nothing: each repetition
is its own run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpcrun.iotune.engines.base import DarshanEnv, Engine, register
from hpcrun.iotune.points import DIR, EngineOutputError, Measurement, Point, Step, SweepShape, combine
from hpcrun.model.site import SiteProfile

MIB = 2**20


def argv(fio: str, point: Point, operation: str, direct: bool) -> List[str]:
    words = [fio, "--name=hpcrun", f"--rw={operation}", f"--bs={point.transfer}",
             f"--size={point.block}", f"--numjobs={point.writers}", "--group_reporting",
             "--output-format=json", f"--directory={DIR}", "--ioengine=psync", "--invalidate=1"]
    if point.layout == "shared-file":
        words += ["--filename=hpcrun.shared", f"--offset_increment={point.block}"]
    else:
        words += ["--filename_format=hpcrun.$jobnum.$filenum"]
    if operation == "write":
        words.append("--end_fsync=1")
    if direct:
        words.append("--direct=1")
    return words


def version_argv(fio: str) -> List[str]:
    return [fio, "--version"]


def parse(text: str, operation: str) -> Measurement:
    """fio's JSON document (text before it, e.g. warnings, is skipped)."""
    if not text.strip():
        raise EngineOutputError("fio wrote no output (empty file); see the step's .err file")
    start = text.find("{")
    if start < 0:
        raise EngineOutputError(f"fio wrote no JSON: {text.strip()[:200]!r}")
    try:
        doc, _end = json.JSONDecoder().raw_decode(text[start:])
    except ValueError as exc:
        raise EngineOutputError(f"fio's JSON is truncated or invalid ({exc})") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list) or not jobs:
        raise EngineOutputError("fio's JSON has no 'jobs' entry")
    job: Dict[str, Any] = jobs[0]
    if job.get("error"):
        raise EngineOutputError(f"fio reported error {job.get('error')} for the job")
    side = job.get(operation)
    if not isinstance(side, dict) or not isinstance(side.get("bw_bytes"), (int, float)):
        raise EngineOutputError(f"fio's JSON has no {operation} bandwidth (jobs[0].{operation}.bw_bytes)")
    if not side.get("io_bytes"):
        raise EngineOutputError(f"fio moved no bytes in the {operation} phase")
    bw = float(side["bw_bytes"]) / MIB
    iops = side.get("iops")
    return Measurement(bw_mean=bw, bw_max=bw, bw_min=bw,
                       iops_mean=float(iops) if isinstance(iops, (int, float)) else None,
                       reps=1, samples=[bw])


def version(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown"


def check_sweep(sweep: SweepShape) -> None:
    """fio runs one POSIX process group on the node it starts on."""
    if sweep.apis != ["posix"]:
        raise ValueError("fio measures POSIX I/O only; use apis: [posix] (--api posix) or the IOR "
                         "engine for mpiio and hdf5")
    if sweep.nodes != [1]:
        raise ValueError("fio runs on one node; use nodes: [1] (--nodes 1) or the IOR engine for "
                         "several nodes")


@register
class Fio(Engine):
    """fio: one node, POSIX, one run per operation and repetition (the fallback of auto)."""

    name = "fio"
    binary_key = "iotune.fio"

    def binary(self, profile: SiteProfile) -> str:
        return profile.iotune.fio

    def present(self, profile: SiteProfile) -> bool:
        return True   # the fallback: a missing fio is reported when the sweep runs

    def check_sweep(self, sweep: SweepShape) -> None:
        check_sweep(sweep)

    def path_problem(self, path: str) -> str:
        if ":" in path:
            return f"target '{path}' contains ':', which fio reads as a separator between directories"
        return ""

    def steps(self, sweep: SweepShape, point: Point, binary: str, darshan: Optional[DarshanEnv]) -> List[Step]:
        out = []
        for rep in range(1, sweep.reps + 1):
            for op in ("write", "read"):
                if op not in sweep.operations:
                    continue
                name = f"{point.id}-{op}-r{rep}"
                env, log = darshan(name, False) if darshan else ((), "")
                out.append(Step(name, point.id, (op,), rep, tuple(argv(binary, point, op, sweep.direct)),
                                env, None, f"{name}.json", f"{name}.json", log))
        return out

    def version_argv(self, binary: str) -> List[str]:
        return version_argv(binary)

    def version(self, text: str) -> str:
        return version(text)

    def measure(self, result: Path, operations: List[str], operation: str) -> Tuple[Measurement, Optional[str]]:
        try:
            text = result.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            text = ""
        return parse(text, operation), None

    def combine(self, parts: List[Measurement]) -> Measurement:
        return combine(parts)
