"""Campaign locks: one submitter at a time settles claims and submits; one supervisor drives.

Claims alone keep two submitters from taking the same input, but settling a claim
that has no recorded job (look for its tag in Slurm, then record or release it) is
only safe when no other submitter is between its own claim and record. So `submit`,
`retry` and their reconciliation run under this lock. Every kind of lock used here is
released by the operating system or the server when the holder dies (a killed hpcrun
never leaves a stale lock behind): ``flock`` on a file next to a SQLite store,
session advisory locks on PostgreSQL, ``GET_LOCK`` on MySQL/MariaDB. The supervisor lock
(``hpcrun run``) is a second lock of the same kinds, held for the supervisor's whole life.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from hpcrun.errors import HpcrunError


class LockTimeout(HpcrunError):
    """Another hpcrun process kept the campaign's submit lock for longer than we waited."""

    exit_code = 4


def _key(campaign: str, purpose: str = "submit") -> int:
    """A signed 64-bit advisory-lock key for PostgreSQL."""
    return int.from_bytes(hashlib.sha256(f"hpcrun-{purpose}:{campaign}".encode()).digest()[:8], "big", signed=True)


def _waited(timeout: float) -> str:
    return f"waited {timeout:.0f} s" if timeout > 0 else "did not wait"


class Held:
    """A lock being held; ``alive()`` says whether it still is (a server may drop the session)."""

    def __init__(self, alive: Callable[[], bool] = lambda: True):
        self.alive = alive


def _alive(conn: Any) -> bool:
    try:
        conn.execute(text("SELECT 1"))
        conn.commit()
        return True
    except DBAPIError:
        with suppress(SQLAlchemyError):
            conn.rollback()
        return False


@contextmanager
def _file_lock(path: Path, timeout: float, on_wait: Optional[Callable[[str], None]],
               purpose: str = "submit") -> Iterator[Held]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 300, 0).decode("utf-8", "replace").strip() or "another hpcrun process"
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"{path}: the campaign's {purpose} lock is held by {holder}; "
                                      f"{_waited(timeout)}. {_HINT[purpose]}") from None
                if on_wait and not told:
                    on_wait(holder)
                    told = True
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.environ.get('USER', os.getuid())} pid {os.getpid()} on {os.uname().nodename}\n".encode(),
                  0)
        try:
            yield Held()
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


_HINT = {"submit": "Run again when it has finished, or give --lock-timeout.",
         "supervisor": ("A campaign has one supervisor: let that one drive it (`hpcrun status` shows its "
                        "heartbeat), or stop it first; once it has died the lock is free again.")}


def _pg_holder(conn: Any, key: int) -> str:
    """Who holds a PostgreSQL advisory lock: the holder's session name (user@host:pid, set by the store)."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    try:
        name = conn.execute(text(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
            "AND l.classid::bigint = :hi AND l.objid::bigint = :lo"),
            {"hi": unsigned >> 32, "lo": unsigned & 0xFFFFFFFF}).scalar()
        conn.rollback()
    except Exception:  # noqa: BLE001 - naming the holder is a courtesy; the refusal stands without it
        return "another hpcrun process"
    if not name:
        return "another hpcrun process"
    who, _, pid = str(name).rpartition(":")
    return f"{who} pid {pid}" if who and pid.isdigit() else str(name)


@contextmanager
def _server_lock(engine: Engine, campaign: str, location: str, timeout: float,
                 on_wait: Optional[Callable[[str], None]], purpose: str = "submit") -> Iterator[Held]:
    backend = engine.dialect.name
    key = _key(campaign, purpose)
    with engine.connect() as conn:
        holder = lambda: "another hpcrun process"  # noqa: E731
        if backend == "postgresql":
            take = lambda: bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())  # noqa: E731
            give = lambda: conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})  # noqa: E731
            holder = lambda: _pg_holder(conn, key)  # noqa: E731
        elif backend in ("mysql", "mariadb"):
            name = f"hpcrun-{purpose}:{hashlib.sha256(campaign.encode()).hexdigest()[:40]}"
            take = lambda: conn.execute(text("SELECT GET_LOCK(:n, 0)"), {"n": name}).scalar() == 1  # noqa: E731
            give = lambda: conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": name})  # noqa: E731
        else:  # pragma: no cover - only the backends state.py accepts reach here
            raise HpcrunError(f"{location}: no submit lock for database backend {backend}")
        deadline = time.monotonic() + timeout
        told = False
        while not take():
            conn.rollback()
            if time.monotonic() >= deadline:
                raise LockTimeout(f"{location}: campaign '{campaign}': the campaign's {purpose} lock is held by "
                                  f"{holder()}; {_waited(timeout)}. {_HINT[purpose]}")
            if on_wait and not told:
                on_wait(holder())
                told = True
            time.sleep(0.5)
        conn.commit()
        try:
            yield Held(lambda: _alive(conn))
        finally:
            try:
                give()
                conn.commit()
            except SQLAlchemyError:
                pass   # the session is gone, and its lock with it


@contextmanager
def campaign_lock(engine: Engine, location: str, campaign: str, purpose: str, timeout: float,
                  on_wait: Optional[Callable[[str], None]] = None) -> Iterator[Held]:
    """Hold one of the campaign's locks (``purpose``: submit or supervisor); wait up to ``timeout`` s."""
    if engine.dialect.name == "sqlite":
        db = engine.url.database or ""
        if db in ("", ":memory:"):  # a private in-memory store: only this process sees it
            yield Held()
            return
        with _file_lock(Path(f"{db}.{purpose}-lock"), timeout, on_wait, purpose) as held:
            yield held
        return
    with _server_lock(engine, campaign, location, timeout, on_wait, purpose) as held:
        yield held


@contextmanager
def submit_lock(engine: Engine, location: str, campaign: str, timeout: float = 600.0,
                on_wait: Optional[Callable[[str], None]] = None) -> Iterator[None]:
    """Hold the campaign's submit lock; wait up to ``timeout`` seconds for it (``on_wait`` is told once)."""
    with campaign_lock(engine, location, campaign, "submit", timeout, on_wait):
        yield


@contextmanager
def supervisor_lock(engine: Engine, location: str, campaign: str) -> Iterator[Held]:
    """Hold the campaign's supervisor lock for as long as the supervisor lives; never wait for it."""
    with campaign_lock(engine, location, campaign, "supervisor", 0.0) as held:
        yield held
