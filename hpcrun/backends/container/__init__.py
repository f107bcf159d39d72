"""Container runtimes: an abstract :class:`Runtime` and one module per runtime, registered by name.

Adding a runtime is one module here (a ``@register``-ed subclass), its line below, and its
settings table in the site profile model; the spec's ``container.runtime`` choices, the
profile's ``containers`` check and ``iotune --container`` all follow from :func:`names`.
"""

from hpcrun.backends.container import apptainer, charliecloud, none, podman_hpc, sarus, shifter  # noqa: F401
from hpcrun.backends.container.base import Bind, Runtime, RuntimeProblem, registered, runtime_for

__all__ = ["Bind", "Runtime", "RuntimeProblem", "names", "runtime_for"]


def names() -> list:
    """Every registered runtime, ``none`` first (the default)."""
    return ["none"] + [n for n in registered() if n != "none"]
