"""Container runtimes: one small class each, registered by name.

A runtime answers three questions for the renderer: which scheduler directive options
it needs (Shifter's image and volumes), what argv prefix runs a command inside the image
(after the task launcher, never before it), and where the node-local payload cache appears inside the container.
It also says what it can do (``per_node_cache``, ``modules``), which shell lines the
batch script runs before the first container starts (``setup_lines``), and what is
wrong with the plan for it (``problems``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Optional, Protocol, Sequence, Tuple, Type

from hpcrun.shell import Shell


class ContainerSpec(Protocol):
    """What a runtime reads of the spec's ``container`` table (model/spec.py's ContainerSpec has it).

    A protocol, not the model: the models derive their lists of kinds from this registry, so the
    backends must not depend on them, not even for a type."""

    @property
    def runtime(self) -> str: ...
    @property
    def image(self) -> Optional[str]: ...
    @property
    def options(self) -> Sequence[str]: ...
    @property
    def modules(self) -> Sequence[str]: ...


class SiteProfile(Protocol):
    """What a runtime reads of the site profile (model/site.py's SiteProfile has it): its name and
    its ``containers`` table, one settings table per runtime."""

    @property
    def name(self) -> str: ...
    @property
    def containers(self) -> Any: ...


@dataclass(frozen=True)
class Bind:
    """A host path made visible in the container; values are shell words (may hold $VARS)."""

    source: str
    target: str
    read_only: bool = False
    path: Optional[str] = None        # the literal host path when known at plan time (target = source)
    origin: Tuple[object, ...] = ()   # ("spec"|"profile", key, ...) that asked for it; ("plan",), ("bb",)


@dataclass(frozen=True)
class RuntimeProblem:
    where: str                        # "spec" or "profile"
    path: Tuple[object, ...]          # key path in that file
    message: str


@dataclass
class Runtime:
    spec: ContainerSpec
    profile: SiteProfile
    node_cache_size: int = 0          # bytes for the per-node payload cache (0: no DB)
    binds: List[Bind] = field(default_factory=list)
    env_names: List[str] = field(default_factory=list)   # variables set by the spec/profile
    task_env: Tuple[str, ...] = ()            # the scheduler's per-task variables (its rank, node, job id)
    task_env_patterns: Tuple[str, ...] = ()   # the same as name patterns

    name: ClassVar[str] = ""
    per_node_cache: ClassVar[bool] = False   # can give the payload a per-node cache volume
    modules: ClassVar[bool] = False          # has image modules (Shifter --module)
    CLEARS_ENV: ClassVar[frozenset] = frozenset()  # options that would drop the HPCRUN_* variables

    def site_settings(self) -> Any:
        """This runtime's table in the profile's ``containers`` (None where the site has none)."""
        return getattr(self.profile.containers, self.name.replace("-", "_"), None)

    def directive_options(self) -> List[Tuple[str, Optional[str]]]:
        """(option, value) pairs for the job's directive lines; the scheduler checks and writes them."""
        return []

    def setup_lines(self) -> List[str]:
        """Shell lines the batch script runs before its first container starts."""
        return []

    def problems(self) -> Tuple[List[RuntimeProblem], List[str]]:
        """What is wrong with the plan for this runtime, and notes for the user."""
        return [], []

    def prefix(self) -> Shell:
        """Shell words placed between the task launcher and the command."""
        return Shell("")

    def node_cache_dir(self) -> Optional[str]:
        """Where the payload cache lives as seen inside the container (None: use node-local)."""
        return None

    def image_id(self) -> Optional[Shell]:
        """A command the batch shell runs to print the image's id or digest as the runtime knows it (for
        the outputs' provenance); None where the runtime reports none."""
        return None


_REGISTRY: Dict[str, Type[Runtime]] = {}


def register(cls: Type[Runtime]) -> Type[Runtime]:
    _REGISTRY[cls.name] = cls
    return cls


def runtime_for(spec: ContainerSpec, profile: SiteProfile, **kw: object) -> Runtime:
    """The runtime the spec names, set up for this site."""
    from hpcrun.backends import container  # noqa: F401  (importing the package registers every runtime)

    factory: Callable[..., Runtime] = _REGISTRY[spec.runtime]
    return factory(spec=spec, profile=profile, **kw)


def registered() -> List[str]:
    return sorted(_REGISTRY)
