"""The IOR engine, as a thin adapter: argv comes from :mod:`hpcrun.iotune.iorcmd` (checked
against IOR's option grammar) and results from :mod:`hpcrun.iotune.ior` (the tolerant JSON
summary reader). Both modules are imported only when IOR is used, so fio sweeps never need them.

One IOR invocation per point measures every requested operation and repeats itself (``-i``);
the JSON summary goes to a file (``-O summaryFile=``), never mixed with ``-v`` text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from ..errors import HpcrunError
from .points import DIR, EngineOutputError, Measurement, Point

_MISSING = ("the IOR engine needs hpcrun.iotune.iorcmd and hpcrun.iotune.ior, which this "
            "installation lacks; use --engine fio")


def _iorcmd() -> Any:
    try:
        from . import iorcmd  # type: ignore[attr-defined]
    except ImportError:
        raise HpcrunError(_MISSING) from None
    return iorcmd


def argv(ior: str, point: Point, operations: Sequence[str], reps: int, direct: bool,
         summary_file: str) -> List[str]:
    """IOR argv for one point (launcher not included); validated by iorcmd."""
    words: List[str] = _iorcmd().build_argv(
        ior=ior, api=point.api, transfer_size=point.transfer, block_size=point.block,
        segments=1, file_per_process=point.layout == "file-per-process",
        operations=list(operations), reps=reps, test_file=f"{DIR}/ior.dat",
        summary_file=summary_file, direct=direct)
    return words


def version_argv(ior: str) -> List[str]:
    return [ior, "--version"]


def parse(path: Path, operations: Sequence[str]) -> Tuple[Dict[str, Measurement], str]:
    """Measurements per operation from IOR's JSON summary file, and IOR's version."""
    try:
        from .ior import IorParseError, parse_file  # type: ignore[attr-defined]
    except ImportError:
        raise HpcrunError(_MISSING) from None
    try:
        run = parse_file(path)
    except IorParseError as exc:
        raise EngineOutputError(str(exc)) from None
    out: Dict[str, Measurement] = {}
    for op in run.ops:
        if op.operation in operations:
            out[op.operation] = Measurement(
                bw_mean=float(op.bw_mib_mean), bw_max=float(op.bw_mib_max), bw_min=float(op.bw_mib_min),
                iops_mean=float(op.ops_mean) if op.ops_mean is not None else None, reps=int(op.reps))
    missing = [o for o in operations if o not in out]
    if missing:
        raise EngineOutputError(f"IOR's summary has no {', '.join(missing)} result")
    return out, f"IOR {run.version}" if run.version else "IOR"


def version(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown"
