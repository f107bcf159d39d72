"""The campaign and its inputs registered in the store from the manifest: the first step of a submit, and of
the supervisor's start (idempotent; a newer generation's manifest taken up once)."""

from __future__ import annotations

from typing import AbstractSet, Iterator, List, Optional, Sequence, Tuple

from hpcrun.operate.campaign.generations import generation_record
from hpcrun.operate.manifest import Manifest
from hpcrun.store.records import Campaign, NewInput
from hpcrun.store.store import StateStore


def _split_checksum(text: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    if not text:
        return None, None
    algo, _, value = text.partition(":")
    return value, algo


def plan_inputs(manifest: Manifest, held_paths: AbstractSet[str] = frozenset(),
                held: Optional[List[str]] = None) -> Iterator[NewInput]:
    """Every input of the plan with the job that processes it, as the store registers them (one job's at
    a time: the store takes them in chunks). A job with an input in ``held_paths`` is left out, its
    inputs put in ``held``."""
    generation = manifest.generation.number
    for job in manifest.jobs:
        if held_paths and any(p in held_paths for p in job["inputs"]):
            if held is not None:
                held.extend(job["inputs"])
            continue
        n = len(job["inputs"])
        sizes: Sequence[Optional[int]] = job.get("input_sizes") or [None] * n
        events: Sequence[Optional[int]] = job.get("input_events") or [None] * n
        sums: Sequence[Optional[str]] = job.get("checksums") or [None] * n
        for path, size, ev, cs in zip(job["inputs"], sizes, events, sums):
            value, algo = _split_checksum(cs)
            yield NewInput(path, size=size, checksum=value, checksum_algo=algo, job_index=job["index"],
                           events=ev, job_name=job["name"], generation=generation)


def register(store: StateStore, manifest: Manifest) -> Campaign:
    """The campaign and its inputs in the store (idempotent; new inputs are added). A manifest of a newer
    generation than the store's is taken up here, once: its jobs' inputs move to it, except a job one of
    whose inputs went into flight since it was planned (that one finishes where it is)."""
    number = manifest.generation.number
    campaign = store.register_campaign(manifest.campaign, manifest.spec_digest,
                                       manifest.profile_digest, number)
    gen = generation_record(manifest)
    if number > 1 and store.current_generation(campaign.id) < number:
        held: List[str] = []
        moved = store.take_up_generation(campaign.id, gen, plan_inputs(manifest, store.in_flight_paths(campaign.id),
                                                                        held), held)
        if moved is not None:
            store.audit(campaign.id, "generation", f"took up generation {number}: {moved['added']} input(s) "
                                                   f"added, {moved['rerun']} to run again, {moved['withdrawn']} "
                                                   f"withdrawn, {len(held)} left in jobs in flight")
        return store.get_campaign(campaign.name)
    key = (manifest.campaign, str(number), manifest.spec_digest, manifest.profile_digest, str(manifest.total_jobs))
    if key in store.registered:
        return campaign
    store.record_generation(campaign.id, gen)
    store.add_inputs(campaign.id, plan_inputs(manifest), generation=number, remap=False)
    store.registered.add(key)
    return campaign
