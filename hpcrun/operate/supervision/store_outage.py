"""The supervisor's own store away: waited out for as long as it lasts, never given up (issue 57).

A PostgreSQL minor upgrade or a host's reboot takes 10-30 minutes, a failover to a standby changes which host
answers, and a Lustre or NFS client hangs or fails for minutes during its server's failover. The campaign's jobs
and pilots never touch the store, so nothing they do is lost meanwhile: array jobs' ends wait in the accounting,
late-bound results in the queue. The supervisor stops its rounds (it submits nothing whose claim it could not
record), waits with a growing pause, and its next round after the store's return records what arrived.

What is not an outage, and ends the supervisor: a refusal an operator must fix (a wrong password, a database
or role that does not exist, a schema from a newer hpcrun) and a fence lost to another supervisor.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from hpcrun.store import outage
from hpcrun.store.outage import first_line

# the pauses before each try to reach the store again: growing, then the last for as long as the outage lasts
STORE_WAITS_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)


class SessionLost(Exception):
    """The session holding the supervisor lock is gone (a server restart, a dropped connection)."""

    def __str__(self) -> str:
        return "the database session holding the supervisor lock was dropped"


def is_outage(dialect: str, exc: BaseException) -> bool:
    """An outage of the store (store/outage.py), or the supervisor lock's session dropped."""
    return isinstance(exc, SessionLost) or outage.is_outage(dialect, exc)


@dataclass
class Outage:
    """One outage of the store, as the supervisor lives it: when it began, its tries, and who is told."""

    emit: Callable[[str, dict], Any]            # the spec's event hook
    say: Callable[[str], None]                  # the supervisor's own log
    mark: Callable[[Optional[float]], None]     # the metrics file: unreachable since (None: back)
    since: Optional[float] = None               # Unix time the store was first found away
    tries: int = 0
    seen: List[str] = field(default_factory=list)   # each outage in words, for the run's report

    def wait(self, exc: BaseException) -> float:
        """A failed reach of the store: the pause before the next try (told at the outage's start)."""
        pause = STORE_WAITS_S[min(self.tries, len(STORE_WAITS_S) - 1)]
        self.tries += 1
        why = first_line(exc)
        if self.since is None:
            self.since = time.time()
            self.seen.append(f"{_clock(self.since)} {why}; reconnecting")
            self.emit("store_unreachable", {"since": _iso(self.since), "error": why})
            self.mark(self.since)
        self.say(f"the state store cannot be reached since {_clock(self.since)} ({why}); "
                 f"trying again in {pause:.0f} s")
        return pause

    def back(self) -> None:
        """The store answered again after an outage: told once."""
        if self.since is None:
            return
        now = time.time()
        self.emit("store_back", {"since": _iso(self.since), "back_at": _iso(now),
                                 "seconds": round(now - self.since, 1)})
        self.say(f"the state store answers again after {now - self.since:.0f} s; recording what arrived meanwhile")
        self.mark(None)
        self.since, self.tries = None, 0


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%H:%M:%S")
