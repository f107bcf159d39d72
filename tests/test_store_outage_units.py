"""What is an outage of the store and what is a refusal, the URL of a primary and its standby, and the growing
pause (issue 57): no server needed (the real outages are in tests/test_store_outage.py)."""

from __future__ import annotations

import errno
import sqlite3

import pytest
from sqlalchemy.exc import InternalError, OperationalError, ProgrammingError

from hpcrun.errors import InputError
from hpcrun.operate.supervision import store_outage
from hpcrun.store.base import StateStoreError, StoreUnreachable
from hpcrun.store.outage import is_outage
from hpcrun.store.store import _hosts_in_query


class _PgError(Exception):
    """A driver error as psycopg raises it: its words and its SQLSTATE."""

    def __init__(self, words: str, sqlstate=None):
        super().__init__(words)
        self.sqlstate = sqlstate


def _pg(cls, words, sqlstate=None):
    return cls("SELECT 1", {}, _PgError(words, sqlstate))


@pytest.mark.parametrize("exc", [
    _pg(OperationalError, 'connection failed: connection to server at "db1", port 5432 failed: Connection refused'),
    _pg(OperationalError, "terminating connection due to administrator command", "57P01"),
    _pg(OperationalError, "the database system is starting up", "57P03"),
    _pg(OperationalError, "could not write to file: No space left on device", "53100"),
    _pg(OperationalError, "sorry, too many clients already", "53300"),
    _pg(InternalError, "cannot execute INSERT in a read-only transaction", "25006"),   # a standby, not yet promoted
    _pg(OperationalError, "deadlock detected", "40P01"),
], ids=["refused", "admin-shutdown", "starting-up", "disk-full", "too-many", "read-only-standby", "deadlock"])
def test_a_server_away_or_busy_is_an_outage(exc):
    assert is_outage("postgresql", exc)
    assert is_outage("postgresql", StateStoreError("x").with_traceback(None)) is False
    wrapped = StateStoreError("the store said no")
    wrapped.__cause__ = exc
    assert is_outage("postgresql", wrapped)   # as the store's guard raises it


@pytest.mark.parametrize("exc", [
    _pg(OperationalError, 'connection failed: FATAL:  password authentication failed for user "op"'),
    _pg(OperationalError, 'connection failed: FATAL:  no pg_hba.conf entry for host "10.0.0.5"'),
    _pg(OperationalError, 'connection failed: FATAL:  database "campaigns" does not exist', "3D000"),
    _pg(ProgrammingError, 'relation "inputs" does not exist', "42P01"),
    _pg(ProgrammingError, "permission denied for table inputs", "42501"),
    _pg(OperationalError, "SSL error: certificate verify failed"),
], ids=["password", "pg_hba", "no-database", "no-table", "privilege", "certificate"])
def test_what_an_operator_must_fix_is_not_waited_on(exc):
    assert not is_outage("postgresql", exc)


def test_sqlite_and_the_filesystem():
    io = OperationalError("x", {}, sqlite3.OperationalError("disk I/O error"))
    locked = OperationalError("x", {}, sqlite3.OperationalError("database is locked"))
    assert is_outage("sqlite", io) and not is_outage("sqlite", locked)   # contention is said as such
    assert is_outage("sqlite", OSError(errno.ENOTCONN, "Transport endpoint is not connected"))
    assert is_outage("sqlite", OSError(errno.ESTALE, "Stale file handle"))
    assert not is_outage("sqlite", OSError(errno.EACCES, "Permission denied"))
    assert not is_outage("sqlite", ValueError("a bug"))


def test_an_outage_is_not_taken_for_a_missing_campaign():
    """Callers read StateStoreError as "no such campaign": an outage must not be one."""
    assert not issubclass(StoreUnreachable, StateStoreError) and StoreUnreachable.exit_code == 75


@pytest.mark.parametrize("given, read", [
    ("postgresql+psycopg://op@db1:5432,db2:5433/campaigns?target_session_attrs=read-write",
     "postgresql+psycopg://op@/campaigns?host=db1,db2&port=5432,5433&target_session_attrs=read-write"),
    ("postgresql://db1,db2/c", "postgresql:///c?host=db1,db2"),
    ("postgresql://op:s%40cret@db1,db2:6432/c", "postgresql://op:s%40cret@/c?host=db1,db2&port=,6432"),
    ("postgresql+psycopg://op@[::1]:5432,[fd00::2]/c", "postgresql+psycopg://op@/c?host=::1,fd00::2&port=5432,"),
    ("postgresql+psycopg://op@db1:5432/c", "postgresql+psycopg://op@db1:5432/c"),
    ("sqlite:////scratch/a,b/state.db", "sqlite:////scratch/a,b/state.db"),
])
def test_libpqs_url_of_several_hosts(given, read):
    assert _hosts_in_query(given) == read


def test_hosts_given_twice_are_refused_naming_the_url_without_its_password():
    with pytest.raises(InputError) as exc:
        _hosts_in_query("postgresql://op:secret@db1,db2/c?port=5432")
    assert "names its hosts twice" in str(exc.value) and "secret" not in str(exc.value)


def test_the_pause_grows_then_stays_and_the_outage_is_told_once_each_way(monkeypatch):
    told, said, marks = [], [], []
    o = store_outage.Outage(lambda e, d: told.append((e, d)), said.append, marks.append)
    refused = _pg(OperationalError, "Connection refused")
    pauses = [o.wait(refused) for _ in range(12)]
    assert pauses == list(store_outage.STORE_WAITS_S) + [store_outage.STORE_WAITS_S[-1]] * 4
    assert [e for e, _ in told] == ["store_unreachable"] and len(said) == 12 and len(marks) == 1
    o.back()
    o.back()
    assert [e for e, _ in told] == ["store_unreachable", "store_back"] and marks[-1] is None
    assert told[1][1]["seconds"] >= 0 and o.since is None and o.tries == 0
    assert o.wait(refused) == store_outage.STORE_WAITS_S[0]   # a new outage starts afresh


def test_a_lock_still_held_after_an_outage_is_waited_on_only_while_the_lease_is_ours():
    """After a network cut the server may hold our old session's lock until its keepalive ends it: the
    supervisor waits while the lease is still its own, and steps down once another took it."""
    from types import SimpleNamespace

    from hpcrun.store.locking.fence import Lease

    def store(epoch_now, raises=None):
        def lease(_cid, _purpose):
            if raises is not None:
                raise raises
            return Lease(1, "supervisor", epoch_now, "op@a:1")
        return SimpleNamespace(fences={"supervisor": Lease(1, "supervisor", 3, "op@a:1")}, lease=lease,
                               engine=SimpleNamespace(dialect=SimpleNamespace(name="postgresql")))
    assert store_outage.lease_still_mine(store(3), 1)
    assert not store_outage.lease_still_mine(store(4), 1)   # another supervisor took it meanwhile
    assert store_outage.lease_still_mine(store(3, _pg(OperationalError, "Connection refused")), 1)
    assert not store_outage.lease_still_mine(store(3, ValueError("a bug")), 1)
