"""Where URL inputs already are: the nodes' caches as their jobs last listed them (``xrootd.node_cache``).

Each job that stages inputs writes what its node's cache holds to ``<index>/<node>.tsv`` (URL,
bytes, checksum per line), replaced whole. That is a hint, never a promise: a file may have been
evicted since, and the job then reads it from the origin. ``hpcrun plan`` groups a campaign's
inputs by the node holding them; ``submit`` asks for each job's node (``jobs.locality: prefer``).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:   # the supervisor reads the caches' index too: it need not load the spec's models for a type
    from hpcrun.plan.intake.inputs import InputItem

INDEX_READ_MAX = 64 * 1024 * 1024   # bytes read of one node's file (about 5 x 10^5 cached files)
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def read_index(index_dir: Optional[str]) -> Dict[str, Tuple[str, int]]:
    """URL -> (node, bytes) of every file some node's cache lists (the newest listing wins)."""
    held: Dict[str, Tuple[str, int]] = {}
    if not index_dir or not os.path.isdir(index_dir):
        return held
    listings = []
    for name in os.listdir(index_dir):
        node = name[:-4] if name.endswith(".tsv") else ""
        if _NODE.match(node):
            try:
                listings.append((os.stat(os.path.join(index_dir, name)).st_mtime, node, name))
            except OSError:
                continue
    for _mtime, node, name in sorted(listings):
        try:
            with open(os.path.join(index_dir, name), encoding="utf-8", errors="replace") as f:
                text = f.read(INDEX_READ_MAX)
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.split("\t")
            if len(parts) >= 2 and parts[1].isdigit():
                held[parts[0]] = (node, int(parts[1]))
    return held


def node_of(urls: Sequence[str], held: Dict[str, Tuple[str, int]]) -> Optional[str]:
    """The node whose cache holds most of these inputs' bytes (None: no cache holds any)."""
    weight: Dict[str, int] = {}
    for url in urls:
        if url in held:
            node, size = held[url]
            weight[node] = weight.get(node, 0) + max(1, size)
    return max(sorted(weight), key=lambda n: weight[n]) if weight else None


def by_node(paths: Sequence[str], held: Dict[str, Tuple[str, int]]) -> List[int]:
    """An order of the inputs (indexes into ``paths``) that puts those one node holds together,
    nodes in the order their first input appears, uncached inputs last; stable otherwise."""
    first: Dict[str, int] = {}
    for i, p in enumerate(paths):
        if p in held:
            first.setdefault(held[p][0], i)
    rank = {node: k for k, node in enumerate(sorted(first, key=first.__getitem__))}
    return sorted(range(len(paths)), key=lambda i: (rank[held[paths[i]][0]] if paths[i] in held else len(rank), i))


def group_by_node(items: Sequence[InputItem], sums: Sequence[Optional[str]], index_dir: str,
                  notes: List[str]) -> Tuple[List[InputItem], List[Optional[str]]]:
    """The inputs (and their checksums) in ``by_node`` order, and a note of what the index holds."""
    held = read_index(index_dir)
    paths = [i.path for i in items]
    order = by_node(paths, held)
    cached = sum(1 for p in paths if p in held)
    nodes = len({held[p][0] for p in paths if p in held})
    notes.append(f"locality: {cached} of {len(paths)} inputs are in the caches of {nodes} node(s) (index "
                 f"{index_dir}); inputs are grouped by node and each job asks for its node when submitted, "
                 "any node once it waited jobs.locality_wait")
    return [items[i] for i in order], [sums[i] for i in order]
