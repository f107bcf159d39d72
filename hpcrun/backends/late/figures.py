"""The pilots' figures for the forecast and the report, read from the pilots' own files and the queue's
journals (never a listing of ``done/``, which holds a file per committed input)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpcrun.backends.late import ledger
from hpcrun.backends.late.queue import Queue, _read, epoch


@dataclass(frozen=True)
class Held:
    """What the pilots hold so far, for the forecast: core-seconds held (running pilots until now), and the
    slots of the pilots running now. Read from the pilots' own files only (never the per-input results: a
    forecast is made every round)."""

    core_s: float
    live_slots: int


def held(queue: Path, run_dir: Path, chains: int, now: float) -> Held:
    """The pilots' core-seconds: ended ones from their own record, live ones from their start until ``now``."""
    q = Queue(queue)
    core_s = 0.0
    for p in (run_dir / "pilots").glob("*/pilot.tsv"):
        own = _read(p).split("\t")
        if len(own) >= 4 and _float(own[2]) is not None and _float(own[3]) is not None:
            core_s += (float(own[3]) - float(own[2])) * _int(own[1]) * chains
    slots = 0
    for pilot in q.pilots("live"):
        info = _read(q.d("live") / pilot / "info").split("\t")
        if len(info) >= 3 and _float(info[2]) is not None and not (run_dir / "pilots" / pilot / "pilot.tsv").exists():
            slots += _int(info[1])
            core_s += max(0.0, now - float(info[2])) * _int(info[1]) * chains
    return Held(core_s, slots)


def figures(queue: Path, run_dir: Path, chains: int) -> Dict[str, Any]:
    """The pilots' figures for the report: payload copies, inputs run, the core-seconds they held and how
    much of it was idle (before the first input, starved between inputs, the drain tail), and the inputs'
    CPU time against the pilots' own from the accounting."""
    q = Queue(queue)
    claims: Dict[str, List[Tuple[float, float, Optional[float]]]] = {}
    for r in ledger.results(queue):
        if len(r) >= 10 and r[5] and r[6]:
            claims.setdefault(r[2], []).append((epoch(r[5]), epoch(r[6]), _seconds(r[9])))
    acct = {line.split("\t")[0]: line.split("\t") for line in _read(queue / "pilots.tsv").splitlines()}
    out: Dict[str, Any] = {"pilots": 0, "payload_copies": 0, "inputs_run": sum(len(v) for v in claims.values()),
                           "core_s_held": 0.0, "core_s_busy": 0.0, "idle_core_s": {"start": 0.0, "starved": 0.0,
                                                                                    "drain_tail": 0.0},
                           "input_cpu_s": 0.0, "pilots_cpu_s": 0.0, "pilots_by_state": {}}
    pilots = sorted(p for p in (run_dir / "pilots").glob("*") if p.is_dir()) if (run_dir / "pilots").is_dir() else []
    for p in pilots:
        out["pilots"] += 1
        copies = _read(p / "payload-copies").strip()
        out["payload_copies"] += int(copies) if copies.isdigit() else 0
        own = _read(p / "pilot.tsv").split("\t")
        if len(own) < 4:   # still running (or it ended without its record): held from its start until now
            own = _read(q.d("live") / p.name / "info").rstrip("\n").split("\t")[:3] + [f"{time.time():.3f}"]
        mine = sorted(claims.get(p.name, []))
        cpus = _int(own[1]) * chains if len(own) > 1 else 0
        start = _float(own[2]) if len(own) > 2 else None
        end = _float(own[3]) if len(own) > 3 else None
        a = acct.get(p.name)
        if a and len(a) >= 7:
            state = a[1]
            out["pilots_by_state"][state] = out["pilots_by_state"].get(state, 0) + 1
            out["pilots_cpu_s"] += _float(a[5]) or 0.0
        if start is None or end is None or not cpus:
            continue
        held = (end - start) * cpus
        busy = sum((e - s) for s, e, _c in mine) * chains
        out["core_s_held"] += held
        out["core_s_busy"] += busy
        out["input_cpu_s"] += sum(c or 0.0 for _s, _e, c in mine)
        head = ((mine[0][0] - start) if mine else (end - start)) * cpus
        tail = ((end - max(e for _s, e, _c in mine)) * cpus) if mine else 0.0
        out["idle_core_s"]["start"] += max(0.0, head)
        out["idle_core_s"]["drain_tail"] += max(0.0, tail)
        out["idle_core_s"]["starved"] += max(0.0, held - busy - max(0.0, head) - max(0.0, tail))
    out["idle_core_s"] = {k: round(v, 1) for k, v in out["idle_core_s"].items()}
    for k in ("core_s_held", "core_s_busy", "input_cpu_s", "pilots_cpu_s"):
        out[k] = round(out[k], 1)
    out["idle_share"] = round(1 - out["core_s_busy"] / out["core_s_held"], 3) if out["core_s_held"] else None
    return out


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _float(text: str) -> Optional[float]:
    try:
        return epoch(text)
    except ValueError:
        return None


def _seconds(text: str) -> Optional[float]:
    """The pilot's ``user+system`` seconds -> their sum (None when the timer said nothing)."""
    try:
        return sum(epoch(x) for x in text.split("+")) if text else None
    except ValueError:
        return None
