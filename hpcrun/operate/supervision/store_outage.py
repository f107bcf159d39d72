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
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from sqlalchemy import event
from sqlalchemy.engine import Engine

from hpcrun.operate.supervision.stopping import Stop
from hpcrun.store import outage
from hpcrun.store.outage import first_line

# the pauses before each try to reach the store again: growing, then the last for as long as the outage lasts
STORE_WAITS_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)
# a call to the store that has not returned for this long is told as an outage (a statement of a campaign of
# 10^6 inputs takes seconds, a hung network filesystem minutes); looked at this often
HUNG_S = 60.0
WATCH_EVERY_S = 5.0


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

    def __post_init__(self) -> None:
        self.lock = threading.Lock()   # the watch's thread tells of a hung call beside the supervisor's

    def wait(self, exc: BaseException) -> float:
        """A failed reach of the store: the pause before the next try (told at the outage's start)."""
        with self.lock:
            pause = STORE_WAITS_S[min(self.tries, len(STORE_WAITS_S) - 1)]
            self.tries += 1
            why = first_line(exc)
            self._begin(why, time.time())
            self.say(f"the state store cannot be reached since {_clock(self.since or 0)} ({why}); "
                     f"trying again in {pause:.0f} s")
            return pause

    def hung(self, started: float) -> None:
        """A call to the store that has not returned for HUNG_S (a network filesystem whose server fails
        over: its clients' calls hang until it is back). The supervisor's thread waits in it; this says so."""
        with self.lock:
            why = f"a call has not returned for {time.time() - started:.0f} s"
            self._begin(why, started)
            self.say(f"the state store has not answered since {_clock(started)} ({why}); waiting for it")

    def _begin(self, why: str, since: float) -> None:
        if self.since is not None:
            return
        self.since = since
        self.seen.append(f"{_clock(since)} {why}; reconnecting")
        self.emit("store_unreachable", {"since": _iso(since), "error": why})
        self.mark(since)

    def back(self) -> None:
        """The store answered again after an outage: told once."""
        with self.lock:
            if self.since is None:
                return
            now = time.time()
            self.emit("store_back", {"since": _iso(self.since), "back_at": _iso(now),
                                     "seconds": round(now - self.since, 1)})
            self.say(f"the state store answers again after {now - self.since:.0f} s; recording what arrived "
                     "meanwhile")
            self.mark(None)
            self.since, self.tries = None, 0


class Watch(threading.Thread):
    """Watches the store's calls from a thread of its own: one that hangs past HUNG_S is an outage told as it
    lasts (the supervisor's own thread is stuck in it); the next whole round ends it."""

    def __init__(self, engine: Engine):
        super().__init__(daemon=True, name="hpcrun-store-watch")
        self.outage: Optional[Outage] = None
        self.started: Optional[float] = None   # Unix time the call in progress began
        self.told = False
        self.stop = threading.Event()
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)
        event.listen(engine, "handle_error", self._failed)

    def tell(self, outage: Outage) -> Outage:
        """Watching from now on, telling ``outage``."""
        self.outage = outage
        self.start()
        return outage

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()

    def _before(self, *_args: Any) -> None:
        self.started = time.time()

    def _after(self, *_args: Any) -> None:
        self.started = None   # the outage it told of ends with the round (supervise._after_round), not inside
        # a transaction here: the hook told of it may take a minute

    def _failed(self, *_args: Any) -> None:
        self.started = None   # an error: the supervisor's own handling (wait, back) takes it from here

    def run(self) -> None:
        while not self.stop.wait(WATCH_EVERY_S):
            started = self.started
            if started is not None and not self.told and self.outage and time.time() - started > HUNG_S:
                self.told = True
                self.outage.hung(started)


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%H:%M:%S")


def lease_still_mine(store: Any, campaign_id: int) -> bool:
    """After an outage the lock may still be held by the server for our own dropped session (a half-open
    connection, until the server's keepalive ends it): the lease says whether anyone else took the campaign.
    A store that does not answer yet counts as mine: the next try asks again."""
    mine = store.fences.get("supervisor")
    try:
        lease = store.lease(campaign_id, "supervisor")
    except Exception as exc:   # noqa: BLE001 (an outage counts as mine; anything else is not)
        return is_outage(store.engine.dialect.name, exc)
    return lease is not None and mine is not None and lease.epoch == mine.epoch


def after_round(outage: Optional[Outage], watch: Watch,
                on_round: Optional[Callable[[Any], None]]) -> Callable[[Any], None]:
    """After each round: an outage is over once a whole round went through (not at the first answer: a store
    that fails again at once would reset the growing pause at every try)."""
    def after(rnd: Any) -> None:
        if outage is not None:
            watch.told = False
            outage.back()
        if on_round is not None:
            on_round(rnd)
    return after


def wait_out(pause: float, sleep: Callable[[float], None]) -> bool:
    """The pause of an outage, in which SIGTERM or SIGINT still stops the supervisor; whether one did."""
    with Stop() as stop:
        stop.sleep(pause, sleep)
        return stop.asked
