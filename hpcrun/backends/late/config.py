"""What the manifest says of a late-bound campaign's pilots (its ``pilots`` table), typed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from hpcrun.backends.late.seats import PilotSeat


@dataclass(frozen=True)
class PilotConfig:
    """What the manifest says of the pilots (``pilots`` table)."""

    queue: str                 # the queue directory (absolute, on the shared filesystem)
    script: str                # the pilot's batch script
    name: str                  # the pilots' job name
    slots: int                 # inputs a pilot runs at once
    max_pilots: int            # pilots at once (nodes the campaign may use)
    max_queued: Optional[int]  # the site's and campaign's cap on queued jobs
    lease_s: float             # a pilot silent this long is fenced
    input_s: float             # each input's expected time before any has run
    input_limit_s: int         # each input's time limit (a retry may change it)
    walltime_s: int            # each pilot's
    chains: int = 1            # CPUs of each input (its chains)
    seats: Tuple[PilotSeat, ...] = ()       # the clusters pilots go to (one, unnamed, on one cluster)
    move_after_s: Optional[float] = None    # site.move_pending_after: pilots pending this long are handed off
    outputs: str = ""          # the outputs location the claims' outputs are placed in (this generation's)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PilotConfig:
        seats = tuple(PilotSeat.from_dict(s) for s in d.get("seats") or ()) or (
            PilotSeat(None, str(d["script"]), int(d["max_pilots"]), d.get("max_queued")),)
        return cls(str(d["queue"]), str(d["script"]), str(d["name"]), int(d["slots"]), int(d["max_pilots"]),
                   d.get("max_queued"), float(d.get("lease_s", 120)), float(d.get("input_s", 600)),
                   int(d.get("input_limit_s", 600)), int(d.get("walltime_s", 3600)), int(d.get("chains", 1)),
                   seats, d.get("move_after_s"), str(d.get("outputs") or ""))

    @property
    def several(self) -> bool:
        return len(self.seats) > 1
