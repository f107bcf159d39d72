"""Burst-buffer directive writers, one per system named in the site profile.

``datawarp``: Cray DataWarp ``#DW`` lines. ``slurm-lua``: the same DataWarp
vocabulary under the site's ``Directive=`` word (e.g. the shipped emulator), with
``pool=`` always written because the Lua plugin rejects a capacity without a
pool. ``rabbit``: HPE Near Node Flash (``#DW jobdw type=xfs ... name=``, ``type=lustre`` for jobs on several nodes,
``copy_in``/``copy_out``). ``none``: no lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional, Type

from hpcrun.units import format_capacity

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def value_problem(value: str) -> str:
    """Why ``value`` cannot be one ``key=value`` token of a DataWarp-style line, or ''.

    The grammar splits on blanks and has no quoting; ``$`` would be read as a variable by
    the burst-buffer side; a control character would end or corrupt the line.
    """
    if _CONTROL.search(value):
        return "a control character (line break, TAB, ...)"
    if any(c.isspace() for c in value):
        return "a blank"
    if "$" in value:
        return "'$'"
    return ""


@dataclass(frozen=True)
class Stage:
    source: str
    destination: str
    type: str


@dataclass(frozen=True)
class BufferRequest:
    capacity: int
    access_mode: str
    type: str
    pool: Optional[str]
    stage_in: List[Stage] = field(default_factory=list)
    stage_out: List[Stage] = field(default_factory=list)
    persistent: List[str] = field(default_factory=list)
    nodes: int = 1


class Writer:
    system: ClassVar[str] = ""
    dw_grammar: ClassVar[bool] = True   # its lines follow DataWarp's grammar, checked after rendering
    prefix: str = "#DW"
    always_pool: bool = False

    def __init__(self, directive: str = "DW", pool_required: bool = False):
        self.prefix = "#" + directive
        self.always_pool = pool_required

    def root_var(self, access_mode: str) -> str:
        """The variable naming the job buffer inside the job (e.g. ``DW_JOB_STRIPED``)."""
        return "DW_JOB_PRIVATE" if access_mode == "private" else "DW_JOB_STRIPED"

    def lines(self, req: BufferRequest) -> List[str]:
        p = self.prefix
        pool = f" pool={req.pool}" if req.pool else ""
        out = [f"{p} jobdw capacity={format_capacity(req.capacity)} "
               f"access_mode={req.access_mode} type={req.type}{pool}"]
        out += [f"{p} persistentdw name={n}" for n in req.persistent]
        out += [f"{p} stage_in source={s.source} destination={s.destination} type={s.type}"
                for s in req.stage_in]
        out += [f"{p} stage_out source={s.source} destination={s.destination} type={s.type}"
                for s in req.stage_out]
        return out


_WRITERS: Dict[str, Type[Writer]] = {}


def register(cls: Type[Writer]) -> Type[Writer]:
    _WRITERS[cls.system] = cls
    return cls


def writer_for(system: str, directive: str, pool_required: bool) -> Optional[Writer]:
    """The writer of the profile's system (None for ``none``)."""
    from hpcrun.backends import burstbuffer  # noqa: F401  (importing the package registers every system)

    if system == "none":
        return None
    return _WRITERS[system](directive, pool_required)


def registered() -> List[str]:
    return sorted(_WRITERS)


def grammar_checked(system: str) -> bool:
    """Whether this system's rendered lines are checked against DataWarp's grammar."""
    from hpcrun.backends import burstbuffer  # noqa: F401  (importing the package registers every system)

    cls = _WRITERS.get(system)
    return cls is not None and cls.dw_grammar
