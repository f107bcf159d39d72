"""Campaign state store: every input's fate, every submission and every observed Slurm state.

A campaign runs for months through crashes and maintenance windows, so what has been
claimed, submitted, observed and checked must survive any interruption and be shared
safely by concurrent hpcrun processes. The default store is SQLite (WAL, or a rollback
journal on a network filesystem whose locks were proved to work; foreign keys, busy
timeout) at ``<plan_dir>/state.db``; several operators can instead share a server
database given by URL (``postgresql+psycopg://...``, ``mysql+pymysql://...``). All SQL
is built with SQLAlchemy Core, so the same code runs on each.

Concurrency rule: every write runs in one transaction; on SQLite it starts with
``BEGIN IMMEDIATE`` (the write lock is taken up front, so a read-then-write such as a
claim never deadlocks or sees a stale snapshot), on servers the claim locks its rows with
``SELECT ... FOR UPDATE SKIP LOCKED``. SQLite does not queue waiting writers fairly: a
process that claims in a tight loop can starve another until it stops, so callers should
claim in batches with real work (submissions) in between, as the submitter naturally does.

This module is the storage layer only; ``hpcrun submit``, ``status`` and ``retry`` build
on it.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence, Tuple, Union

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from hpcrun.errors import InputError, Problem
from hpcrun.store.base import SchemaVersionError, StateStoreError, _whoami
from hpcrun.store.locking.mounts import DB_NAME, DEFAULT_BUSY_TIMEOUT_S, check_sqlite_location
from hpcrun.store.queries import Queries
from hpcrun.store.rows.claims import Claims
from hpcrun.store.rows.control import Control
from hpcrun.store.rows.exports import Exports
from hpcrun.store.rows.failures import Failures
from hpcrun.store.rows.generations import Generations
from hpcrun.store.rows.observations import Observations
from hpcrun.store.rows.spans import Spans
from hpcrun.store.rows.supervision import Supervision
from hpcrun.store.sql import schema

# ---------------------------------------------------------------------------------------------
# engines


def _configure_sqlite(engine: Engine, busy_timeout_s: float, memory: bool, network: bool = False) -> None:
    """WAL (a rollback journal on a network filesystem), foreign keys and a busy timeout on
    every connection; BEGIN IMMEDIATE for writes.

    WAL's shared-memory index cannot work across the clients of a network filesystem, so
    there the journal is DELETE with full syncs: readers and the one writer take turns
    under SQLite's fcntl locks, which the store proved to work when it was opened.
    pysqlite's own transaction handling is turned off (isolation_level None) so that
    SQLAlchemy's BEGIN is the only one and DDL is transactional too.
    """
    busy_ms = int(busy_timeout_s * 1000)
    journal, sync = ("DELETE", "FULL") if network else ("WAL", "NORMAL")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
            cur.execute("PRAGMA foreign_keys = ON")
            mode = cur.execute(f"PRAGMA journal_mode = {journal}").fetchone()[0]
            cur.execute(f"PRAGMA synchronous = {sync}")  # NORMAL: with WAL, durable but for the last commits
        finally:
            cur.close()
        if not memory and not network and str(mode).lower() != "wal":
            warnings.warn(f"SQLite refused WAL journal mode (got {mode!r}); concurrent readers will block writers",
                          RuntimeWarning, stacklevel=2)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        read_only = conn.get_execution_options().get("hpcrun_read_only", False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def _display(url: URL) -> str:
    return url.render_as_string(hide_password=True)


# ---------------------------------------------------------------------------------------------
# the store


class StateStore(Claims, Control, Exports, Failures, Observations, Generations, Spans, Queries, Supervision):
    """A campaign state database. Open with :meth:`open`; every method is one transaction."""

    @classmethod
    def open(cls, target: Union[str, os.PathLike], *, allow_network_fs: bool = False,
             busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, mount_table: Optional[str] = None) -> StateStore:
        """Open (creating and migrating as needed) the store of a plan directory or at a database URL.

        ``target`` is a plan directory (the store is ``<dir>/state.db``) or a SQLAlchemy URL.
        ``mount_table`` replaces /proc/self/mountinfo for the filesystem check (tests, odd sites).
        """
        text = os.fspath(target)
        if "://" in text:
            engine, location = cls._engine_for_url(text, allow_network_fs, busy_timeout_s, mount_table)
        else:
            plan_dir = Path(text)
            if not plan_dir.is_dir():
                raise InputError([Problem(text, None, "", (
                    "is not a directory; the state store lives in a plan directory "
                    "(create one with `hpcrun plan SPEC --out DIR`) or at a database URL"))])
            db = plan_dir / DB_NAME
            placement = check_sqlite_location(db, allow_network_fs=allow_network_fs, mount_table=mount_table)
            engine = create_engine(URL.create("sqlite", database=str(db)))
            _configure_sqlite(engine, busy_timeout_s, memory=False, network=placement.network)
            location = str(db)
        store = cls(engine, location)
        try:
            store._migrate(schema.MIGRATIONS)
        except BaseException:
            engine.dispose()
            raise
        return store

    @staticmethod
    def _engine_for_url(text: str, allow_network_fs: bool, busy_timeout_s: float,
                        mount_table: Optional[str]) -> Tuple[Engine, str]:
        try:
            url = make_url(_hosts_in_query(text))
        except ArgumentError as exc:
            raise InputError([Problem(text, None, "", f"is not a database URL: {exc}")]) from None
        location = _display(url)
        try:
            if url.get_backend_name() == "sqlite":
                db = url.database or ""
                memory = db in ("", ":memory:")
                network = not memory and check_sqlite_location(
                    db, allow_network_fs=allow_network_fs, mount_table=mount_table).network
                engine = create_engine(url, poolclass=StaticPool) if memory else create_engine(url)
                _configure_sqlite(engine, busy_timeout_s, memory, network)
            elif url.get_backend_name() == "postgresql":
                # the server shows each session as its hpcrun process (pg_stat_activity), so that a
                # refused lock can name its holder
                engine = create_engine(url, pool_pre_ping=True, connect_args={
                    "application_name": _whoami()[:63],
                    "connect_timeout": CONNECT_TIMEOUT_S})
            else:
                engine = create_engine(url, pool_pre_ping=True)
        except NoSuchModuleError as exc:
            raise InputError([Problem(location, None, "", (
                f"is not a database URL hpcrun can use ({exc}); use a plan directory, sqlite:///PATH, "
                "postgresql+psycopg://USER@HOST/DB or mysql+pymysql://USER@HOST/DB"))]) from None
        except ImportError as exc:
            raise InputError([Problem(location, None, "", (
                f"needs a database driver that is not installed ({exc}); for PostgreSQL "
                "`pip install 'psycopg[binary]'`, for MySQL/MariaDB `pip install pymysql`"))]) from None
        return engine, location

    def _migrate(self, migrations: Sequence[schema.Migration]) -> int:
        """Bring the schema up to date; tolerate another process doing the same at the same moment."""
        target = len(migrations)
        for attempt in range(3):
            try:
                with self._guard(), self.engine.begin() as conn:
                    return schema.migrate(conn, migrations)
            except schema.SchemaTooNew as exc:
                raise SchemaVersionError(
                    f"{self.location}: the state database has schema version {exc.found}, but this hpcrun "
                    f"only knows versions up to {exc.known}: it was written by a newer hpcrun. Upgrade hpcrun "
                    "(pip install -U hpcrun) to use this campaign; an older hpcrun must not modify it.") from None
            except StateStoreError:
                # on a server, a concurrent opener may have won the race to create the tables
                if attempt == 2:
                    raise
                try:
                    if self.schema_version() == target:
                        return target
                except StateStoreError:
                    pass
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")  # pragma: no cover


# seconds libpq waits for each host (a failed primary that drops packets rather than refusing would otherwise
# cost the kernel's two minutes before the standby is tried)
CONNECT_TIMEOUT_S = 10
_SEVERAL_HOSTS = re.compile(r"^(postgresql(?:\+\w+)?://)([^@/?]*@)?([^/?@]*,[^/?@]*)(/[^?]*)?(?:\?(.*))?$")


def _hosts_in_query(text: str) -> str:
    """libpq's URL of several hosts (``postgresql://u@a:5432,b:5433/db?target_session_attrs=read-write``, a
    primary and its standby) as SQLAlchemy reads it: ``?host=a,b&port=5432,5433`` (passed on to libpq, which
    tries them in turn; a host without a port gets libpq's default). Other URLs as they are."""
    m = _SEVERAL_HOSTS.match(text)
    if m is None:
        return text
    scheme, user, hosts, path, query = m.groups()
    if query and re.search(r"(^|&)(host|port)=", query):
        raise InputError([Problem(_display_text(text), None, "", (
            "names its hosts twice (in the address and as ?host= or ?port=); give them once: "
            "postgresql+psycopg://USER@HOST1:PORT1,HOST2:PORT2/DB?target_session_attrs=read-write"))])
    names, ports = [], []
    for one in hosts.split(","):
        if one.startswith("["):   # [IPv6]:port
            name, _, port = one[1:].partition("]")
            port = port.lstrip(":")
        else:
            name, _, port = one.partition(":")
        names.append(name)
        ports.append(port)
    extra = f"host={','.join(names)}" + (f"&port={','.join(ports)}" if any(ports) else "")
    return f"{scheme}{user or ''}{path or '/'}?{extra}{'&' + query if query else ''}"


def _display_text(text: str) -> str:
    """A URL as given, its password hidden."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", text)


def open_store(target: Union[str, os.PathLike], **options: Any) -> StateStore:
    """Shorthand for :meth:`StateStore.open`."""
    return StateStore.open(target, **options)

