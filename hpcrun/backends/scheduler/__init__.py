"""Schedulers: an abstract :class:`Scheduler` and one module per scheduler, registered by name.

Adding a scheduler is one module here (a ``@register``-ed subclass) and its line below; the
profile's ``scheduler`` choices follow from :func:`names`.
"""

from typing import Optional

from hpcrun.backends.scheduler import slurm, slurm_queue_only  # noqa: F401
from hpcrun.backends.scheduler.base import Adjust, JobRequest, Scheduler, registered

__all__ = ["DEFAULT", "Adjust", "JobRequest", "Scheduler", "names", "scheduler_for"]

DEFAULT = "slurm"


def names() -> list:
    """Every registered scheduler, the default first."""
    return [DEFAULT] + [n for n in registered() if n != DEFAULT]


def scheduler_for(name: str = DEFAULT, cluster: Optional[str] = None) -> Scheduler:
    """A scheduler by its registered name (the profile's ``scheduler``), talking to ``cluster``
    (the profile's ``scheduler.cluster``; None: the cluster this host belongs to)."""
    return registered()[name](cluster)
