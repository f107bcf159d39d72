"""No container: commands run on the node as they are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hpcrun.backends.container.base import Runtime, register


@register
@dataclass
class NoContainer(Runtime):
    name: ClassVar[str] = "none"
