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
from typing import Any, Dict, List

from hpcrun.iotune.points import DIR, EngineOutputError, Measurement, Point

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
