"""``jobs.locality: prefer`` at submission: each pending job asks for the node whose cache holds its
inputs, and one that waited ``jobs.locality_wait`` for it is taken back and sent to any node.

The node comes from the index the jobs write (hpcrun/plan/intake/locality.py) as it is at submission, so
a campaign planned before the caches filled still finds them. The request is a change of the
submission (``--nodelist``), recorded with it as the retry policy's changes are; taking a job
back is the cancel, confirm gone, release of a cluster move, so it never runs twice and the
wait is not counted as an attempt.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Callable, Dict, List, Sequence

from hpcrun.operate.manifest import Manifest
from hpcrun.operate.plandir import clusters_of
from hpcrun.operate.submission.moves import Move, cancel_and_release
from hpcrun.plan.intake.locality import node_of, read_index
from hpcrun.store.records import Campaign
from hpcrun.store.rows.failures import LOCALITY_WORDS, RELEASED_WORDS
from hpcrun.store.store import StateStore
from hpcrun.units import format_duration


def prefer_nodes(manifest: Manifest, store: StateStore, campaign_id: int, pending: Sequence[int],
                 adjustments: Dict[int, str]) -> Dict[int, str]:
    """``adjustments`` with each pending job's node added (jobs whose inputs no cache lists, that were
    released from their node, or whose retry must avoid that node go anywhere)."""
    spec = manifest.locality
    if not spec or not pending or manifest.pilots:   # late binding: the pilots claim near inputs first
        return adjustments
    held = read_index(spec["index"])
    if not held:
        return adjustments
    inputs = {j["index"]: j["inputs"] for j in manifest.jobs}
    released = store.released_from_node(campaign_id)
    out = dict(adjustments)
    for job in pending:
        node = node_of(inputs.get(job, ()), held) if job not in released else None
        if node is None:
            continue
        change = json.loads(adjustments[job]) if adjustments.get(job) else {}
        if node in change.get("exclude", ()):
            continue
        change["nodelist"] = [node]
        words = f"{LOCALITY_WORDS}{node}"
        change["changes"] = f"{change['changes']}; {words}" if change.get("changes") else words
        out[job] = json.dumps(change, sort_keys=True)
    return out


def near_tasks(manifest: Manifest, ready: Sequence[str]) -> Dict[str, str]:
    """Late binding: each waiting task (``<submission>_<job index>``) -> the node whose cache holds its
    inputs, for the pilots' claims (none without ``jobs.locality: prefer``)."""
    spec = manifest.locality
    held = read_index(spec["index"]) if spec else {}
    if not held:
        return {}
    inputs = {j["index"]: j["inputs"] for j in manifest.jobs}
    near: Dict[str, str] = {}
    for task in ready:
        index = task.rpartition("_")[2]
        node = node_of(inputs.get(int(index), ()), held) if index.isdigit() else None
        if node is not None:
            near[task] = node
    return near


def release_waiting(manifest: Manifest, store: StateStore, campaign: Campaign, *,
                    sleep: Callable[[float], None] = time.sleep) -> List[Move]:
    """Jobs pending for their node longer than ``jobs.locality_wait``: cancelled, confirmed gone, back
    to pending for any node."""
    spec = manifest.locality
    if not spec or manifest.pilots:
        return []
    now = dt.datetime.now(dt.timezone.utc)
    waiting = store.waiting_for_node(campaign.id, now - dt.timedelta(seconds=float(spec["wait_s"])))
    if not waiting:
        return []
    cluster = clusters_of(manifest)[0]

    def reason(waited: float) -> str:
        return f"{RELEASED_WORDS}{format_duration(int(waited))} for the node caching its inputs; sent to any node"

    moves = cancel_and_release(store, campaign, cluster, waiting, now, sleep, reason)
    if moves:
        store.audit(campaign.id, "move", "; ".join(f"{m.job} ({m.job_id}) released from its node after "
                                                   f"{format_duration(int(m.waited_s))}" for m in moves[:50]))
    return moves
