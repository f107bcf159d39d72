"""Shifter (NERSC): the image and its per-node cache volume are batch options; tasks run under ``shifter``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, List, Optional, Tuple

from hpcrun.backends.container.base import Runtime, register
from hpcrun.shell import Shell, quote
from hpcrun.units import format_binary_suffix


@register
@dataclass
class Shifter(Runtime):
    """NERSC Shifter via its SPANK plugin: image and all volumes in the batch script.

    Facts: ``--volume`` keeps only its last value, so every map goes into one
    option joined by ``;``; perNodeCache ignores its source path but the path must
    exist; ``shifter`` without ``--image`` reuses the batch-level image.
    """

    name: ClassVar[str] = "shifter"
    per_node_cache: ClassVar[bool] = True
    modules: ClassVar[bool] = True

    @property
    def settings(self):  # type: ignore[no-untyped-def]
        assert self.profile.containers.shifter is not None
        return self.profile.containers.shifter

    def uses_per_node_cache(self) -> bool:
        return bool(self.node_cache_size) and self.settings.per_node_cache

    def directive_options(self) -> List[Tuple[str, Optional[str]]]:
        opts: List[Tuple[str, Optional[str]]] = [("--image", self.spec.image)]
        maps = []
        if self.uses_per_node_cache():
            size = format_binary_suffix(self.node_cache_size)
            maps.append(f"{self.settings.volume_source}:{self.settings.cache_mount}:perNodeCache=size={size}")
        if maps:
            opts.append(("--volume", ";".join(maps)))
        modules = list(self.spec.modules) or list(self.settings.modules)
        if modules:
            opts.append(("--module", ",".join(modules)))
        return opts

    def prefix(self) -> Shell:
        words: List[str] = [quote(self.settings.command)]
        words += [quote(o) for o in self.spec.options]
        return Shell(" ".join(words))

    def node_cache_dir(self) -> Optional[str]:
        return self.settings.cache_mount if self.uses_per_node_cache() else None

    def image_id(self) -> Shell:
        """The image gateway's id of the image (`shifterimg lookup`)."""
        return Shell(" ".join(["shifterimg", "lookup", quote(self.spec.image)]))
