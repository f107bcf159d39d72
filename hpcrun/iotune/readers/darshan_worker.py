"""Child process that reads one Darshan log with PyDarshan and prints plain figures as JSON.

Run as ``python -m hpcrun.iotune.readers.darshan_worker LOG``. It is a separate process because
PyDarshan's C library can abort or crash the interpreter on damaged logs; the parent
(:mod:`hpcrun.iotune.readers.darshan`) turns exit codes, signals, timeouts and stderr into per-log errors.

Output: one line ``MARKER {json}`` on stdout. Exit 0 when the log was read, 2 when PyDarshan
refused it (the JSON then has ``error``), 3 when the ``darshan`` package is missing.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Dict, List, Optional

MARKER = "HPCRUN-DARSHAN-JSON:"

# module name -> counter prefix, and which counters count read/write operations
IO_MODULES: Dict[str, Dict[str, Any]] = {
    "POSIX": {"prefix": "POSIX", "reads": ["POSIX_READS"], "writes": ["POSIX_WRITES"], "hist": "SIZE_{d}_"},
    "MPI-IO": {"prefix": "MPIIO",
               "reads": ["MPIIO_INDEP_READS", "MPIIO_COLL_READS", "MPIIO_SPLIT_READS", "MPIIO_NB_READS"],
               "writes": ["MPIIO_INDEP_WRITES", "MPIIO_COLL_WRITES", "MPIIO_SPLIT_WRITES", "MPIIO_NB_WRITES"],
               "hist": "SIZE_{d}_AGG_"},
    "STDIO": {"prefix": "STDIO", "reads": ["STDIO_READS"], "writes": ["STDIO_WRITES"], "hist": None},
    "H5D": {"prefix": "H5D", "reads": ["H5D_READS"], "writes": ["H5D_WRITES"], "hist": "SIZE_{d}_AGG_"},
}
BINS = ("0_100", "100_1K", "1K_10K", "10K_100K", "100K_1M", "1M_4M", "4M_10M", "10M_100M", "100M_1G", "1G_PLUS")
PATH_LIMIT = 10000
# records that are not the job's data: ROMIO's lock-test probes and Open MPI's shared-memory segments
NOISE = re.compile(r"(\.locktest\.\d+$)|(/ompi\.[^/]+/.*\.sm$)")


def _sum(df: Any, col: str) -> Optional[float]:
    """Sum of a counter over records, leaving out -1 ('not monitored'); None when absent."""
    if col not in df.columns:
        return None
    values = df[col]
    return float(values[values >= 0].sum())


def _module_io(report: Any, name: str, spec: Dict[str, Any], nprocs: int) -> Dict[str, Any]:
    frames = report.records[name].to_df()
    c, f = frames["counters"], frames["fcounters"]
    p = spec["prefix"]
    names = [str(report.name_records.get(i, "")) for i in c["id"].tolist()]
    data = [NOISE.search(n) is None for n in names]  # timestamps and access sizes: the job's own files only
    out: Dict[str, Any] = {"records": int(len(c)), "noise_records": data.count(False)}
    out["bytes_read"] = int(_sum(c, f"{p}_BYTES_READ") or 0)
    out["bytes_written"] = int(_sum(c, f"{p}_BYTES_WRITTEN") or 0)
    out["reads"] = int(sum(_sum(c, col) or 0 for col in spec["reads"]))
    out["writes"] = int(sum(_sum(c, col) or 0 for col in spec["writes"]))
    for kind in ("READ", "WRITE", "META"):
        out[f"{kind.lower()}_time"] = _sum(f, f"{p}_F_{kind}_TIME")
    for direction, moved in (("READ", f"{p}_BYTES_READ"), ("WRITE", f"{p}_BYTES_WRITTEN")):
        start, end = f"{p}_F_{direction}_START_TIMESTAMP", f"{p}_F_{direction}_END_TIMESTAMP"
        key = direction.lower()
        out[f"{key}_start"] = out[f"{key}_end"] = None
        if moved in c.columns and start in f.columns and end in f.columns:
            active = (c[moved] > 0).to_numpy() & data
            if active.any():
                out[f"{key}_start"] = float(f[start].to_numpy()[active].min())
                out[f"{key}_end"] = float(f[end].to_numpy()[active].max())
    if spec["hist"]:
        for direction in ("READ", "WRITE"):
            cols = [f"{p}_" + spec["hist"].format(d=direction) + b for b in BINS]
            out[f"hist_{direction.lower()}"] = ([int(_sum(c, col) or 0) for col in cols]
                                                if all(col in c.columns for col in cols) else None)
    accesses: Dict[int, int] = {}
    for n in range(1, 5):
        size_col, count_col = f"{p}_ACCESS{n}_ACCESS", f"{p}_ACCESS{n}_COUNT"
        if size_col in c.columns and count_col in c.columns:
            for size, count, keep in zip(c[size_col].tolist(), c[count_col].tolist(), data):
                if keep and size > 0 and count > 0:
                    accesses[int(size)] = accesses.get(int(size), 0) + int(count)
    out["accesses"] = sorted(([s, n] for s, n in accesses.items()), key=lambda sn: (-sn[1], sn[0]))
    out["perf_by_slowest"] = _perf(frames, name, nprocs)
    out["paths"] = sorted(set(names))[:PATH_LIMIT]
    return out


def _perf(frames: Any, name: str, nprocs: int) -> Optional[float]:
    """Darshan's own agg_perf_by_slowest (MiB/s, reads and writes together), when PyDarshan computes it."""
    try:
        from darshan.backend.cffi_backend import accumulate_records

        value = accumulate_records(frames, name, nprocs).derived_metrics.agg_perf_by_slowest
        return float(value)
    except Exception:  # optional figure: older wheels or unusual modules
        return None


def read_log(path: str) -> Dict[str, Any]:
    import darshan

    report = darshan.DarshanReport(path, read_all=True)
    job = report.metadata.get("job", {})
    nprocs = int(job.get("nprocs", 0) or 0)
    modules: Dict[str, Any] = {}
    for name, info in report.modules.items():
        records: Optional[int] = None
        if name in report.records:
            try:
                records = len(report.records[name])
            except TypeError:
                records = None
        modules[name] = {"len": int(info.get("len", 0)), "partial": bool(info.get("partial_flag", False)),
                         "records": records}
    io: Dict[str, Any] = {}
    errors: List[str] = []
    for name, spec in IO_MODULES.items():
        if name in report.records and modules.get(name, {}).get("records"):
            try:
                io[name] = _module_io(report, name, spec, nprocs)
            except Exception as exc:  # report it; the other modules may still be fine
                errors.append(f"{name}: {type(exc).__name__}: {exc}")
    return {
        "job": {"exe": str(report.metadata.get("exe", "")), "nprocs": nprocs, "jobid": job.get("jobid"),
                "uid": job.get("uid"), "start_time": job.get("start_time_sec"), "end_time": job.get("end_time_sec"),
                "run_time": job.get("run_time"), "log_ver": job.get("log_ver"),
                "lib_ver": (job.get("metadata") or {}).get("lib_ver")},
        "modules": modules,
        "mounts": [[str(m), str(t)] for m, t in report.mounts],
        "heatmaps": sorted(getattr(report, "heatmaps", {}) or {}),
        "io": io,
        "module_errors": errors,
    }


def main(argv: List[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m hpcrun.iotune.readers.darshan_worker LOG", file=sys.stderr)
        return 64
    try:
        import darshan  # noqa: F401
    except ImportError as exc:
        print(MARKER + json.dumps({"error": f"the 'darshan' Python package is not installed ({exc}); "
                                            "pip install 'hpcrun[darshan]'"}), flush=True)
        return 3
    try:
        data = read_log(argv[1])
    except (RuntimeError, OSError, ValueError, KeyError) as exc:
        print(MARKER + json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 2
    print(MARKER + json.dumps(data, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
