"""Render Darshan summaries for the terminal (a rich table) and for ``--json``."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

from rich.table import Table

from hpcrun.iotune.readers.darshan import DarshanLogError, DarshanSummary, advise
from hpcrun.units import format_size


def _size(nbytes: Optional[int]) -> str:
    return "-" if nbytes is None else format_size(nbytes)


def _rate(mib: Optional[float]) -> str:
    return "-" if mib is None else f"{mib:,.0f}"


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3g}"


def darshan_table(summaries: Sequence[DarshanSummary]) -> Table:
    """One row per summarised log: processes, bytes, per-direction bandwidth and the common access size."""
    table = Table("log", "procs", "layer", "read", "written", "read MiB/s", "write MiB/s", "common access")
    for s in summaries:
        p = s.primary
        dominant = s.dominant_access()
        table.add_row(
            s.source.rsplit("/", 1)[-1], str(s.nprocs), p.module if p else "-", _size(s.bytes_read),
            _size(s.bytes_written), _rate(p.read_bw_mib if p else None), _rate(p.write_bw_mib if p else None),
            f"{format_size(dominant[1])} x{dominant[2]}" if dominant else "-")
    return table


def darshan_details(s: DarshanSummary) -> str:
    """One line per log with what the table leaves out: command, runtime, time in I/O, modules."""
    p = s.primary
    times = ("-" if p is None else
             f"read {_seconds(p.read_time_s)} s, write {_seconds(p.write_time_s)} s, meta {_seconds(p.meta_time_s)} s")
    modules = ", ".join(m.name + (" (partial)" if m.partial else "") for m in s.modules) or "none"
    return (f"{s.source}: {s.exe.strip() or '?'}; runtime {_seconds(s.runtime_s)} s; time in I/O (summed over "
            f"ranks) {times}; modules {modules}")


def darshan_json(results: Sequence[Union[DarshanSummary, DarshanLogError]],
                 best_transfer_size: Optional[int]) -> List[Dict[str, Any]]:
    """One object per log, in the order given: the summary (``ok: true``) or the error (``ok: false``)."""
    out: List[Dict[str, Any]] = []
    for r in results:
        if isinstance(r, DarshanLogError):
            out.append({"log": r.source, "ok": False, "error": r.problem})
            continue
        entry: Dict[str, Any] = {"ok": True, **r.as_dict()}
        entry["advice"] = advise(r, best_transfer_size) if best_transfer_size else None
        out.append(entry)
    return out
