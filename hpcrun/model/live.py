"""A site profile and the live cluster: a draft written from what the scheduler says
(``hpcrun profiles init``), and the places where a profile and its cluster disagree
(``hpcrun profiles check --live``).

The draft holds the scheduler's own numbers; what no scheduler can know (container runtimes,
node-local storage, the filesystems compute nodes see, the burst-buffer directive word) gets a
working default and a ``TODO`` comment, so the draft validates and plans at once and the site
staff know which lines to look at.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import List, Optional

from hpcrun.backends.scheduler.base import ClusterFacts, PartitionFacts
from hpcrun.model.kinds import BUFFER_SYSTEMS
from hpcrun.model.site import Partition, SiteProfile
from hpcrun.units import format_capacity, format_duration

UNLIMITED_WALLTIME_S = 7 * 86400   # written where the partition has no MaxTime (marked TODO)
# Slurm's burst-buffer plugin -> hpcrun's burst-buffer system
_BB_SYSTEM = {"lua": "slurm-lua", "datawarp": "datawarp", "generic": "slurm-lua"}
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")


def _q(value: object) -> str:
    """A YAML scalar for a value the scheduler printed (JSON strings are YAML)."""
    return json.dumps(value)


def _partition_lines(p: PartitionFacts) -> List[str]:
    wall = (_q(format_duration(p.max_time_s)) if p.max_time_s is not None else
            f"{_q(format_duration(UNLIMITED_WALLTIME_S))}   # TODO: MaxTime=UNLIMITED; the longest walltime "
            "campaigns may ask for")
    lines = [f"  {p.name}:", f"    slurm_partition: {p.name}", f"    nodes: {max(1, p.nodes)}",
             f"    cores_per_node: {max(1, p.cpus_per_node)}   # the scheduler's CPUs per node; TODO: physical "
             "cores if it counts hardware threads",
             f"    memory_per_node: {max(1, p.memory_per_node_mb)}MiB",
             f"    max_walltime: {wall}", f"    exclusive: {'true' if p.exclusive else 'false'}"]
    if p.qos:
        lines.append(f"    qos: [{', '.join(q for q in p.qos if _NAME.match(q))}]")
    return lines


def _buffer_lines(facts: ClusterFacts) -> List[str]:
    system = _BB_SYSTEM.get(facts.burst_buffer, "")
    pools = [p for p in facts.pools if _NAME.match(p.name)]
    if system not in BUFFER_SYSTEMS or not pools:
        return []
    lines = ["burst_buffer:", f"  system: {system}   # from the scheduler's burst-buffer plugin '{facts.burst_buffer}'",
             "  directive: DW   # TODO: the Directive= of burst_buffer.conf (DW or BB)",
             f"  pool_required: {'true' if system == 'slurm-lua' else 'false'}", "  pools:"]
    for n, pool in enumerate(pools):
        lines += [f"    - name: {pool.name}",
                  f"      granularity: {format_capacity(pool.granularity_bytes or 1)}"]
        if pool.total_bytes:
            lines.append(f"      total: {format_capacity(pool.total_bytes)}")
        if n == 0:
            lines.append("      default: true")
    return lines


def draft_profile(facts: ClusterFacts, name: Optional[str] = None, cluster: Optional[str] = None) -> str:
    """A site profile for this cluster, as YAML text with a comment at each value it cannot know."""
    parts = [p for p in facts.partitions if _NAME.match(p.name)]
    if not parts:
        raise ValueError(f"cluster {facts.name} reports no partition hpcrun can name")
    default = next((p for p in parts if p.default), parts[0])
    profile = name or re.sub(r"[^A-Za-z0-9_.-]", "-", facts.name) or "cluster"
    lines = [f"# Drafted by `hpcrun profiles init` from cluster {facts.name} on {dt.date.today().isoformat()}.",
             "# Numbers are the scheduler's; lines marked TODO are what it cannot know: check them,",
             "# then `hpcrun profiles validate` this file and `hpcrun profiles check NAME --live` later on.",
             f"name: {_q(profile)}", f"description: {_q(f'cluster {facts.name} (drafted from the live scheduler)')}"]
    if cluster:
        lines += ["scheduler:", f"  cluster: {cluster}"]
    lines.append("partitions:")
    for p in parts:
        lines += _partition_lines(p)
    lines.append(f"default_partition: {default.name}")
    if facts.max_array_size is not None:
        lines.append(f"max_array_size: {facts.max_array_size}   # the scheduler's MaxArraySize")
    if facts.max_submit_jobs:
        lines.append(f"max_queued_jobs: {facts.max_submit_jobs}   # the association's MaxSubmitJobs")
    lines += ["node_local:   # TODO: node-local storage (the scheduler does not know it)",
              "  path: /tmp", "  size: 4GiB", "  type: ssd",
              "containers:   # TODO: the container runtimes the site offers (shifter, apptainer, podman-hpc, "
              "charliecloud, sarus)", "  none: true"]
    lines += _buffer_lines(facts)
    lines += ["filesystems: {}   # TODO: what compute nodes see, e.g. scratch: {path: /scratch, type: lustre}"]
    return "\n".join(lines) + "\n"


def live_differences(profile: SiteProfile, facts: ClusterFacts) -> List[str]:
    """Where the profile and the live cluster disagree, one line each naming the profile's key."""
    out: List[str] = []
    if profile.scheduler.cluster and profile.scheduler.cluster != facts.name:
        out.append(f"scheduler.cluster: the profile names '{profile.scheduler.cluster}', the scheduler answered "
                   f"as '{facts.name}'")
    live = {p.name: p for p in facts.partitions}
    for key, part in profile.partitions.items():
        if part.slurm_partition is None:
            continue   # selected by QOS or constraint: nothing to compare by name
        lp = live.get(part.slurm_partition)
        if lp is None:
            out.append(f"partitions.{key}: partition '{part.slurm_partition}' is gone (the cluster has "
                       f"{', '.join(sorted(live)) or 'none'})")
            continue
        out += _partition_differences(key, part, lp)
    if facts.max_array_size is not None and profile.max_array_size > facts.max_array_size:
        out.append(f"max_array_size: the profile says {profile.max_array_size}, the cluster's MaxArraySize is "
                   f"{facts.max_array_size}")
    if facts.max_submit_jobs and (profile.max_queued_jobs or 10 ** 9) > facts.max_submit_jobs:
        out.append(f"max_queued_jobs: {profile.max_queued_jobs or 'unset'}, the cluster's MaxSubmitJobs for this "
                   f"user is {facts.max_submit_jobs}")
    out += _pool_differences(profile, facts)
    return out


def _partition_differences(key: str, part: Partition, lp: PartitionFacts) -> List[str]:
    out = []
    if lp.nodes and part.nodes > lp.nodes:
        out.append(f"partitions.{key}.nodes: the profile says {part.nodes}, the partition has {lp.nodes}")
    if lp.cpus_per_node and part.cpus > lp.cpus_per_node:
        out.append(f"partitions.{key}: the profile gives {part.cpus} CPUs per node, the nodes have {lp.cpus_per_node}")
    if lp.memory_per_node_mb and part.memory_per_node > lp.memory_per_node_mb * 2 ** 20:
        out.append(f"partitions.{key}.memory_per_node: the profile says {part.memory_per_node // 2 ** 20} MiB, "
                   f"the nodes have {lp.memory_per_node_mb} MiB")
    if lp.max_time_s is not None and part.max_walltime > lp.max_time_s:
        out.append(f"partitions.{key}.max_walltime: the profile allows {format_duration(part.max_walltime)}, the "
                   f"partition's MaxTime is {format_duration(lp.max_time_s)}")
    return out


def _pool_differences(profile: SiteProfile, facts: ClusterFacts) -> List[str]:
    if profile.burst_buffer.system == "none":
        return []
    live = {p.name: p for p in facts.pools}
    out = []
    for n, pool in enumerate(profile.burst_buffer.pools):
        lp = live.get(pool.name)
        if lp is None:
            out.append(f"burst_buffer.pools.{n}: pool '{pool.name}' is gone (the cluster has "
                       f"{', '.join(sorted(live)) or 'no pool'})")
        elif lp.granularity_bytes and lp.granularity_bytes != pool.granularity:
            out.append(f"burst_buffer.pools.{n}.granularity: the profile says {format_capacity(pool.granularity)}, "
                       f"the pool's is {format_capacity(lp.granularity_bytes)}")
    return out
