"""Apptainer (Singularity): ``exec`` of a local SIF with explicit binds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, List

from hpcrun.backends.container.base import Runtime, register
from hpcrun.shell import Shell, quote


@register
@dataclass
class Apptainer(Runtime):
    """Apptainer ``exec`` of a local SIF with explicit binds (no perNodeCache: the
    payload is copied to node-local storage bound into the container)."""

    name: ClassVar[str] = "apptainer"
    # options that drop the host environment, through which hpcrun passes HPCRUN_* to tasks
    CLEARS_ENV: ClassVar[frozenset] = frozenset({"--cleanenv", "-e", "--containall", "-C", "--compat"})

    def prefix(self) -> Shell:
        settings = self.profile.containers.apptainer
        assert settings is not None
        words: List[str] = [quote(settings.command), "exec"]
        words += [quote(o) for o in settings.exec_options]
        words += [quote(o) for o in self.spec.options]
        for site_bind in settings.binds:
            words += ["-B", quote(site_bind)]
        for bind in self.binds:
            spec = f"{bind.source}:{bind.target}" + (":ro" if bind.read_only else "")
            words += ["-B", spec]
        words.append(quote(self.spec.image))
        return Shell(" ".join(words))
