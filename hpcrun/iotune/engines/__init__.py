"""I/O engines: an abstract :class:`Engine` and one module per benchmark program.

Adding an engine is one module here (a ``@register``-ed subclass) and its line below; the
sweep's ``engine`` choices and ``iotune run --engine`` follow from :func:`names`. The order
below is ``--engine auto``'s preference.
"""

from hpcrun.iotune.engines import ior, fio  # noqa: F401,I001  (order: auto's preference)
from hpcrun.iotune.engines.base import Engine, registered

__all__ = ["Engine", "engine_for", "names"]


def names() -> list:
    """Every registered engine, in auto's order of preference."""
    return list(registered())


def engine_for(name: str) -> Engine:
    return registered()[name]
