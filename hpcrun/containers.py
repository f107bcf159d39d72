"""Container runtimes: one small class each, registered by name.

A runtime answers three questions for the renderer: which ``#SBATCH`` options it
needs, what argv prefix runs a command inside the image (after ``srun``, never
before it), and where the node-local payload cache appears inside the container.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar, Dict, List, Optional, Type

from .profile import SiteProfile
from .shell import quote, sbatch_value
from .spec import ContainerSpec
from .units import format_binary_suffix


@dataclass(frozen=True)
class Bind:
    """A host path made visible in the container; values are shell words (may hold $VARS)."""

    source: str
    target: str
    read_only: bool = False


@dataclass
class Runtime:
    spec: ContainerSpec
    profile: SiteProfile
    node_cache_size: int = 0          # bytes for the per-node payload cache (0: no DB)
    binds: List[Bind] = field(default_factory=list)
    env_names: List[str] = field(default_factory=list)   # variables set by the spec/profile

    name: ClassVar[str] = ""

    def sbatch_options(self) -> List[str]:
        return []

    def prefix(self) -> str:
        """Shell words placed between ``srun [opts]`` and the command."""
        return ""

    def node_cache_dir(self) -> Optional[str]:
        """Where the payload cache lives as seen inside the container (None: use node-local)."""
        return None


_REGISTRY: Dict[str, Type[Runtime]] = {}


def register(cls: Type[Runtime]) -> Type[Runtime]:
    _REGISTRY[cls.name] = cls
    return cls


def runtime_for(spec: ContainerSpec, profile: SiteProfile, **kw: object) -> Runtime:
    factory: Callable[..., Runtime] = _REGISTRY[spec.runtime]
    return factory(spec=spec, profile=profile, **kw)


def names() -> List[str]:
    return sorted(_REGISTRY)


@register
@dataclass
class NoContainer(Runtime):
    name: ClassVar[str] = "none"


@register
@dataclass
class Shifter(Runtime):
    """NERSC Shifter via its SPANK plugin: image and all volumes in the batch script.

    Facts: ``--volume`` keeps only its last value, so every map goes into one
    option joined by ``;``; perNodeCache ignores its source path but the path must
    exist; ``shifter`` without ``--image`` reuses the batch-level image.
    """

    name: ClassVar[str] = "shifter"

    @property
    def settings(self):  # type: ignore[no-untyped-def]
        assert self.profile.containers.shifter is not None
        return self.profile.containers.shifter

    def uses_per_node_cache(self) -> bool:
        return bool(self.node_cache_size) and self.settings.per_node_cache

    def sbatch_options(self) -> List[str]:
        opts = [f"--image={sbatch_value(self.spec.image)}"]
        maps = []
        if self.uses_per_node_cache():
            size = format_binary_suffix(self.node_cache_size)
            maps.append(f"{self.settings.volume_source}:{self.settings.cache_mount}:perNodeCache=size={size}")
        if maps:
            opts.append(f"--volume={sbatch_value(';'.join(maps))}")
        modules = list(self.spec.modules) or list(self.settings.modules)
        if modules:
            opts.append(f"--module={sbatch_value(','.join(modules))}")
        return opts

    def prefix(self) -> str:
        words = [quote(self.settings.command)]
        words += [quote(o) for o in self.spec.options]
        return " ".join(words)

    def node_cache_dir(self) -> Optional[str]:
        return self.settings.cache_mount if self.uses_per_node_cache() else None


@register
@dataclass
class Apptainer(Runtime):
    """Apptainer ``exec`` of a local SIF with explicit binds (no perNodeCache: the
    payload is copied to node-local storage bound into the container)."""

    name: ClassVar[str] = "apptainer"
    # options that drop the host environment, through which hpcrun passes HPCRUN_* to tasks
    CLEARS_ENV: ClassVar[frozenset] = frozenset({"--cleanenv", "-e", "--containall", "-C", "--compat"})

    def prefix(self) -> str:
        settings = self.profile.containers.apptainer
        assert settings is not None
        words = [quote(settings.command), "exec"]
        words += [quote(o) for o in settings.exec_options]
        words += [quote(o) for o in self.spec.options]
        for site_bind in settings.binds:
            words += ["-B", quote(site_bind)]
        for bind in self.binds:
            spec = f"{bind.source}:{bind.target}" + (":ro" if bind.read_only else "")
            words += ["-B", spec]
        words.append(quote(self.spec.image))
        return " ".join(words)


@register
@dataclass
class PodmanHpc(Runtime):
    """podman-hpc: one container per task; environment passed by name patterns."""

    name: ClassVar[str] = "podman-hpc"

    def prefix(self) -> str:
        settings = self.profile.containers.podman_hpc
        assert settings is not None
        words = [quote(settings.command), "run", "--rm"]
        words += [quote(o) for o in settings.run_options]
        words += [quote(o) for o in self.spec.options]
        for pattern in ("HPCRUN_*", "SLURM_*", "DW_*", *self.env_names):
            words += ["-e", quote(pattern)]
        for bind in self.binds:
            spec = f"{bind.source}:{bind.target}" + (":ro" if bind.read_only else "")
            words += ["-v", spec]
        words.append(quote(self.spec.image))
        return " ".join(words)
