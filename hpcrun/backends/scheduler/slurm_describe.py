"""What a Slurm cluster says of itself, parsed: ``scontrol show config``, ``scontrol show partition``,
``sinfo`` (node CPUs and memory), ``scontrol show burst`` (pools), ``sacctmgr`` (QOS and the user's
MaxSubmitJobs). ``hpcrun profiles init`` drafts a profile from it, ``profiles check --live`` compares."""

from __future__ import annotations

import getpass
import re
from typing import Callable, Dict, List, Optional, Tuple

from hpcrun.backends.scheduler.base import ClusterFacts, PartitionFacts, PoolFacts
from hpcrun.units import parse_duration, parse_size

Run = Callable[[List[str]], str]    # a command's output (raises when it fails)


def _fields(line: str) -> Dict[str, str]:
    return dict(w.split("=", 1) for w in line.split() if "=" in w)


def parse_config(text: str) -> Dict[str, str]:
    """``scontrol show config``: ``Key = value`` lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def slurm_time_s(text: str) -> Optional[int]:
    """MaxTime: ``UNLIMITED``/``infinite`` -> None; ``[D-]HH:MM:SS``, ``MM`` (minutes) -> seconds."""
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A"):
        return None
    if text.isdigit():
        return int(text) * 60
    try:
        return int(parse_duration(text))
    except ValueError:
        return None


def parse_partitions(partitions: str, nodes: str) -> Tuple[PartitionFacts, ...]:
    """``scontrol show partition --oneliner`` and ``sinfo -h -o %P|%c|%m|%D`` -> partitions."""
    shape: Dict[str, Tuple[int, int]] = {}
    for line in nodes.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4:
            continue
        name = parts[0].rstrip("*")
        cpus = int(re.sub(r"\D", "", parts[1]) or 0)
        mem = int(re.sub(r"\D.*", "", parts[2]) or 0)
        old = shape.get(name)
        shape[name] = (min(cpus, old[0]), min(mem, old[1])) if old else (cpus, mem)   # the smallest node counts
    out = []
    for line in partitions.splitlines():
        f = _fields(line)
        part = f.get("PartitionName")
        if not part:
            continue
        cpus, mem = shape.get(part, (0, 0))
        total_nodes = int(f.get("TotalNodes", "0") or 0)
        if not cpus and total_nodes:
            cpus = int(f.get("TotalCPUs", "0") or 0) // total_nodes
        allowed = f.get("AllowQos", "ALL")
        out.append(PartitionFacts(
            part, total_nodes, cpus, mem, slurm_time_s(f.get("MaxTime", "")), f.get("Default") == "YES",
            f.get("OverSubscribe", "").startswith("EXCLUSIVE"),
            () if allowed in ("ALL", "") else tuple(allowed.split(","))))
    return tuple(out)


def parse_pools(text: str) -> Tuple[str, Tuple[PoolFacts, ...]]:
    """``scontrol show burst``: the plugin's name and its pools (``PoolName[0]=... Granularity=...``)."""
    plugin, pools = "", []
    for line in text.splitlines():
        f = _fields(line)
        if "Name" in f and not plugin:
            plugin = f["Name"]
        pool = next((v for k, v in f.items() if k.startswith("PoolName")), None)
        if pool:
            pools.append(PoolFacts(pool, _size(f.get("TotalSpace")), _size(f.get("Granularity"))))
    return plugin, tuple(pools)


def _size(text: Optional[str]) -> Optional[int]:
    if not text:
        return None
    try:
        return int(parse_size(text))
    except ValueError:
        return None


def parse_qos(text: str) -> Tuple[Tuple[str, Optional[int]], ...]:
    """``sacctmgr -n -P show qos format=name,maxwall``."""
    out = []
    for line in text.splitlines():
        name, _, wall = line.strip().partition("|")
        if name:
            out.append((name, slurm_time_s(wall)))
    return tuple(out)


def parse_max_submit(text: str) -> Optional[int]:
    """``sacctmgr -n -P show assoc ... format=maxsubmit``: the smallest limit given, None when none."""
    values = [int(v) for v in text.split() if v.strip().isdigit()]
    return min(values) if values else None


def describe(run: Run, cluster: Optional[str]) -> ClusterFacts:
    """Ask the cluster (through ``run``, which adds --clusters) and put the answers together."""
    config = parse_config(run(["scontrol", "show", "config"]))
    name = config.get("ClusterName") or cluster or "?"
    partitions = parse_partitions(run(["scontrol", "show", "partition", "--oneliner"]),
                                  run(["sinfo", "--noheader", "--format=%P|%c|%m|%D"]))
    plugin, pools = parse_pools(run(["scontrol", "show", "burst"])) if config.get("BurstBufferType", "(null)") \
        not in ("(null)", "") else ("", ())
    qos = parse_qos(run(["sacctmgr", "--noheader", "--parsable2", "show", "qos", "format=name,maxwall"]))
    limit = parse_max_submit(run(["sacctmgr", "--noheader", "--parsable2", "show", "assoc",
                                  "where", f"user={getpass.getuser()}", f"cluster={name}", "format=maxsubmit"]))
    array = config.get("MaxArraySize", "")
    return ClusterFacts(name, partitions, int(array) if array.isdigit() else None, limit, qos, plugin, pools)
