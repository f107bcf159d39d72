"""The IOR engine, as a thin adapter: argv comes from :mod:`hpcrun.iotune.engines.ior_argv` (checked
against IOR's option grammar) and results from :mod:`hpcrun.iotune.readers.ior_output` (the tolerant JSON
summary reader). Both modules are imported only when IOR is used, so fio sweeps never need them.

One IOR invocation per point measures every requested operation and repeats itself (``-i``);
the JSON summary goes to a file (``-O summaryFile=``), never mixed with ``-v`` text.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpcrun.iotune.engines.base import DarshanEnv, Engine, register
from hpcrun.iotune.points import DIR, RAW, EngineOutputError, Measurement, Point, Step, SweepShape
from hpcrun.model.site import SiteProfile

_API = {"posix": "POSIX", "mpiio": "MPIIO", "hdf5": "HDF5"}


def _iorcmd() -> Any:
    from hpcrun.iotune.engines import ior_argv as iorcmd
    return iorcmd


# Placeholders for the run-time directories while iorcmd checks the command line (it sees
# plain absolute paths); swapped for DIR/RAW afterwards.
_DIR_TOKEN = "/HPCRUN_POINT_DIR"
_RAW_TOKEN = "/HPCRUN_RAW"


def argv(ior: str, point: Point, operations: Sequence[str], reps: int, direct: bool,
         summary_file: str) -> List[str]:
    """IOR argv for one point (launcher not included), built and checked by iorcmd.

    ``summary_file`` may start with the RAW placeholder. Writes end with an fsync (``-e``), as
    fio's do (``end_fsync``); ``--posix.odirect`` is added for O_DIRECT with the POSIX API.
    """
    iorcmd = _iorcmd()
    summary = summary_file.replace(RAW, _RAW_TOKEN)
    spec = iorcmd.IorPoint(
        test_file=f"{_DIR_TOKEN}/ior.dat", transfer_size=point.transfer, block_size=point.block,
        api=_API[point.api], segments=1, file_per_proc=point.layout == "file-per-process", reps=reps,
        write="write" in operations, read="read" in operations, summary_file=summary, fsync="write" in operations)
    words: List[str] = list(iorcmd.build_ior_argv(spec, ior))
    if direct and point.api == "posix":
        words.append("--posix.odirect")
    return [w.replace(_DIR_TOKEN, DIR).replace(_RAW_TOKEN, RAW) for w in words]


def version_argv(ior: str) -> List[str]:
    return [ior, "--version"]


def parse(path: Path, operations: Sequence[str]) -> Tuple[Dict[str, Measurement], str]:
    """Measurements per operation from IOR's JSON summary file, and IOR's version."""
    from hpcrun.iotune.readers.ior_output import IorParseError, parse_file

    try:
        run = parse_file(path)
    except IorParseError as exc:
        raise EngineOutputError(str(exc)) from None
    out: Dict[str, Measurement] = {}
    for name in operations:
        op = run.op(name)
        if op is not None:
            out[name] = Measurement(
                bw_mean=float(op.bw_mib_mean), bw_max=float(op.bw_mib_max), bw_min=float(op.bw_mib_min),
                iops_mean=float(op.ops_mean), reps=int(op.reps))
    missing = [o for o in operations if o not in out]
    if missing:
        raise EngineOutputError(f"IOR's summary has no {', '.join(missing)} result")
    return out, f"IOR-{run.version}" if run.version else "IOR"


def version(text: str) -> str:
    """IOR 4.0 has no version option (``--version`` is "invalid argument"): its banner, ``IOR-4.0.0: ...``,
    is the version where a run printed one; the results take it from each run's JSON summary."""
    for line in text.splitlines():
        if line.startswith("IOR-"):
            return line.split(":", 1)[0].strip()
    return "unknown (IOR prints its version only in a run's output)"


@register
class Ior(Engine):
    """IOR: MPI ranks under the launcher, every API, one invocation per point (repeats itself)."""

    name = "ior"
    binary_key = "tools.ior"
    mpi = True
    absent = "the profile names no IOR in tools.ior and 'ior' is not on PATH"

    def binary(self, profile: SiteProfile) -> str:
        return profile.tools.ior or "ior"

    def present(self, profile: SiteProfile) -> bool:
        return bool(profile.tools.ior or profile.tools.ior_module or shutil.which("ior"))

    def local_problem(self, profile: SiteProfile) -> str:
        if shutil.which(profile.iotune.mpirun[0]) is None:
            return (f"IOR needs the MPI launcher '{profile.iotune.mpirun[0]}' (profile iotune.mpirun), "
                    "which is not on PATH here")
        return ""

    def steps(self, sweep: SweepShape, point: Point, binary: str, darshan: Optional[DarshanEnv]) -> List[Step]:
        ops = [op for op in ("write", "read") if op in sweep.operations]
        name = point.id
        env, log = darshan(name, True) if darshan else ((), "")
        words = argv(binary, point, ops, sweep.reps, sweep.direct, f"{RAW}/{name}.json")
        # stdout beside the summary as <summary>.log: the IOR reader quotes it when the summary is bad
        return [Step(name, point.id, tuple(ops), None, tuple(words), env, (point.nodes, point.writers),
                     f"{name}.json.log", f"{name}.json", log)]

    def version_argv(self, binary: str) -> List[str]:
        return version_argv(binary)

    def version(self, text: str) -> str:
        return version(text)

    def measure(self, result: Path, operations: List[str], operation: str) -> Tuple[Measurement, Optional[str]]:
        found, seen = parse(result, operations)
        return found[operation], seen
