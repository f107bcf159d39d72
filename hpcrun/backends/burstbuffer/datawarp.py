"""Cray DataWarp ``#DW`` lines, and the same vocabulary under Slurm's burst_buffer/lua plugin
(``slurm-lua``: ``pool=`` always written, the plugin rejects a capacity without one)."""

from __future__ import annotations

from hpcrun.backends.burstbuffer.base import Writer, register


@register
class DataWarp(Writer):
    system = "datawarp"


@register
class SlurmLua(Writer):
    system = "slurm-lua"

    def __init__(self, directive: str = "DW", pool_required: bool = True):
        super().__init__(directive, True)
