"""Transactions, bulk inserts and error wording shared by every part of the store."""

from __future__ import annotations

import datetime as dt
import getpass
import hashlib
import os
import socket
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from sqlalchemy import DateTime, TypeDecorator, bindparam, insert
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.sql import ColumnElement, Select
from typing_extensions import Self

from hpcrun.errors import HpcrunError
from hpcrun.store import outage
from hpcrun.store.locking.fence import Lease, check_fence
from hpcrun.store.sql import schema

_IN_CHUNK = 900  # bound parameters per IN (...) list: below every backend's limit


class StateStoreError(HpcrunError):
    """The state database cannot be used as asked (locked, too new, inconsistent request)."""


class StoreUnreachable(HpcrunError):
    """The store cannot be reached now (its server or filesystem away): try again later, nothing is lost. Not a
    StateStoreError, which callers take for "no such campaign" and the like: an outage must not read as that."""

    exit_code = 75   # EX_TEMPFAIL

    def __init__(self, location: str, exc: BaseException):
        super().__init__(f"the state store {location} cannot be reached now ({outage.first_line(exc)}). Nothing "
                         "is lost: jobs and pilots go on without it, and a running `hpcrun run` waits for it; "
                         "try again when it answers")


class SchemaVersionError(StateStoreError):
    """The database was written by a newer hpcrun; older code must not touch it."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _path_key(path: str) -> str:
    return hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()


def _chunks(values: Sequence[int]) -> Iterator[Sequence[int]]:
    """Slices small enough for one IN (...) list on every backend."""
    for i in range(0, len(values), _IN_CHUNK):
        yield values[i:i + _IN_CHUNK]


def _whoami() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid()) if hasattr(os, "getuid") else "?"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


_INPUT_COLUMNS = [schema.input_file.c[name] for name in (
    "id", "campaign_id", "path", "size", "checksum", "checksum_algo", "state", "attempts", "last_reason",
    "claim_token", "last_submission_id", "job_index", "events", "claimed_at")]


def _failure_reason(state: str, exit_code: Optional[int], signal: Optional[int], reason: Optional[str]) -> str:
    text = state
    if exit_code is not None:
        text += f" exit {exit_code}" + (f" signal {signal}" if signal else "")
    if reason and reason not in ("None", "none"):
        text += f": {reason}"
    return text


def _all_null(column: Any, values: List[Any]) -> bool:
    """No row gives this column a value, and the column has no default of its own."""
    if column.default is not None or column.server_default is not None or column.primary_key:
        return False
    return values.count(None) == len(values)


def _bind(column_type: Any, dialect: Any) -> Optional[Callable[[Any], Any]]:
    """A column's conversion to what the driver stores; on SQLite a datetime is made the text
    sqlite3's own adapter would make of it (``isoformat(" ")``), once per distinct value, not per row."""
    convert = column_type.bind_processor(dialect)
    if dialect.name != "sqlite" or not isinstance(column_type, (DateTime, TypeDecorator)):
        return convert

    def text(value: Any) -> Any:
        value = convert(value) if convert is not None else value
        return value.isoformat(" ") if isinstance(value, dt.datetime) else value
    return text


class StoreBase:
    """A campaign state database. Open with :meth:`open`; every method is one transaction."""

    def __init__(self, engine: Engine, location: str):
        self.engine = engine
        self.location = location
        self.fences: Dict[str, Lease] = {}   # leases this store's writes must still hold (fence.py)
        # the manifests whose inputs this process registered already (operate's register is idempotent, but at
        # 10^5 inputs it reads the whole job list: a supervisor does it once, not every round)
        self.registered: Set[Tuple[str, ...]] = set()
        self.memo: Optional[Dict[Tuple[str, int], Dict[str, int]]] = None   # counts kept within a round (queries.py)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Database errors become StateStoreError naming the database, with the driver's words."""
        try:
            yield
        except IntegrityError as exc:
            raise StateStoreError(f"{self.location}: the state database refused the change: {exc.orig}") from exc
        except DBAPIError as exc:
            if outage.is_outage(self.engine.dialect.name, exc):
                raise StoreUnreachable(self.location, exc) from exc
            hint = ""
            if "locked" in str(exc.orig).lower():
                hint = (" (another hpcrun process held the lock for longer than the busy timeout; "
                        "try again when it has finished)")
            raise StateStoreError(f"{self.location}: {exc.orig}{hint}") from exc

    @contextmanager
    def _write(self, inputs: bool = True) -> Iterator[Connection]:
        """One write transaction (``inputs``: it may change inputs or submissions, so counts kept within a
        round are read again; a lease, the campaign's row or an audit line does not)."""
        if self.memo and inputs:
            self.memo = {}
        with self._guard(), self.engine.begin() as conn:
            for lease in self.fences.values():
                check_fence(conn, lease, self.location)
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._guard(), self.engine.connect() as conn:
            conn.execution_options(hpcrun_read_only=True)
            with conn.begin():
                yield conn

    @staticmethod
    def _rows_in(conn: Connection, query: Select[Any], column: ColumnElement[Any],
                 values: Sequence[Any]) -> List[Any]:
        """Run ``query`` restricted to ``column IN values`` in chunks small enough for every backend."""
        rows: List[Any] = []
        for chunk in _chunks(values):
            rows.extend(conn.execute(query.where(column.in_(chunk))).all())
        return rows

    @staticmethod
    def _insert_many(conn: Connection, table: Any, rows: List[Dict[str, Any]]) -> None:
        """Insert many rows (dicts of one shape) through the driver's own executemany."""
        StoreBase._insert_columns(conn, table, {k: [r[k] for r in rows] for k in rows[0]})

    @staticmethod
    def _insert_columns(conn: Connection, table: Any, columns: Dict[str, List[Any]]) -> None:
        """Insert rows given column by column through the driver's own executemany, after binding each
        value once.

        SQLAlchemy's executemany processes every parameter of every row in Python; a status
        poll of a large campaign inserts 100k observations at once, where that costs seconds.
        The statement is still compiled by SQLAlchemy for the dialect (placeholders, quoting).
        A column no row fills is left out (a start has no exit code): NULL is what it gets anyway.
        """
        keys = [k for k, values in columns.items() if not _all_null(table.c[k], values)]
        compiled = insert(table).values({k: bindparam(k) for k in keys}).compile(dialect=conn.dialect)
        order = list(compiled.positiontup or keys)
        bound = []
        for k in order:  # column by column; a value repeated down a column (a timestamp) is bound once
            values = columns[k]
            convert = _bind(table.c[k].type, conn.dialect)
            if convert is not None:
                memo: Dict[Any, Any] = {}
                values = [v if v is None else memo[v] if v in memo else memo.setdefault(v, convert(v))
                          for v in values]
            bound.append(values)
        params: Any = list(zip(*bound))
        if compiled.positiontup is None:  # named paramstyle (pyformat: psycopg)
            params = [dict(zip(order, p)) for p in params]
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        base_error = conn.dialect.loaded_dbapi.Error
        try:
            cursor.executemany(str(compiled), params)
        except base_error as exc:  # the driver's error, wrapped as SQLAlchemy would (so _guard words it)
            raise DBAPIError.instance(str(compiled), None, exc, base_error) from exc
        finally:
            cursor.close()

    @staticmethod
    def _insert_ids(conn: Connection, table: Any, rows: List[Dict[str, Any]]) -> List[int]:
        """Insert many rows and return their new ids in order (one statement where the backend allows)."""
        if not rows:
            return []
        if conn.dialect.insert_executemany_returning_sort_by_parameter_order:
            result = conn.execute(insert(table).returning(table.c.id, sort_by_parameter_order=True), rows)
            return [int(r[0]) for r in result.all()]
        ids = []  # MySQL: no RETURNING
        for row in rows:
            pk = conn.execute(insert(table), row).inserted_primary_key
            assert pk is not None
            ids.append(int(pk[0]))
        return ids

    def schema_version(self) -> int:
        with self._read() as conn:
            return schema.current_version(conn)
