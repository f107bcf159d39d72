"""The kinds a spec or profile may name, derived from the backends' registries (never
written out by hand), as types the models use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from hpcrun.backends import burstbuffer, container, scheduler

if TYPE_CHECKING:
    RuntimeKind = str
    BufferSystem = str
    SchedulerKind = str
else:
    RuntimeKind = Literal[tuple(container.names())]
    BufferSystem = Literal[tuple(burstbuffer.names())]
    SchedulerKind = Literal[tuple(scheduler.names())]

RUNTIMES = tuple(container.names())
BUFFER_SYSTEMS = tuple(burstbuffer.names())
SCHEDULERS = tuple(scheduler.names())
