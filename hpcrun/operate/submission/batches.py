"""How a plan's pending jobs become submissions: per-job scripts one each, array scripts as one
array submission of the pending task ids; retries with changes apart; claims grouped.

Pure functions over the manifest's scripts (no store, no scheduler): submit and the
cluster placement both use them.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from hpcrun.operate.manifest import Manifest, ScriptEntry
from hpcrun.operate.results import Batch, ScriptInfo, adjust_of


def throttle_of(manifest: Manifest) -> Optional[int]:
    """An array's ``%N`` (None for late binding: the pilots' slots cap what runs, and its arrays go in pieces)."""
    return None if manifest.pilots else manifest.submit.throttle


def tag_of(campaign: str, token: str) -> str:
    """The Slurm job name that ties a job to its claim in the store."""
    return f"{campaign}.{token[:12]}"


def compress_indices(indices: Iterable[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8' (Slurm's --array syntax)."""
    parts: List[str] = []
    run: List[int] = []
    for i in sorted(set(indices)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


def scripts_of(manifest: Manifest, scripts: Optional[Sequence[ScriptEntry]] = None) -> List[ScriptInfo]:
    """The scripts submit sends: the manifest's, or those of one of its clusters."""
    return [ScriptInfo(s["path"], s["sha256"], s["jobs"][0], s["jobs"][1], s["array"] is not None,
                       s.get("headers"), s.get("generation") or manifest.generation.number)
            for s in (manifest.scripts if scripts is None else scripts)]


# jobs in one unthrottled array submission, so in one claim: a late-bound array of 10^6 tasks is claimed,
# enqueued and recorded in pieces, and the submitter holds one piece's records at a time (a Slurm array is
# already cut by the site's MaxArraySize at plan time; a throttled one stays whole: ``%N`` caps one array)
CLAIM_MAX = 20000


def plan_batches(scripts: Sequence[ScriptInfo], pending: Sequence[int], budget: Optional[int],
                 throttle: Optional[int]) -> Tuple[List[Batch], int]:
    """Group pending plan jobs by script, at most ``budget`` jobs in all and CLAIM_MAX in an unthrottled array;
    returns (batches, jobs left)."""
    batches: List[Batch] = []
    todo = sorted(pending)
    left = budget if budget is not None else len(todo)
    k = 0
    for script in scripts:
        jobs = []
        while k < len(todo) and todo[k] <= script.last:
            if todo[k] >= script.first:
                jobs.append(todo[k])
            k += 1
        if not jobs or left <= 0:
            continue
        if script.is_array:
            jobs = jobs[:left]
            step = CLAIM_MAX if throttle is None else len(jobs)
            for at in range(0, len(jobs), step):
                piece = jobs[at:at + step]
                spec = compress_indices(j - script.first for j in piece) + (f"%{throttle}" if throttle else "")
                batches.append(Batch(script, piece, spec))
            left -= len(jobs)
        else:
            for j in jobs[:left]:
                batches.append(Batch(script, [j]))
            left -= min(left, len(jobs))
    submitted = sum(b.tasks for b in batches)
    return batches, len(todo) - submitted


GROUP_SIZE = 64  # per-job scripts claimed and recorded together


def plan_retry_batches(scripts: Sequence[ScriptInfo], pending: Sequence[int], adjustments: Dict[int, str],
                       budget: Optional[int], throttle: Optional[int]) -> Tuple[List[Batch], int]:
    """``plan_batches`` where retried jobs carry changes: one batch per script and change, retries first."""
    by_change: Dict[str, List[int]] = {}
    for j in pending:
        by_change.setdefault(adjustments.get(j, ""), []).append(j)
    batches: List[Batch] = []
    left_total = 0
    for text in sorted(by_change, key=lambda t: (t == "", t)):
        room = None if budget is None else max(0, budget - sum(b.tasks for b in batches))
        found, left = plan_batches(scripts, by_change[text], room, throttle)
        adjust, changes = adjust_of(text)
        for b in found:
            b.adjust, b.changes = adjust, changes
        batches += found
        left_total += left
    return batches, left_total


def claim_groups(batches: Sequence[Batch]) -> List[List[Batch]]:
    """An array batch alone; consecutive per-job batches with the same changes in groups of GROUP_SIZE."""
    groups: List[List[Batch]] = []
    for batch in batches:
        if batch.array_spec is None and groups and groups[-1][0].array_spec is None \
                and groups[-1][0].changes == batch.changes and len(groups[-1]) < GROUP_SIZE:
            groups[-1].append(batch)
        else:
            groups.append([batch])
    return groups
