"""Burst-buffer systems: an abstract :class:`Writer` and one module per system, registered by name.

Adding a system is one module here, its line below, and (where it has settings) its table in
the site profile model; the profile's ``burst_buffer.system`` choices follow from :func:`names`.
"""

from typing import List

from hpcrun.backends.burstbuffer import datawarp, rabbit  # noqa: F401
from hpcrun.backends.burstbuffer.base import BufferRequest, Stage, Writer, registered, value_problem, writer_for

__all__ = ["BufferRequest", "Stage", "Writer", "names", "value_problem", "writer_for"]


def names() -> List[str]:
    """Every registered system, then ``none``."""
    return registered() + ["none"]
