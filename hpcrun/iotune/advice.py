"""The recommendation: the best point, and the smallest transfer size within 5% of it.

Chosen for writes when the sweep measured writes (burst buffers and scratch are tuned for
the output side), otherwise for reads. Among the points within 5% of the best mean bandwidth,
the smallest transfer size wins; ties go to fewer writers, then higher bandwidth. The same is
computed per target, so ``bb`` and ``scratch`` can be compared.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from hpcrun.units import format_size

TOLERANCE = 0.05


def _ok(rows: Sequence[Dict[str, Any]], operation: str) -> List[Dict[str, Any]]:
    return [r for r in rows if r["operation"] == operation and r.get("error") is None
            and r.get("bw_mib_mean") is not None]


def _point(row: Dict[str, Any]) -> Dict[str, Any]:
    keys = ("id", "target", "api", "nodes", "writers", "transfer", "block", "layout", "bw_mib_mean")
    return {k: row[k] for k in keys}


def choose(rows: Sequence[Dict[str, Any]], operation: str) -> Optional[Dict[str, Any]]:
    ok = _ok(rows, operation)
    if not ok:
        return None
    best = max(ok, key=lambda r: r["bw_mib_mean"])
    floor = best["bw_mib_mean"] * (1 - TOLERANCE)
    within = [r for r in ok if r["bw_mib_mean"] >= floor]
    pick = min(within, key=lambda r: (r["transfer"], r["writers"] * r["nodes"], -r["bw_mib_mean"]))
    fraction = pick["bw_mib_mean"] / best["bw_mib_mean"] if best["bw_mib_mean"] else 1.0
    text = (f"{operation}: best {best['bw_mib_mean']:.1f} MiB/s at {format_size(best['transfer'])} x "
            f"{best['writers']} writer(s) on {best['target']}; smallest transfer size within 5%: "
            f"{format_size(pick['transfer'])} x {pick['writers']} writer(s) on {pick['target']} "
            f"({pick['bw_mib_mean']:.1f} MiB/s, {100 * fraction:.0f}% of the best)")
    return {"operation": operation, "best": _point(best), "recommended": _point(pick),
            "fraction_of_best": round(fraction, 4), "text": text}


def recommend(rows: Sequence[Dict[str, Any]], operations: Sequence[str]) -> Dict[str, Any]:
    primary = "write" if "write" in operations else "read"
    per_op = {op: choose(rows, op) for op in operations}
    targets = sorted({r["target"] for r in rows})
    per_target = {t: {op: choose([r for r in rows if r["target"] == t], op) for op in operations}
                  for t in targets}
    return {"operation": primary, "overall": per_op.get(primary), "per_operation": per_op,
            "per_target": per_target, "tolerance": TOLERANCE}
