"""PNG plot of bandwidth against transfer size: one panel per operation, one line per target
and writer count (and API, nodes, block size when the sweep varies them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

from hpcrun.units import format_size


def _series_key(row: Dict[str, Any], varying: List[str]) -> Tuple[Any, ...]:
    return (row["target"], row["writers"]) + tuple(row[k] for k in varying)


def _plain(text: str) -> str:
    """Matplotlib reads $...$ as math; paths may hold '$'."""
    return text.replace("$", r"\$")


def _label(key: Tuple[Any, ...], varying: List[str]) -> str:
    text = f"{key[0]}, {key[1]} writer(s)"
    for name, value in zip(varying, key[2:]):
        text += f", {format_size(value) if name == 'block' else value}{' nodes' if name == 'nodes' else ''}"
    return _plain(text)


def warm_up() -> None:
    """Import matplotlib ahead of time (about a second here); --local calls this in a thread
    while the engine runs, so the plot does not add its import time to the sweep."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except Exception:  # noqa: BLE001 - plot() reports problems when it runs
        pass


def plot(results: Dict[str, Any], path: Path) -> bool:
    """Write the plot; False when there is nothing to draw."""
    rows = [r for r in results["results"] if r.get("bw_mib_mean") is not None]
    if not rows:
        return False
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("matplotlib is not installed: pip install 'hpcrun[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op in ("write", "read") if any(r["operation"] == op for r in rows)]
    varying = [k for k in ("api", "nodes", "block") if len({r[k] for r in rows}) > 1]
    fig, axes = plt.subplots(1, len(ops), figsize=(6.5 * len(ops), 4.5), squeeze=False)
    transfers = sorted({r["transfer"] for r in rows})
    for ax, op in zip(axes[0], ops):
        series: Dict[Tuple[Any, ...], List[Dict[str, Any]]] = {}
        for r in rows:
            if r["operation"] == op:
                series.setdefault(_series_key(r, varying), []).append(r)
        for key in sorted(series, key=str):
            pts = sorted(series[key], key=lambda r: r["transfer"])
            xs = [r["transfer"] for r in pts]
            ys = [r["bw_mib_mean"] for r in pts]
            lo = [r["bw_mib_mean"] - (r["bw_mib_min"] or r["bw_mib_mean"]) for r in pts]
            hi = [(r["bw_mib_max"] or r["bw_mib_mean"]) - r["bw_mib_mean"] for r in pts]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=_label(key, varying))
        ax.set_xscale("log", base=2)
        ax.set_xticks(transfers)
        ax.set_xticklabels([format_size(t).replace(".0 ", " ") for t in transfers], rotation=30)
        ax.set_xlabel("transfer size")
        ax.set_ylabel("bandwidth (MiB/s)")
        ax.set_title(f"{op} ({results['engine']['name']})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(_plain(f"hpcrun iotune {results['name']} on {results['environment'].get('node') or '?'}"))
    fig.tight_layout()
    tmp = path.parent / f".{path.name}.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return True
