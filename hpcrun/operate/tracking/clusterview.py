"""Each cluster of a campaign on several, as status, the web view and metrics show it: its
jobs per state and its health (answering, in maintenance, since when)."""

from __future__ import annotations

from typing import Any, Dict, Optional

from hpcrun.operate.manifest import Manifest
from hpcrun.operate.plandir import clusters_of
from hpcrun.store.store import StateStore


def cluster_figures(manifest: Manifest, store: StateStore, campaign_id: int,
                    unreachable: Optional[Dict[Optional[str], str]] = None) -> Dict[str, Dict[str, Any]]:
    """Cluster label -> {jobs: state -> count, state, detail, since}; {} for a plan on one cluster."""
    if not manifest.several_clusters:
        return {}
    counts = store.cluster_counts(campaign_id)
    health = {h.name: h for h in store.cluster_health(campaign_id)}
    out: Dict[str, Dict[str, Any]] = {}
    for cluster in clusters_of(manifest):
        h = health.get(cluster.name)
        row: Dict[str, Any] = {"jobs": counts.get(cluster.name, {}), "state": h.state if h else "unknown",
                               "detail": h.detail if h else "", "since": h.since.isoformat() if h else None}
        if unreachable and cluster.name in unreachable:
            row.update(state="down", detail=unreachable[cluster.name])
        out[cluster.label] = row
    return out
