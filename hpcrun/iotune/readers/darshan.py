"""Summarise Darshan logs: job, bytes, access sizes, time in I/O, per-direction bandwidth, warnings.

Each log is read by PyDarshan (the ``darshan`` package from PyPI) in a **child process**
(:mod:`hpcrun.iotune.readers.darshan_worker`), because its C library aborts or segfaults on some damaged
logs and silently returns nothing on others. Crashes, signals, timeouts, C-library error
messages and module data that could not be read all become a :class:`DarshanLogError` for that
log, with a one-paragraph message naming the file.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from hpcrun.errors import SourceError
from hpcrun.iotune.readers.darshan_worker import BINS, MARKER
from hpcrun.units import format_size

DEFAULT_TIMEOUT = 120.0
MIB = 2**20
# darshan-runtime's default exclusions (darshan-config.c); DataWarp mounts are explicitly re-included
DEFAULT_EXCLUDED_PREFIXES = ("/etc/", "/dev/", "/usr/", "/bin/", "/boot/", "/lib/", "/opt/", "/sbin/", "/sys/",
                             "/proc/", "/var/")
REINCLUDED_PREFIXES = ("/var/opt/cray/dws/mounts/",)
# access-size bins: (label, smallest size in the bin, largest size in the bin); upper bounds inclusive
SIZE_BINS: Tuple[Tuple[str, int, Optional[int]], ...] = (
    ("0_100", 0, 100), ("100_1K", 101, 1024), ("1K_10K", 1025, 10240), ("10K_100K", 10241, 102400),
    ("100K_1M", 102401, 1048576), ("1M_4M", 1048577, 4194304), ("4M_10M", 4194305, 10485760),
    ("10M_100M", 10485761, 104857600), ("100M_1G", 104857601, 1073741824), ("1G_PLUS", 1073741825, None))
PRIMARY_ORDER = ("POSIX", "MPI-IO", "H5D", "STDIO")
FILE_MODULES = ("POSIX", "MPI-IO", "STDIO", "H5F", "H5D", "PNETCDF_FILE", "PNETCDF_VAR", "LUSTRE", "DFS", "DAOS")
STD_STREAMS = ("<STDIN>", "<STDOUT>", "<STDERR>")
assert tuple(b[0] for b in SIZE_BINS) == BINS


class DarshanLogError(SourceError):
    """One log that could not be summarised; the message names the log and the reason."""


@dataclass(frozen=True)
class ModuleInfo:
    """A module listed in the log header."""

    name: str
    records: Optional[int]
    partial: bool


@dataclass(frozen=True)
class ModuleIO:
    """I/O figures of one instrumentation layer (POSIX, MPI-IO, STDIO or H5D), summed over its records.

    Times are cumulative seconds over ranks (Darshan's ``*_F_*_TIME``). Bandwidths are MiB/s: bytes
    over the wall-clock span from the first start to the last end of that direction, on the job's
    own files (ROMIO ``.locktest`` and Open MPI ``.sm`` records left out).
    """

    module: str
    records: int
    bytes_read: int
    bytes_written: int
    reads: int
    writes: int
    read_time_s: Optional[float]
    write_time_s: Optional[float]
    meta_time_s: Optional[float]
    read_span_s: Optional[float]
    write_span_s: Optional[float]
    read_hist: Optional[Tuple[int, ...]]
    write_hist: Optional[Tuple[int, ...]]
    accesses: Tuple[Tuple[int, int], ...]
    perf_by_slowest_mib: Optional[float]
    noise_records: int = 0

    @property
    def read_bw_mib(self) -> Optional[float]:
        return _bw(self.bytes_read, self.read_span_s)

    @property
    def write_bw_mib(self) -> Optional[float]:
        return _bw(self.bytes_written, self.write_span_s)

    def as_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out["read_bw_mib"] = self.read_bw_mib
        out["write_bw_mib"] = self.write_bw_mib
        out["hist_bins"] = list(BINS)
        return out


@dataclass(frozen=True)
class DarshanSummary:
    """What ``hpcrun iotune darshan`` reports for one log."""

    source: str
    exe: str
    nprocs: int
    jobid: Optional[int]
    runtime_s: Optional[float]
    start_time: Optional[int]
    log_version: Optional[str]
    library_version: Optional[str]
    modules: Tuple[ModuleInfo, ...]
    io: Tuple[ModuleIO, ...]
    mounts: Tuple[Tuple[str, str], ...]
    warnings: Tuple[str, ...]

    def module_io(self, name: str) -> Optional[ModuleIO]:
        return next((m for m in self.io if m.module == name), None)

    @property
    def primary(self) -> Optional[ModuleIO]:
        """The layer the headline figures come from: POSIX, else MPI-IO, H5D, STDIO (layers are not added up)."""
        for name in PRIMARY_ORDER:
            found = self.module_io(name)
            if found is not None and found.records:
                return found
        return None

    @property
    def bytes_read(self) -> int:
        return self.primary.bytes_read if self.primary else 0

    @property
    def bytes_written(self) -> int:
        return self.primary.bytes_written if self.primary else 0

    def dominant_access(self) -> Optional[Tuple[str, int, int, int]]:
        """(module, access size, its count, all counted accesses) of the most common access size.

        Uses Darshan's four most common access sizes per file, of POSIX first, then MPI-IO, then H5D.
        """
        for name in ("POSIX", "MPI-IO", "H5D"):
            found = self.module_io(name)
            if found is not None and found.accesses:
                size, count = found.accesses[0]
                return name, size, count, sum(n for _, n in found.accesses)
        return None

    def as_dict(self) -> Dict[str, Any]:
        primary = self.primary
        return {
            "log": self.source, "exe": self.exe, "nprocs": self.nprocs, "jobid": self.jobid,
            "runtime_s": self.runtime_s, "start_time": self.start_time, "log_version": self.log_version,
            "library_version": self.library_version,
            "modules": [asdict(m) for m in self.modules],
            "primary_module": primary.module if primary else None,
            "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
            "read_bw_mib": primary.read_bw_mib if primary else None,
            "write_bw_mib": primary.write_bw_mib if primary else None,
            "io": {m.module: m.as_dict() for m in self.io},
            "mounts": [list(m) for m in self.mounts],
            "warnings": list(self.warnings),
        }


def _bw(nbytes: int, span: Optional[float]) -> Optional[float]:
    return nbytes / span / MIB if nbytes and span and span > 0 else None


# ---- running the worker ------------------------------------------------------------------------

def summarise(path: Union[str, Path], timeout: float = DEFAULT_TIMEOUT,
              python: Optional[str] = None) -> DarshanSummary:
    """Summarise one log; raise :class:`DarshanLogError` when it cannot be read."""
    source = str(path)
    if not os.path.isfile(source):
        raise DarshanLogError(source, "no such file." if not os.path.exists(source) else "not a regular file.")
    if not os.access(source, os.R_OK):
        raise DarshanLogError(source, "not readable (Darshan writes its logs with mode 0400: owner only).")
    cmd = [python or sys.executable, "-m", "hpcrun.iotune.readers.darshan_worker", source]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, errors="replace",
                              env=_worker_env())
    except subprocess.TimeoutExpired:
        raise DarshanLogError(source, f"reading it took longer than {timeout:g} s; the log is probably damaged "
                              "(or very large: raise the timeout).") from None
    except OSError as exc:
        raise DarshanLogError(source, f"could not start the reader process ({exc.strerror or exc}).") from None
    return summary_from_worker(source, proc.returncode, proc.stdout, proc.stderr)


def summarise_many(paths: Sequence[Union[str, Path]], timeout: float = DEFAULT_TIMEOUT
                   ) -> List[Union[DarshanSummary, DarshanLogError]]:
    """Summarise several logs; a log that fails gives its error in its place, the others go on."""
    out: List[Union[DarshanSummary, DarshanLogError]] = []
    for path in paths:
        try:
            out.append(summarise(path, timeout=timeout))
        except DarshanLogError as exc:
            out.append(exc)
    return out


def _worker_env() -> Dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the worker must import this very hpcrun
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def summary_from_worker(source: str, returncode: int, stdout: str, stderr: str) -> DarshanSummary:
    """Turn the worker's exit status and output into a summary or a :class:`DarshanLogError`."""
    c_errors = [ln.strip().rstrip(".") for ln in stderr.splitlines() if ln.strip().startswith("Error")]
    c_said = f" darshan-util said: {' / '.join(_dedupe(c_errors)[:3])}." if c_errors else ""
    if returncode < 0:
        name = _signal_name(-returncode)
        raise DarshanLogError(source, f"the Darshan reader crashed ({name}) while reading it: the log is damaged "
                              f"or truncated.{c_said}")
    payload = _payload(stdout)
    if returncode == 3 and payload is not None:
        raise DarshanLogError(source, str(payload.get("error")))
    if returncode == 2:
        raise DarshanLogError(source, _open_failure(source, c_said))
    if returncode in (134, 139) or returncode > 128:
        raise DarshanLogError(source, f"the Darshan reader crashed ({_signal_name(returncode - 128)}) while "
                              f"reading it: the log is damaged or truncated.{c_said}")
    if returncode != 0 or payload is None:
        tail = " / ".join(ln.strip() for ln in stderr.strip().splitlines()[-3:])
        raise DarshanLogError(source, f"the Darshan reader failed (exit code {returncode}) without a result"
                              + (f": {tail}" if tail else "."))
    if c_errors:
        raise DarshanLogError(source, "the log is damaged: PyDarshan read only part of it." + c_said)
    return build_summary(source, payload)


def _payload(stdout: str) -> Optional[Dict[str, Any]]:
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                data = json.loads(line[len(MARKER):])
            except json.JSONDecodeError:
                return None
            return data if isinstance(data, dict) else None
    return None


def _open_failure(source: str, c_said: str) -> str:
    try:
        with open(source, "rb") as fh:
            head = fh.read(2)
        size = os.path.getsize(source)
    except OSError:
        return "PyDarshan cannot open it." + c_said
    if head == b"\x1f\x8b":
        return ("PyDarshan cannot open it: it is gzip-compressed, i.e. a Darshan 2.x log; Darshan 3 tools read only "
                "3.x logs (formats 3.00 to 3.41)." + c_said)
    if size == 0:
        return "the file is empty: Darshan did not finish writing it."
    return ("PyDarshan cannot open it: the header is damaged or truncated "
            f"({size} bytes), or this is not a Darshan 3.x log." + c_said)


def _signal_name(number: int) -> str:
    try:
        return f"signal {signal.Signals(number).name}"
    except ValueError:
        return f"signal {number}"


def _dedupe(lines: List[str]) -> List[str]:
    seen: List[str] = []
    for ln in lines:
        if ln not in seen:
            seen.append(ln)
    return seen


# ---- building the summary ----------------------------------------------------------------------

def build_summary(source: str, data: Dict[str, Any]) -> DarshanSummary:
    """A :class:`DarshanSummary` from the worker's JSON; damaged content raises :class:`DarshanLogError`."""
    job = data.get("job") or {}
    nprocs = int(job.get("nprocs") or 0)
    modules = tuple(ModuleInfo(name, info.get("records"), bool(info.get("partial")))
                    for name, info in (data.get("modules") or {}).items())
    if nprocs <= 0:
        raise DarshanLogError(source, "the log's job record is unreadable (0 processes): the log is truncated.")
    unread = [m.name for m in modules if m.name in FILE_MODULES and m.records == 0]
    if unread:
        raise DarshanLogError(source, f"the header lists module(s) {', '.join(unread)} but none of their records "
                              "could be read: the log is truncated or damaged.")
    if data.get("module_errors"):
        raise DarshanLogError(source, "PyDarshan could not read " + "; ".join(data["module_errors"]) + ".")
    io = tuple(_module_io(name, raw) for name, raw in (data.get("io") or {}).items())
    summary = DarshanSummary(
        source=source, exe=str(job.get("exe") or ""), nprocs=nprocs, jobid=_int_or_none(job.get("jobid")),
        runtime_s=_float_or_none(job.get("run_time")), start_time=_int_or_none(job.get("start_time")),
        log_version=job.get("log_ver"), library_version=job.get("lib_ver"), modules=modules, io=io,
        mounts=tuple((str(m), str(t)) for m, t in (data.get("mounts") or [])), warnings=())
    paths = [p for raw in (data.get("io") or {}).values() for p in raw.get("paths", [])]
    return replace(summary, warnings=tuple(_warnings(summary, paths)))


def _module_io(name: str, raw: Dict[str, Any]) -> ModuleIO:
    def span(direction: str) -> Optional[float]:
        start, end = raw.get(f"{direction}_start"), raw.get(f"{direction}_end")
        return float(end) - float(start) if start is not None and end is not None else None

    def hist(key: str) -> Optional[Tuple[int, ...]]:
        value = raw.get(key)
        return tuple(int(v) for v in value) if value else None

    return ModuleIO(
        module=name, records=int(raw.get("records", 0)), bytes_read=int(raw.get("bytes_read", 0)),
        bytes_written=int(raw.get("bytes_written", 0)), reads=int(raw.get("reads", 0)),
        writes=int(raw.get("writes", 0)), read_time_s=_float_or_none(raw.get("read_time")),
        write_time_s=_float_or_none(raw.get("write_time")), meta_time_s=_float_or_none(raw.get("meta_time")),
        read_span_s=span("read"), write_span_s=span("write"), read_hist=hist("hist_read"),
        write_hist=hist("hist_write"), accesses=tuple((int(s), int(n)) for s, n in raw.get("accesses", [])),
        perf_by_slowest_mib=_float_or_none(raw.get("perf_by_slowest")),
        noise_records=int(raw.get("noise_records", 0)))


def _int_or_none(value: Any) -> Optional[int]:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _float_or_none(value: Any) -> Optional[float]:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def excluded_prefix(path: str) -> Optional[str]:
    """The default Darshan exclusion that hides ``path``, or None when Darshan records it."""
    if any(path.startswith(p) for p in REINCLUDED_PREFIXES):
        return None
    return next((p for p in DEFAULT_EXCLUDED_PREFIXES if path.startswith(p)), None)


def _warnings(summary: DarshanSummary, paths: List[str]) -> List[str]:
    out = []
    for m in summary.modules:
        if m.partial:
            out.append(f"module {m.name} is partial: Darshan ran out of record memory (by default 1024 files per "
                       "process), so its totals are lower bounds.")
    data_paths = [p for p in paths if p not in STD_STREAMS]
    for arg in _path_arguments(summary.exe):
        prefix = excluded_prefix(arg)
        if prefix and not any(p.startswith(arg) for p in data_paths):
            out.append(f"the command line names {arg}, under {prefix}, which Darshan excludes by default "
                       f"({', '.join(p.rstrip('/') for p in DEFAULT_EXCLUDED_PREFIXES)}): its I/O is not in this "
                       "log; run with DARSHAN_EXCLUDE_DIRS=none to record it.")
    if not data_paths:
        out.append("the log has no data for any file (only standard streams, if anything): either the job did no "
                   "file I/O, or all of it was under paths Darshan excludes by default "
                   f"({', '.join(p.rstrip('/') for p in DEFAULT_EXCLUDED_PREFIXES)}); "
                   "DARSHAN_EXCLUDE_DIRS=none records them.")
    if any(p.startswith("/dev/shm/") for p in data_paths):
        out.append("files under /dev/shm (tmpfs) appear with mount point /dev and type devtmpfs: Darshan leaves "
                   "tmpfs out of its mount table.")
    return out


def _path_arguments(exe: str) -> List[str]:
    """Absolute paths among the arguments of the logged command line (``of=/x`` style included)."""
    try:
        words = shlex.split(exe)
    except ValueError:
        words = exe.split()
    found = []
    for word in words[1:]:
        value = word.split("=", 1)[1] if "=" in word else word
        if value.startswith("/") and value not in found:
            found.append(value)
    return found


# ---- advice ------------------------------------------------------------------------------------

def advise(summary: DarshanSummary, best_transfer_size: int, factor: float = 4.0) -> Optional[str]:
    """A sentence when the log's most common access size is more than ``factor`` x away from
    ``best_transfer_size`` (bytes), else None (also when the log has no access-size data)."""
    if best_transfer_size <= 0:
        raise ValueError("best_transfer_size must be positive")
    dominant = summary.dominant_access()
    if dominant is None:
        return None
    module, size, count, total = dominant
    ratio = best_transfer_size / size
    if 1 / factor <= ratio <= factor:
        return None
    share = f"{count} of {total} counted {module} accesses" if total else f"{count} {module} accesses"
    best = format_size(best_transfer_size)
    if ratio > factor:
        return (f"{summary.source}: the most common access size is {format_size(size)} ({share}), {ratio:.0f}x "
                f"smaller than the best transfer size found by the sweep ({best}); fewer, larger requests "
                "(a bigger I/O buffer, collective buffering or aggregation) would likely be faster.")
    return (f"{summary.source}: the most common access size is {format_size(size)} ({share}), {1 / ratio:.0f}x "
            f"larger than the best transfer size found by the sweep ({best}); check whether smaller requests or "
            "more writers suit this target better.")
