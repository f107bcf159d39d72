"""podman-hpc: one container per task, environment passed by name patterns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, List

from hpcrun.backends.container.base import Runtime, register
from hpcrun.shell import Shell, quote


@register
@dataclass
class PodmanHpc(Runtime):
    """podman-hpc: one container per task; environment passed by name patterns."""

    name: ClassVar[str] = "podman-hpc"

    def prefix(self) -> Shell:
        settings = self.profile.containers.podman_hpc
        assert settings is not None
        words: List[str] = [quote(settings.command), "run", "--rm"]
        words += [quote(o) for o in settings.run_options]
        words += [quote(o) for o in self.spec.options]
        for pattern in ("HPCRUN_*", *self.task_env_patterns, "DW_*", *self.env_names):
            words += ["-e", quote(pattern)]
        for bind in self.binds:
            spec = f"{bind.source}:{bind.target}" + (":ro" if bind.read_only else "")
            words += ["-v", spec]
        words.append(quote(self.spec.image))
        return Shell(" ".join(words))

    def image_id(self) -> Shell:
        """podman's id of the image (sha256 of its config), as `podman image inspect` reports it."""
        settings = self.profile.containers.podman_hpc
        assert settings is not None
        return Shell(" ".join([quote(settings.command), "image", "inspect", "--format", quote("{{.Id}}"),
                               quote(self.spec.image)]))
