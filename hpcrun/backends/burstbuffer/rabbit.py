"""HPE Near Node Flash (Rabbit): ``#DW jobdw type=xfs|lustre ... name=``, ``copy_in``/``copy_out``."""

from __future__ import annotations

from typing import List

from hpcrun.backends.burstbuffer.base import BufferRequest, Writer, register
from hpcrun.units import format_capacity


@register
class Rabbit(Writer):
    system = "rabbit"
    dw_grammar = False   # #DW lines of Flux's own vocabulary, checked for placement only
    NAME = "hpcrun"

    def root_var(self, access_mode: str) -> str:
        return f"DW_JOB_{self.NAME}"

    def lines(self, req: BufferRequest) -> List[str]:
        p = self.prefix
        # xfs is a file system per compute node; a job on several nodes needs the one they share,
        # or the merge on the first node would not see the parts written on the others
        kind = "xfs" if req.nodes == 1 else "lustre"
        out = [f"{p} jobdw type={kind} capacity={format_capacity(req.capacity)} name={self.NAME}"]
        out += [f"{p} persistentdw name={n}" for n in req.persistent]
        out += [f"{p} copy_in source={s.source} destination={s.destination}" for s in req.stage_in]
        out += [f"{p} copy_out source={s.source} destination={s.destination}" for s in req.stage_out]
        return out
