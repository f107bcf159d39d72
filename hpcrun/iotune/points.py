"""Plain data shared by planning, engines, running and collecting: points, steps, measurements.

Engine argv may hold two placeholders that only exist where the step runs: :data:`DIR` (the
point's directory on its target) and :data:`RAW` (the results directory's ``raw/``). A batch
job turns them into shell variables, ``--local`` into real paths. NUL cannot occur in a path
or option, so the placeholders cannot collide with user text.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple

DIR = "\0dir\0"
RAW = "\0raw\0"


class SweepShape(Protocol):
    """What an engine reads of a sweep (sweeps/sweep.py's Sweep has it). The sweep model takes its
    engine choices from the engines' registry, so the engines see the sweep only through this."""

    @property
    def apis(self) -> Sequence[str]: ...
    @property
    def nodes(self) -> Sequence[int]: ...
    @property
    def operations(self) -> Sequence[str]: ...
    @property
    def reps(self) -> int: ...
    @property
    def direct(self) -> bool: ...


class EngineOutputError(Exception):
    """An engine's output for one step is missing, empty, truncated or not understood."""


@dataclass(frozen=True)
class Point:
    id: str            # p0001
    target: str        # as written: bb, scratch, node-local or a path
    api: str
    nodes: int
    writers: int       # per node
    transfer: int      # bytes
    block: int         # bytes per writer
    layout: str        # file-per-process | shared-file

    @property
    def bytes_written(self) -> int:
        return self.block * self.writers * self.nodes

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Step:
    name: str                           # file stem in raw/: p0001-write-r1
    point: str
    operations: Tuple[str, ...]         # what the step measures
    rep: Optional[int]                  # None when the engine repeats inside (IOR -i)
    argv: Tuple[str, ...]               # engine argv (may hold DIR/RAW), launcher not included
    env: Tuple[Tuple[str, str], ...] = ()   # extra variables (Darshan), values may hold DIR/RAW
    ranks: Optional[Tuple[int, int]] = None  # (nodes, per node) for an MPI launch; None: one process
    stdout: str = ""                    # file in raw/ receiving the engine's stdout
    result: str = ""                    # file in raw/ holding the engine's result
    darshan: str = ""                   # path in raw/ of its Darshan log(s) when Darshan is on

    def as_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["argv"] = [shown(w) for w in self.argv]
        d["env"] = [[k, shown(v)] for k, v in self.env]
        return d


def shown(word: str) -> str:
    """A word with its placeholders written the way the docs and manifest show them."""
    return word.replace(DIR, "${POINT_DIR}").replace(RAW, "${RAW}")


def substitute(word: str, point_dir: str, raw: str) -> str:
    return word.replace(DIR, point_dir).replace(RAW, raw)


@dataclass
class Measurement:
    """Bandwidth (MiB/s) and operations per second of one operation at one point."""

    bw_mean: float
    bw_max: float
    bw_min: float
    iops_mean: Optional[float] = None
    reps: int = 1
    samples: List[float] = field(default_factory=list)


def combine(parts: Sequence[Measurement]) -> Measurement:
    """Repetitions measured one by one (fio) -> one measurement like IOR's summary."""
    samples = [s for p in parts for s in (p.samples or [p.bw_mean])]
    iops = [p.iops_mean for p in parts if p.iops_mean is not None]
    return Measurement(
        bw_mean=sum(samples) / len(samples), bw_max=max(p.bw_max for p in parts),
        bw_min=min(p.bw_min for p in parts), iops_mean=(sum(iops) / len(iops)) if iops else None,
        reps=sum(p.reps for p in parts), samples=samples)
