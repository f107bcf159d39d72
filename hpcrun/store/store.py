"""Campaign state store: every input's fate, every submission and every observed Slurm state.

A campaign runs for months through crashes and maintenance windows, so what has been
claimed, submitted, observed and checked must survive any interruption and be shared
safely by concurrent hpcrun processes. The default store is SQLite (WAL, foreign keys,
busy timeout) at ``<plan_dir>/state.db``; several operators can instead share a server
database given by URL (``postgresql+psycopg://...``, ``mysql+pymysql://...``). All SQL
is built with SQLAlchemy Core, so the same code runs on each.

Concurrency rule: every write runs in one transaction; on SQLite it starts with
``BEGIN IMMEDIATE`` (the write lock is taken up front, so a read-then-write such as a
claim never deadlocks or sees a stale snapshot), on servers the claim locks its rows with
``SELECT ... FOR UPDATE SKIP LOCKED``. SQLite does not queue waiting writers fairly: a
process that claims in a tight loop can starve another until it stops, so callers should
claim in batches with real work (sbatch) in between, as the submitter naturally does.

This module is the storage layer only; ``hpcrun submit``, ``status`` and ``retry`` build
on it.
"""

from __future__ import annotations

import datetime as dt
import getpass
import hashlib
import os
import re
import socket
import time
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from sqlalchemy import bindparam, create_engine, event, func, insert, select, update
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql import ColumnElement, Select

from hpcrun.errors import HpcrunError, InputError, Problem
from hpcrun.store import schema

DB_NAME = "state.db"
INPUT_STATES = schema.INPUT_STATES
DEFAULT_BUSY_TIMEOUT_S = 30.0
OVERRIDE_FLAG = "--allow-network-fs"

# SQLite's locking (and WAL's shared memory) is unsafe on these: see https://sqlite.org/faq.html#q5
NETWORK_FS_TYPES = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "ceph", "glusterfs", "afs",
    "9p", "panfs", "pvfs2", "orangefs", "dvs", "wekafs", "ncpfs", "coda", "davfs", "fuse",
})
# FUSE filesystems that are known to be local (container root filesystems)
LOCAL_FUSE_TYPES = frozenset({"fuse.fuse-overlayfs", "fuse.lxcfs"})

# Slurm job state (first word, as sacct/squeue print it) -> the input's state
SLURM_TO_INPUT = {
    **dict.fromkeys(("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"),
                    "submitted"),
    **dict.fromkeys(("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "STAGE_OUT", "SIGNALING",
                     "RESIZING"), "running"),
    "COMPLETED": "done",
    **dict.fromkeys(("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                     "PREEMPTED", "REVOKED", "LOST"), "failed"),
}

_IN_CHUNK = 900  # bound parameters per IN (...) list: below every backend's limit


class StateStoreError(HpcrunError):
    """The state database cannot be used as asked (locked, too new, inconsistent request)."""


class SchemaVersionError(StateStoreError):
    """The database was written by a newer hpcrun; older code must not touch it."""


class NetworkFilesystemWarning(UserWarning):
    """A SQLite state file on a network or parallel filesystem was used on explicit request."""


# ---------------------------------------------------------------------------------------------
# mount table: is the SQLite file on a network or parallel filesystem?


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    source: str


_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """The kernel writes space, tab, newline and backslash in mount points as octal escapes."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mount_table(text: str) -> List[Mount]:
    """Mounts from /proc/self/mountinfo or /proc/mounts text (the format is detected per line)."""
    mounts = []
    for line in text.splitlines():
        if " - " in line:  # mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
            left, right = line.split(" - ", 1)
            lf, rf = left.split(), right.split()
            if len(lf) >= 5 and rf:
                mounts.append(Mount(_unescape(lf[4]), rf[0], _unescape(rf[1]) if len(rf) > 1 else ""))
        else:  # /proc/mounts: SOURCE MOUNTPOINT FSTYPE OPTS FREQ PASSNO
            f = line.split()
            if len(f) >= 3:
                mounts.append(Mount(_unescape(f[1]), f[2], _unescape(f[0])))
    return mounts


def find_mount(path: str, mounts: Iterable[Mount]) -> Optional[Mount]:
    """The mount holding ``path``: the longest mount point that is a path prefix; the last one mounted wins."""
    best: Optional[Mount] = None
    for m in mounts:
        mp = m.mount_point.rstrip("/") or "/"
        if mp == "/" or path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) >= len(best.mount_point.rstrip("/") or "/"):
                best = m
    return best


def is_network_fs(fstype: str) -> bool:
    """True for filesystems where SQLite's POSIX locks cannot be trusted."""
    t = fstype.lower()
    if t in LOCAL_FUSE_TYPES:
        return False
    return t in NETWORK_FS_TYPES or t.startswith("fuse.") or t.split(".", 1)[0] in NETWORK_FS_TYPES


def read_mount_table() -> Optional[str]:
    """This process's mount table, or None where there is no /proc (then no check is possible)."""
    for name in ("/proc/self/mountinfo", "/proc/mounts"):
        try:
            return Path(name).read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            continue
    return None


def check_sqlite_location(db_path: Union[str, os.PathLike], *, allow_network_fs: bool = False,
                          mount_table: Optional[str] = None) -> Optional[Mount]:
    """Refuse (or, when allowed, warn about) a SQLite file on a network or parallel filesystem.

    Two hpcrun processes on different nodes would each believe they hold the lock and
    could corrupt the campaign's state, so this is an error unless explicitly overridden.
    ``mount_table`` defaults to this process's /proc/self/mountinfo.
    """
    text = read_mount_table() if mount_table is None else mount_table
    if text is None:
        return None
    mount = find_mount(os.path.realpath(os.fspath(db_path)), parse_mount_table(text))
    if mount is None or not is_network_fs(mount.fstype):
        return mount
    where = os.fspath(db_path)
    risk = (f"is on a {mount.fstype} filesystem (mounted at {mount.mount_point} from {mount.source or '?'}). "
            "SQLite's file locking is not reliable there: two hpcrun processes could both believe they hold "
            "the lock and corrupt the campaign state.")
    if not allow_network_fs:
        raise InputError([Problem(where, None, "", (
            f"{risk} Keep the plan directory on a local disk, or share the state through a server database "
            "(a postgresql+psycopg:// URL). To use this file anyway, and only if no two hpcrun processes will "
            f"ever run at once, pass {OVERRIDE_FLAG}."))])
    warnings.warn(f"{where} {risk} Using it anyway because {OVERRIDE_FLAG} was given: never run two hpcrun "
                  "processes on this campaign at once.", NetworkFilesystemWarning, stacklevel=3)
    return mount


# ---------------------------------------------------------------------------------------------
# boundary dataclasses


@dataclass(frozen=True)
class Campaign:
    id: int
    name: str
    spec_digest: str
    profile_digest: str
    created_at: dt.datetime


@dataclass(frozen=True)
class NewInput:
    """An input file to register; size and checksum may be filled in once known."""

    path: str
    size: Optional[int] = None
    checksum: Optional[str] = None
    checksum_algo: Optional[str] = None
    job_index: Optional[int] = None      # the plan job that processes it
    events: Optional[int] = None
    job_name: Optional[str] = None

    def __post_init__(self) -> None:
        if (self.checksum is None) != (self.checksum_algo is None):
            raise ValueError(f"{self.path}: checksum and checksum_algo go together")


@dataclass(frozen=True)
class InputRecord:
    id: int
    campaign_id: int
    path: str
    size: Optional[int]
    checksum: Optional[str]
    checksum_algo: Optional[str]
    state: str
    attempts: int
    last_reason: Optional[str]
    claim_token: Optional[str]
    last_submission_id: Optional[int]
    job_index: Optional[int]
    events: Optional[int]
    claimed_at: Optional[dt.datetime]


@dataclass(frozen=True)
class Claim:
    """Inputs moved from pending to submitted for one submitter; ``token`` identifies the claim."""

    token: str
    claimed_by: str
    inputs: Tuple[InputRecord, ...]

    @property
    def ids(self) -> List[int]:
        return [i.id for i in self.inputs]


@dataclass(frozen=True)
class NewSubmission:
    """One job (or one array task) that sbatch accepted, and the claimed inputs it processes."""

    job_id: str
    script_path: str
    script_digest: str
    tag: str
    input_ids: Sequence[int] = ()
    array_index: Optional[int] = None
    claim_token: Optional[str] = None
    submitted_at: Optional[dt.datetime] = None


@dataclass(frozen=True)
class NewStateChange:
    """One observation of a submission's Slurm state (from sacct or squeue)."""

    submission_id: int
    slurm_state: str
    observed_at: Optional[dt.datetime] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    node: Optional[str] = None
    elapsed_s: Optional[float] = None
    cpu_s: Optional[float] = None
    max_rss_bytes: Optional[int] = None
    reason: Optional[str] = None
    alloc_cpus: Optional[int] = None
    started_at: Optional[dt.datetime] = None
    ended_at: Optional[dt.datetime] = None


@dataclass(frozen=True)
class JobState:
    """A plan job as the store sees it (its inputs share one state)."""

    job_index: int
    state: str
    attempts: int
    last_reason: Optional[str]
    slurm_job_id: Optional[str]
    array_index: Optional[int]
    slurm_state: Optional[str]
    inputs: int
    input_bytes: Optional[int]
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    elapsed_s: Optional[float] = None
    slurm_reason: Optional[str] = None
    job_name: Optional[str] = None

    @property
    def slurm_id(self) -> Optional[str]:
        return None if self.slurm_job_id is None else slurm_task_id(self.slurm_job_id, self.array_index)


@dataclass(frozen=True)
class RunRow:
    """One submission (a Slurm job or array task) with its last observation."""

    submission_id: int
    job_id: str
    array_index: Optional[int]
    job_index: Optional[int]
    input_bytes: Optional[int]
    inputs: Optional[int]
    submitted_at: dt.datetime
    slurm_state: Optional[str]
    exit_code: Optional[int]
    signal: Optional[int]
    elapsed_s: Optional[float]
    cpu_s: Optional[float]
    alloc_cpus: Optional[int]
    max_rss_bytes: Optional[int]
    started_at: Optional[dt.datetime]
    ended_at: Optional[dt.datetime]
    node: Optional[str]
    reason: Optional[str]


@dataclass(frozen=True)
class InputRow:
    id: int
    job_index: Optional[int]
    path: str
    size: Optional[int]
    events: Optional[int]
    state: str
    attempts: int
    last_reason: Optional[str]


@dataclass(frozen=True)
class QaRow:
    input_id: int
    submission_id: Optional[int]
    events_in: Optional[int]
    events_out: Optional[int]
    passed: bool


@dataclass(frozen=True)
class ReportData:
    runs: List[RunRow]
    inputs: List[InputRow]
    qa: List[QaRow]


@dataclass(frozen=True)
class ActiveSubmission:
    id: int
    job_id: str
    array_index: Optional[int]
    last_state: Optional[str]
    submitted_at: dt.datetime
    job_index: Optional[int]
    job_name: Optional[str] = None

    @property
    def slurm_id(self) -> str:
        return slurm_task_id(self.job_id, self.array_index)


@dataclass(frozen=True)
class StateChangeRecord:
    id: int
    submission_id: int
    observed_at: dt.datetime
    slurm_state: str
    exit_code: Optional[int]
    signal: Optional[int]
    node: Optional[str]
    elapsed_s: Optional[float]
    cpu_s: Optional[float]
    max_rss_bytes: Optional[int]
    reason: Optional[str]


@dataclass(frozen=True)
class QaResult:
    input_id: int
    output_path: str
    passed: bool
    events_in: Optional[int] = None
    events_out: Optional[int] = None
    submission_id: Optional[int] = None
    checked_at: Optional[dt.datetime] = None


@dataclass(frozen=True)
class FinalizeRecord:
    """One round of the campaign's finalize job; ``job_id`` None: not (known to be) submitted yet."""

    id: int
    campaign_id: int
    round: int
    tag: str
    after: str
    created_at: dt.datetime
    job_id: Optional[str]
    script_digest: Optional[str]
    dependency: Optional[str]
    submitted_at: Optional[dt.datetime]
    last_state: Optional[str]
    last_observed_at: Optional[dt.datetime]
    exit_code: Optional[int]
    elapsed_s: Optional[float]
    started_at: Optional[dt.datetime]
    ended_at: Optional[dt.datetime]
    reason: Optional[str]


def slurm_task_id(job_id: str, array_index: Optional[int]) -> str:
    """How Slurm names a job or an array task: ``123`` or ``123_4``."""
    return job_id if array_index is None else f"{job_id}_{array_index}"


def normalize_slurm_state(state: str) -> str:
    """``cancelled by 1001`` -> ``CANCELLED``; ``CANCELLED+`` (squeue) -> ``CANCELLED``."""
    word = state.strip().split(" ", 1)[0] if state.strip() else "UNKNOWN"
    return word.rstrip("+").upper()


def parse_exit_code(text: str) -> Tuple[Optional[int], Optional[int]]:
    """sacct's ``ExitCode`` ``7:0`` -> (7, 0); anything unparsable -> (None, None)."""
    code, _, sig = text.strip().partition(":")
    try:
        return int(code), (int(sig) if sig else None)
    except ValueError:
        return None, None


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


# ---------------------------------------------------------------------------------------------
# engines


def _configure_sqlite(engine: Engine, busy_timeout_s: float, memory: bool) -> None:
    """WAL, foreign keys and a busy timeout on every connection; BEGIN IMMEDIATE for writes.

    pysqlite's own transaction handling is turned off (isolation_level None) so that
    SQLAlchemy's BEGIN is the only one and DDL is transactional too.
    """
    busy_ms = int(busy_timeout_s * 1000)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
            cur.execute("PRAGMA foreign_keys = ON")
            mode = cur.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            cur.execute("PRAGMA synchronous = NORMAL")  # durable with WAL except for the last commits on power loss
        finally:
            cur.close()
        if not memory and str(mode).lower() != "wal":
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


class StateStore:
    """A campaign state database. Open with :meth:`open`; every method is one transaction."""

    def __init__(self, engine: Engine, location: str):
        self.engine = engine
        self.location = location

    # -- opening ---------------------------------------------------------------------------

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
            check_sqlite_location(db, allow_network_fs=allow_network_fs, mount_table=mount_table)
            engine = create_engine(URL.create("sqlite", database=str(db)))
            _configure_sqlite(engine, busy_timeout_s, memory=False)
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
            url = make_url(text)
        except ArgumentError as exc:
            raise InputError([Problem(text, None, "", f"is not a database URL: {exc}")]) from None
        location = _display(url)
        try:
            if url.get_backend_name() == "sqlite":
                db = url.database or ""
                memory = db in ("", ":memory:")
                if not memory:
                    check_sqlite_location(db, allow_network_fs=allow_network_fs, mount_table=mount_table)
                engine = create_engine(url, poolclass=StaticPool) if memory else create_engine(url)
                _configure_sqlite(engine, busy_timeout_s, memory)
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

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions ----------------------------------------------------------------------

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Database errors become StateStoreError naming the database, with the driver's words."""
        try:
            yield
        except IntegrityError as exc:
            raise StateStoreError(f"{self.location}: the state database refused the change: {exc.orig}") from exc
        except DBAPIError as exc:
            hint = ""
            if "locked" in str(exc.orig).lower():
                hint = (" (another hpcrun process held the lock for longer than the busy timeout; "
                        "try again when it has finished)")
            raise StateStoreError(f"{self.location}: {exc.orig}{hint}") from exc

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self._guard(), self.engine.begin() as conn:
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
        """Insert many rows through the driver's own executemany, after binding each value once.

        SQLAlchemy's executemany processes every parameter of every row in Python; a status
        poll of a large campaign inserts 100k observations at once, where that costs seconds.
        The statement is still compiled by SQLAlchemy for the dialect (placeholders, quoting).
        """
        keys = list(rows[0])
        compiled = insert(table).values({k: bindparam(k) for k in keys}).compile(dialect=conn.dialect)
        order = list(compiled.positiontup or keys)
        columns = []
        for k in order:  # column by column; a value repeated down a column (a timestamp) is bound once
            values = [r[k] for r in rows]
            convert = table.c[k].type.bind_processor(conn.dialect)
            if convert is not None:
                memo: Dict[Any, Any] = {}
                values = [v if v is None else memo[v] if v in memo else memo.setdefault(v, convert(v))
                          for v in values]
            columns.append(values)
        params: Any = list(zip(*columns))
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

    # -- schema ----------------------------------------------------------------------------

    def schema_version(self) -> int:
        with self._read() as conn:
            return schema.current_version(conn)

    # -- campaign and inputs ---------------------------------------------------------------

    def register_campaign(self, name: str, spec_digest: str, profile_digest: str) -> Campaign:
        """Create the campaign, or return it if it exists with the same digests.

        A campaign's inputs and jobs are tied to the spec and profile it was planned with,
        so different digests under an existing name are refused rather than overwritten.
        """
        c = schema.campaign
        for _ in range(2):
            try:
                with self._write() as conn:
                    row = conn.execute(select(c).where(c.c.name == name)).first()
                    if row is None:
                        conn.execute(insert(c).values(name=name, spec_digest=spec_digest,
                                                      profile_digest=profile_digest, created_at=_now()))
                        row = conn.execute(select(c).where(c.c.name == name)).one()
                    elif (row.spec_digest, row.profile_digest) != (spec_digest, profile_digest):
                        raise StateStoreError(
                            f"{self.location}: campaign '{name}' is registered with spec digest "
                            f"{row.spec_digest[:12]} and profile digest {row.profile_digest[:12]}, but this plan "
                            f"has {spec_digest[:12]} and {profile_digest[:12]}. Its inputs and jobs belong to the "
                            "old spec: give the changed campaign a new name or plan it into a new directory.")
                    return Campaign(row.id, row.name, row.spec_digest, row.profile_digest, row.created_at)
            except StateStoreError as exc:
                if not isinstance(exc.__cause__, IntegrityError):
                    raise  # an IntegrityError here is a concurrent insert of the same name: read it again
        raise StateStoreError(f"{self.location}: campaign '{name}' could not be registered")

    def get_campaign(self, name: str) -> Campaign:
        c = schema.campaign
        with self._read() as conn:
            row = conn.execute(select(c).where(c.c.name == name)).first()
        if row is None:
            raise StateStoreError(f"{self.location}: no campaign named '{name}'")
        return Campaign(row.id, row.name, row.spec_digest, row.profile_digest, row.created_at)

    def add_inputs(self, campaign_id: int, inputs: Iterable[NewInput]) -> int:
        """Register input files in one transaction; paths already registered are skipped. Returns the number added.

        One executemany in one transaction: about 3 s for 100k inputs on SQLite on a small VM.
        """
        t = schema.input_file
        now = _now()
        rows: Dict[str, Dict[str, Any]] = {}
        for item in inputs:
            key = _path_key(item.path)
            if key not in rows:
                rows[key] = {"campaign_id": campaign_id, "path": item.path, "path_key": key, "size": item.size,
                             "checksum": item.checksum, "checksum_algo": item.checksum_algo, "state": "pending",
                             "attempts": 0, "updated_at": now, "job_index": item.job_index, "events": item.events,
                             "job_name": item.job_name}
        with self._write() as conn:
            existing = conn.execute(select(t.c.id, t.c.path_key, t.c.job_index, t.c.checksum, t.c.job_name)
                                    .where(t.c.campaign_id == campaign_id))
            moved: List[Dict[str, Any]] = []
            for iid, key, job_index, checksum, job_name in existing:
                row = rows.pop(key, None)
                # a re-plan may give a known input another job; a checksum is recorded once, when first known
                if row is not None and (row["job_index"] != job_index or row["job_name"] != job_name
                                        or (checksum is None and row["checksum"])):
                    moved.append({"b_id": iid, "b_job": row["job_index"], "b_name": row["job_name"],
                                  "b_sum": checksum or row["checksum"],
                                  "b_algo": row["checksum_algo"] if checksum is None else None})
            if moved:
                stmt = (update(t).where(t.c.id == bindparam("b_id"))
                        .values(job_index=bindparam("b_job"), job_name=bindparam("b_name"),
                                checksum=bindparam("b_sum"),
                                checksum_algo=func.coalesce(t.c.checksum_algo, bindparam("b_algo"))))
                conn.execute(stmt, moved)
            if rows:
                self._insert_many(conn, t, list(rows.values()))
        return len(rows)

    def inputs(self, campaign_id: int, states: Optional[Iterable[str]] = None,
               limit: Optional[int] = None) -> List[InputRecord]:
        t = schema.input_file
        query = select(*_INPUT_COLUMNS).where(t.c.campaign_id == campaign_id).order_by(t.c.id)
        if states is not None:
            query = query.where(t.c.state.in_(list(states)))
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return [InputRecord(*r) for r in conn.execute(query)]

    def counts_by_state(self, campaign_id: int) -> Dict[str, int]:
        """Inputs per state, every state present (zero when empty), in lifecycle order."""
        t = schema.input_file
        query = select(t.c.state, func.count()).where(t.c.campaign_id == campaign_id).group_by(t.c.state)
        with self._read() as conn:
            found = {state: int(n) for state, n in conn.execute(query)}
        return {state: found.get(state, 0) for state in INPUT_STATES}

    # -- claim and submit ------------------------------------------------------------------

    def claim_pending(self, campaign_id: int, limit: int, *, claimed_by: Optional[str] = None) -> Claim:
        """Atomically move up to ``limit`` pending inputs to submitted for this caller.

        Two processes claiming at the same time never get the same input: SQLite's
        BEGIN IMMEDIATE serializes the whole select-and-update, and on servers the
        selected rows are locked (SKIP LOCKED, so the other claimer takes the next ones).
        The claim token is to be put on the Slurm job (name or comment) so that a
        restarted submitter can reconcile a claim whose job id was never recorded.
        """
        t = schema.input_file
        token = uuid.uuid4().hex
        who = (claimed_by or _whoami())[:255]
        now = _now()
        if limit <= 0:
            return Claim(token, who, ())
        with self._write() as conn:
            ids = list(conn.scalars(
                select(t.c.id).where(t.c.campaign_id == campaign_id, t.c.state == "pending")
                .order_by(t.c.id).limit(limit).with_for_update(skip_locked=True)))
            claim = (update(t).where(t.c.state == "pending")
                     .values(state="submitted", claim_token=token, claimed_by=who, claimed_at=now,
                             last_submission_id=None, updated_at=now))
            for chunk in _chunks(ids):
                conn.execute(claim.where(t.c.id.in_(chunk)))
            rows = conn.execute(select(*_INPUT_COLUMNS).where(t.c.claim_token == token).order_by(t.c.id)).all()
        return Claim(token, who, tuple(InputRecord(*r) for r in rows))

    def release_claim(self, token: str, reason: Optional[str] = None) -> int:
        """Return a claim's inputs that never got a recorded submission to pending (e.g. sbatch refused)."""
        t = schema.input_file
        with self._write() as conn:
            result = conn.execute(
                update(t).where(t.c.claim_token == token, t.c.state == "submitted", t.c.last_submission_id.is_(None))
                .values(state="pending", claim_token=None, claimed_by=None, claimed_at=None,
                        last_reason=reason, updated_at=_now()))
            return int(result.rowcount)

    # -- plan jobs: the unit of submission -------------------------------------------------
    # Every input of a plan job is submitted in the same Slurm job, so the inputs of a job
    # always share one state; the methods below claim, retry and park whole jobs.

    def pending_jobs(self, campaign_id: int) -> List[int]:
        """Plan jobs with work neither done nor in flight, in plan order."""
        t = schema.input_file
        query = (select(t.c.job_index).where(t.c.campaign_id == campaign_id, t.c.state == "pending",
                                             t.c.job_index.is_not(None))
                 .group_by(t.c.job_index).order_by(t.c.job_index))
        with self._read() as conn:
            return [int(j) for j in conn.scalars(query)]

    def claim_jobs(self, campaign_id: int, job_indices: Sequence[int], *, claimed_by: Optional[str] = None,
                   token: Optional[str] = None) -> Claim:
        """Atomically move the pending inputs of these plan jobs to submitted under one claim token.

        Jobs another submitter claimed meanwhile are simply not in the result (the claim
        only takes rows still pending, inside one write transaction).
        """
        t = schema.input_file
        token = token or uuid.uuid4().hex
        who = (claimed_by or _whoami())[:255]
        now = _now()
        with self._write() as conn:
            # the inputs of these jobs by the (campaign, job) index, then the claim by primary key: a
            # single UPDATE ... WHERE state = 'pending' AND job_index IN (...) may be planned on the
            # (campaign, state) index and scan every pending input once per chunk
            by_job = select(t.c.id).where(t.c.campaign_id == campaign_id)
            ids: List[int] = []
            for chunk in _chunks(list(job_indices)):
                ids.extend(conn.scalars(by_job.where(t.c.job_index.in_(chunk))))
            claim = (update(t).where(t.c.state == "pending")
                     .values(state="submitted", claim_token=token, claimed_by=who, claimed_at=now,
                             last_submission_id=None, updated_at=now))
            for chunk in _chunks(ids):
                conn.execute(claim.where(t.c.id.in_(chunk)))
            rows = conn.execute(select(*_INPUT_COLUMNS).where(t.c.claim_token == token).order_by(t.c.id)).all()
        return Claim(token, who, tuple(InputRecord(*r) for r in rows))

    def unresolved_claims(self, campaign_id: int) -> List[Claim]:
        """Claims whose inputs have no recorded submission: the submitter stopped between claim and record.

        The caller must hold the campaign's submit lock (no live submitter is between the two
        steps) and settle each claim with Slurm: record the job found under its tag, or release it.
        """
        t = schema.input_file
        query = (select(t.c.claimed_by, *_INPUT_COLUMNS)
                 .where(t.c.campaign_id == campaign_id, t.c.state == "submitted",
                        t.c.last_submission_id.is_(None), t.c.claim_token.is_not(None))
                 .order_by(t.c.claim_token, t.c.id))
        claims: Dict[str, Tuple[str, List[InputRecord]]] = {}
        with self._read() as conn:
            for row in conn.execute(query):
                rec = InputRecord(*row[1:])
                assert rec.claim_token is not None
                claims.setdefault(rec.claim_token, (row[0] or "?", []))[1].append(rec)
        return [Claim(token, who, tuple(recs)) for token, (who, recs) in claims.items()]

    def requeue_failed(self, campaign_id: int, max_attempts: int, *, retry_cancelled: bool = False,
                       job_indices: Optional[Sequence[int]] = None,
                       dry_run: bool = False) -> Tuple[List[int], List[int]]:
        """Failed jobs back to pending, or parked once they used ``max_attempts``; returns (requeued, parked).

        Cancelled jobs stay failed unless ``retry_cancelled``: a cancel is usually an
        operator's decision. The reason of the last failure is kept on every input.
        """
        t, s = schema.input_file, schema.submission
        now = _now()
        query = (select(t.c.job_index, func.max(t.c.attempts), func.max(s.c.last_state), func.max(t.c.last_reason))
                 .select_from(t.outerjoin(s, s.c.id == t.c.last_submission_id))
                 .where(t.c.campaign_id == campaign_id, t.c.state == "failed", t.c.job_index.is_not(None))
                 .group_by(t.c.job_index).order_by(t.c.job_index))
        requeue: List[int] = []
        park: Dict[str, List[int]] = {}
        with self._write() as conn:
            for job_index, attempts, last_state, reason in conn.execute(query):
                if job_indices is not None and job_index not in job_indices:
                    continue
                if last_state == "CANCELLED" and not retry_cancelled:
                    continue
                if int(attempts or 0) >= max_attempts:
                    why = f"parked after {attempts} attempt(s): {reason or last_state or 'failed'}"
                    park.setdefault(why, []).append(int(job_index))
                else:
                    requeue.append(int(job_index))
            if dry_run:
                return requeue, sorted(j for jobs in park.values() for j in jobs)
            base = update(t).where(t.c.campaign_id == campaign_id, t.c.state == "failed")
            for chunk in _chunks(requeue):
                conn.execute(base.where(t.c.job_index.in_(chunk))
                             .values(state="pending", claim_token=None, claimed_by=None, claimed_at=None,
                                     updated_at=now))
            for why, jobs in park.items():
                for chunk in _chunks(jobs):
                    conn.execute(base.where(t.c.job_index.in_(chunk))
                                 .values(state="parked", last_reason=why, updated_at=now))
        return requeue, sorted(j for jobs in park.values() for j in jobs)

    def unpark(self, campaign_id: int, job_indices: Optional[Sequence[int]] = None) -> List[int]:
        """Parked jobs (all, or these) back to pending with a fresh attempt count, for a human's second try."""
        t = schema.input_file
        now = _now()
        with self._write() as conn:
            query = select(t.c.job_index).where(t.c.campaign_id == campaign_id, t.c.state == "parked").distinct()
            found = sorted(int(j) for j in conn.scalars(query) if job_indices is None or j in job_indices)
            for chunk in _chunks(found):
                conn.execute(update(t).where(t.c.campaign_id == campaign_id, t.c.state == "parked",
                                             t.c.job_index.in_(chunk))
                             .values(state="pending", attempts=0, claim_token=None, claimed_by=None,
                                     claimed_at=None, updated_at=now))
        return found

    def job_counts(self, campaign_id: int) -> Dict[str, int]:
        """Plan jobs per state, every state present (a job's inputs share one state)."""
        t = schema.input_file
        query = (select(t.c.state, func.count(t.c.job_index.distinct()))
                 .where(t.c.campaign_id == campaign_id, t.c.job_index.is_not(None)).group_by(t.c.state))
        with self._read() as conn:
            found = {state: int(n) for state, n in conn.execute(query)}
        return {state: found.get(state, 0) for state in INPUT_STATES}

    def job_states(self, campaign_id: int, states: Optional[Sequence[str]] = None) -> List[JobState]:
        """One row per plan job (or per job in ``states``): its state, attempts, last reason, latest
        submission and its last observation."""
        t, s, sc = schema.input_file, schema.submission, schema.state_change
        latest = (select(sc.c.submission_id, func.max(sc.c.id).label("change_id"))
                  .join(s, s.c.id == sc.c.submission_id).where(s.c.campaign_id == campaign_id)
                  .group_by(sc.c.submission_id).subquery())
        last = sc.alias("last_change")
        query = (select(t.c.job_index, func.min(t.c.state), func.max(t.c.attempts), func.max(t.c.last_reason),
                        func.max(s.c.job_id), func.max(s.c.array_index), func.max(s.c.last_state),
                        func.count(), func.sum(t.c.size), func.max(last.c.exit_code), func.max(last.c.signal),
                        func.max(last.c.elapsed_s), func.max(last.c.reason), func.min(t.c.job_name))
                 .select_from(t.outerjoin(s, s.c.id == t.c.last_submission_id)
                              .outerjoin(latest, latest.c.submission_id == s.c.id)
                              .outerjoin(last, last.c.id == latest.c.change_id))
                 .where(t.c.campaign_id == campaign_id, t.c.job_index.is_not(None))
                 .group_by(t.c.job_index).order_by(t.c.job_index))
        if states is not None:
            query = query.where(t.c.state.in_(list(states)))
        with self._read() as conn:
            return [JobState(int(r[0]), r[1], int(r[2] or 0), r[3], r[4], r[5], r[6], int(r[7]), r[8],
                             r[9], r[10], r[11], r[12], r[13])
                    for r in conn.execute(query)]

    def report_rows(self, campaign_id: int) -> ReportData:
        """Everything a campaign report needs, in three queries: runs, inputs and QA outcomes."""
        t, s, sc, link, qa = (schema.input_file, schema.submission, schema.state_change, schema.submission_input,
                              schema.qa_outcome)
        latest = (select(sc.c.submission_id, func.max(sc.c.id).label("change_id"))
                  .join(s, s.c.id == sc.c.submission_id).where(s.c.campaign_id == campaign_id)
                  .group_by(sc.c.submission_id).subquery())
        job_of = (select(link.c.submission_id, func.min(t.c.job_index).label("job_index"),
                         func.sum(t.c.size).label("bytes"), func.count().label("inputs"))
                  .join(t, t.c.id == link.c.input_id).where(t.c.campaign_id == campaign_id)
                  .group_by(link.c.submission_id).subquery())
        runs_q = (select(s.c.id, s.c.job_id, s.c.array_index, job_of.c.job_index, job_of.c.bytes, job_of.c.inputs,
                         s.c.submitted_at, sc.c.slurm_state, sc.c.exit_code, sc.c.signal, sc.c.elapsed_s, sc.c.cpu_s,
                         sc.c.alloc_cpus, sc.c.max_rss_bytes, sc.c.started_at, sc.c.ended_at, sc.c.node, sc.c.reason)
                  .select_from(s.outerjoin(latest, latest.c.submission_id == s.c.id)
                               .outerjoin(sc, sc.c.id == latest.c.change_id)
                               .outerjoin(job_of, job_of.c.submission_id == s.c.id))
                  .where(s.c.campaign_id == campaign_id).order_by(s.c.id))
        inputs_q = (select(t.c.id, t.c.job_index, t.c.path, t.c.size, t.c.events, t.c.state, t.c.attempts,
                           t.c.last_reason).where(t.c.campaign_id == campaign_id).order_by(t.c.id))
        qa_q = (select(qa.c.input_id, qa.c.submission_id, qa.c.events_in, qa.c.events_out, qa.c.passed)
                .join(t, t.c.id == qa.c.input_id).where(t.c.campaign_id == campaign_id).order_by(qa.c.id))
        with self._read() as conn:
            runs = [RunRow(*list(r)) for r in conn.execute(runs_q)]
            inputs = [InputRow(*r) for r in conn.execute(inputs_q)]
            outcomes = [QaRow(*r) for r in conn.execute(qa_q)]
        return ReportData(runs, inputs, outcomes)

    def submission_inputs(self, submission_ids: Sequence[int]) -> Dict[int, List[Tuple[int, str]]]:
        """(input id, path) of each submission's inputs."""
        t, link = schema.input_file, schema.submission_input
        query = select(link.c.submission_id, t.c.id, t.c.path).join(t, t.c.id == link.c.input_id)
        out: Dict[int, List[Tuple[int, str]]] = {}
        wanted = set(submission_ids)
        with self._read() as conn:
            if len(wanted) > 5 * _IN_CHUNK:  # many (a poll where a whole campaign ended): one scan of the links
                rows: Any = (r for r in conn.execute(query) if r[0] in wanted)
            else:
                rows = self._rows_in(conn, query, link.c.submission_id, list(wanted))
            for sid, iid, path in rows:
                out.setdefault(int(sid), []).append((int(iid), path))
        return out

    def active_submissions(self, campaign_id: int) -> List[ActiveSubmission]:
        """The latest submission of every job in flight (inputs submitted or running), for a status poll."""
        t, s = schema.input_file, schema.submission
        query = (select(s.c.id, s.c.job_id, s.c.array_index, s.c.last_state, s.c.submitted_at,
                        func.min(t.c.job_index), func.min(t.c.job_name))
                 .select_from(s.join(t, t.c.last_submission_id == s.c.id))
                 .where(s.c.campaign_id == campaign_id, t.c.state.in_(("submitted", "running")))
                 .group_by(s.c.id, s.c.job_id, s.c.array_index, s.c.last_state, s.c.submitted_at)
                 .order_by(s.c.id))
        with self._read() as conn:
            return [ActiveSubmission(int(r[0]), r[1], r[2], r[3], r[4], r[5], r[6]) for r in conn.execute(query)]

    def record_submission(self, campaign_id: int, sub: NewSubmission) -> int:
        return self.record_submissions(campaign_id, [sub])[0]

    def record_submissions(self, campaign_id: int, subs: Sequence[NewSubmission]) -> List[int]:
        """Record accepted jobs or array tasks and link each to its claimed inputs, in one transaction.

        Every linked input must be claimed (state submitted, no submission yet, and the
        submission's claim token if it names one): recording unclaimed work would let two
        submitters run the same file.
        """
        t, s, link = schema.input_file, schema.submission, schema.submission_input
        now = _now()
        owner: Dict[int, NewSubmission] = {}
        for sub in subs:
            for iid in sub.input_ids:
                if iid in owner:
                    raise StateStoreError(f"{self.location}: input {iid} is in two submissions "
                                          f"({owner[iid].job_id} and {sub.job_id})")
                owner[iid] = sub
        with self._write() as conn:
            bad = self._not_claimed(conn, campaign_id, owner)
            if bad:
                raise StateStoreError(
                    f"{self.location}: inputs {sorted(bad)[:10]}{' ...' if len(bad) > 10 else ''} are not claimed "
                    f"for this submission in campaign {campaign_id} (claim them with claim_pending first)")
            rows = [{"campaign_id": campaign_id, "job_id": sub.job_id, "array_index": sub.array_index,
                     "script_path": sub.script_path, "script_digest": sub.script_digest,
                     "submitted_at": sub.submitted_at or now, "tag": sub.tag, "claim_token": sub.claim_token}
                    for sub in subs]
            ids = self._insert_claimed(conn, campaign_id, rows) or self._insert_ids(conn, s, rows)
            links = [{"submission_id": sid, "input_id": iid} for sid, sub in zip(ids, subs) for iid in sub.input_ids]
            if links:
                self._insert_many(conn, link, links)
                # each input's new submission is the one just linked: set it in set-based chunks, not row by row
                newest = (select(func.max(link.c.submission_id)).where(link.c.input_id == t.c.id)
                          .scalar_subquery())
                attach = update(t).values(attempts=t.c.attempts + 1, last_submission_id=newest, updated_at=now)
                for chunk in _chunks(list(owner)):
                    conn.execute(attach.where(t.c.id.in_(chunk)))
        return ids

    def _insert_claimed(self, conn: Connection, campaign_id: int, rows: List[Dict[str, Any]]) -> List[int]:
        """Submissions of one claim inserted in bulk, their ids read back by (job id, array index).

        The fast path of a large array: one driver executemany and one indexed query instead of
        a RETURNING statement processed row by row. Returns [] when the rows do not qualify
        (several claims, or no claim), and the caller inserts them the general way.
        """
        s = schema.submission
        token = rows[0]["claim_token"] if rows else None
        keys = {(r["job_id"], r["array_index"]) for r in rows}
        if token is None or len(keys) != len(rows) or any(r["claim_token"] != token for r in rows):
            return []
        if conn.execute(select(s.c.id).where(s.c.claim_token == token).limit(1)).first() is not None:
            return []  # an earlier record of the same claim (a recovered job): keep the ids unambiguous
        self._insert_many(conn, s, rows)
        query = select(s.c.id, s.c.job_id, s.c.array_index).where(s.c.campaign_id == campaign_id,
                                                                   s.c.claim_token == token)
        found = {(job_id, index): int(sid) for sid, job_id, index in conn.execute(query)}
        return [found[(r["job_id"], r["array_index"])] for r in rows]

    @staticmethod
    def _not_claimed(conn: Connection, campaign_id: int, owner: Mapping[int, NewSubmission]) -> List[int]:
        """Inputs among ``owner`` that are not claimed and waiting for a submission record."""
        t = schema.input_file
        ready = select(t.c.id).where(t.c.campaign_id == campaign_id, t.c.state == "submitted",
                                     t.c.last_submission_id.is_(None))
        by_token: Dict[Optional[str], List[int]] = {}
        for iid, sub in owner.items():
            by_token.setdefault(sub.claim_token, []).append(iid)
        bad: List[int] = []
        for token, iids in by_token.items():
            if token is not None:
                # one query on the claim-token index (with the other conditions checked here: a
                # planner offered (campaign, state) too may scan every submitted input instead)
                by_claim = select(t.c.id, t.c.campaign_id, t.c.state, t.c.last_submission_id).where(
                    t.c.claim_token == token)
                ok = {i for i, camp, state, last in conn.execute(by_claim)
                      if camp == campaign_id and state == "submitted" and last is None}
            else:
                ok = set()
                for chunk in _chunks(iids):
                    ok.update(conn.scalars(ready.where(t.c.id.in_(chunk))))
            bad.extend(i for i in iids if i not in ok)
        return bad

    # -- observations ----------------------------------------------------------------------

    def record_state_change(self, campaign_id: int, change: NewStateChange) -> bool:
        return self.record_state_changes(campaign_id, [change]) == 1

    def record_state_changes(self, campaign_id: int, changes: Sequence[NewStateChange]) -> int:
        """Record observations that differ from each submission's last known state; returns how many.

        A status poll observes every job each time; only transitions are stored, so polling
        is idempotent. Inputs follow the state of their latest submission (an observation of
        an older attempt, or of an input set back to pending or parked, changes nothing).
        """
        s, sc, t, camp = schema.submission, schema.state_change, schema.input_file, schema.campaign
        if not changes:
            return 0
        now = _now()
        with self._write() as conn:
            # status writers of one campaign take turns (the campaign row is their lock on servers; SQLite's
            # BEGIN IMMEDIATE already serializes), so two pollers cannot both record the same transition.
            # key_share: PostgreSQL's FOR NO KEY UPDATE, which does not block submitters' foreign-key checks
            lock = select(camp.c.id).where(camp.c.id == campaign_id).with_for_update(key_share=True)
            if conn.execute(lock).first() is None:
                raise StateStoreError(f"{self.location}: no campaign with id {campaign_id}")
            sub_ids = sorted({c.submission_id for c in changes})
            known = select(s.c.id, s.c.last_state).where(s.c.campaign_id == campaign_id)
            if len(sub_ids) > 5 * _IN_CHUNK:  # a whole-campaign poll: one scan beats many IN lists
                rows_found: List[Any] = list(conn.execute(known))
            else:
                rows_found = self._rows_in(conn, known, s.c.id, sub_ids)
            last: Dict[int, Optional[str]] = {r[0]: r[1] for r in rows_found}
            missing = [i for i in sub_ids if i not in last]
            if missing:
                raise StateStoreError(f"{self.location}: campaign {campaign_id} has no submission with id "
                                      f"{missing[:10]}{' ...' if len(missing) > 10 else ''}")
            rows: List[Dict[str, Any]] = []
            latest: Dict[int, Tuple[str, dt.datetime]] = {}
            inputs_to: Dict[int, Tuple[str, Optional[str]]] = {}
            for c in changes:
                state = normalize_slurm_state(c.slurm_state)
                if last[c.submission_id] == state:
                    continue
                last[c.submission_id] = state
                at = c.observed_at or now
                rows.append({"submission_id": c.submission_id, "observed_at": at, "slurm_state": state,
                             "exit_code": c.exit_code, "signal": c.signal, "node": c.node, "elapsed_s": c.elapsed_s,
                             "cpu_s": c.cpu_s, "max_rss_bytes": c.max_rss_bytes, "reason": c.reason,
                             "alloc_cpus": c.alloc_cpus, "started_at": c.started_at, "ended_at": c.ended_at})
                latest[c.submission_id] = (state, at)
                target = SLURM_TO_INPUT.get(state)
                if target is not None:
                    why = _failure_reason(state, c.exit_code, c.signal, c.reason) if target == "failed" else None
                    inputs_to[c.submission_id] = (target, why)
            if not rows:
                return 0
            self._insert_many(conn, sc, rows)
            # one statement per (state, time) seen, not per row: a poll gives few distinct pairs
            by_state: Dict[Tuple[str, dt.datetime], List[int]] = {}
            for sid, state_at in latest.items():
                by_state.setdefault(state_at, []).append(sid)
            for (state, at), sids in by_state.items():
                for chunk in _chunks(sids):
                    conn.execute(update(s).where(s.c.id.in_(chunk)).values(last_state=state, last_observed_at=at))
            groups: Dict[Tuple[str, Optional[str]], List[int]] = {}
            for sid, target_why in inputs_to.items():
                groups.setdefault(target_why, []).append(sid)
            for (target, why), sids in groups.items():
                values: Dict[str, Any] = {"state": target, "updated_at": now}
                if target in ("done", "failed"):
                    values["last_reason"] = why
                follow = update(t).where(t.c.state != "pending", t.c.state != "parked").values(**values)
                for chunk in _chunks(sids):
                    conn.execute(follow.where(t.c.last_submission_id.in_(chunk)))
        return len(rows)

    def state_changes(self, submission_id: int) -> List[StateChangeRecord]:
        sc = schema.state_change
        query = select(sc).where(sc.c.submission_id == submission_id).order_by(sc.c.observed_at, sc.c.id)
        with self._read() as conn:
            return [StateChangeRecord(r.id, r.submission_id, r.observed_at, r.slurm_state, r.exit_code, r.signal,
                                      r.node, r.elapsed_s, r.cpu_s, r.max_rss_bytes, r.reason)
                    for r in conn.execute(query)]

    def record_qa(self, results: Sequence[QaResult]) -> List[int]:
        """Record QA outcomes per output (events in and out, pass or fail)."""
        now = _now()
        with self._write() as conn:
            return self._insert_ids(conn, schema.qa_outcome, [
                {"input_id": r.input_id, "submission_id": r.submission_id, "output_path": r.output_path,
                 "events_in": r.events_in, "events_out": r.events_out, "passed": r.passed,
                 "checked_at": r.checked_at or now} for r in results])


    # -- the campaign-level finalize job (schema version 3) ---------------------------------

    def finalize_rounds(self, campaign_id: int) -> List[FinalizeRecord]:
        """Every finalize round of the campaign, oldest first."""
        f = schema.finalize
        with self._read() as conn:
            rows = conn.execute(select(f).where(f.c.campaign_id == campaign_id).order_by(f.c.round)).all()
        return [FinalizeRecord(r.id, r.campaign_id, r.round, r.tag, r.after, r.created_at, r.job_id,
                               r.script_digest, r.dependency, r.submitted_at, r.last_state, r.last_observed_at,
                               r.exit_code, r.elapsed_s, r.started_at, r.ended_at, r.reason) for r in rows]

    def add_finalize_round(self, campaign_id: int, tag: str, after: str) -> FinalizeRecord:
        """Open the next finalize round (its row exists before its sbatch; see ``record_finalize_job``).

        Refused while the latest round has no recorded job: that round is still to be settled.
        """
        f = schema.finalize
        with self._write() as conn:
            last = conn.execute(select(f.c.round, f.c.job_id).where(f.c.campaign_id == campaign_id)
                                .order_by(f.c.round.desc()).limit(1)).first()
            if last is not None and last.job_id is None:
                raise StateStoreError(f"{self.location}: finalize round {last.round} of campaign {campaign_id} "
                                      "has no recorded job yet; settle it before opening another")
            conn.execute(insert(f).values(campaign_id=campaign_id, round=(last.round + 1) if last else 1, tag=tag,
                                          after=after, created_at=_now()))
        return self.finalize_rounds(campaign_id)[-1]

    def record_finalize_job(self, finalize_id: int, job_id: str, script_digest: Optional[str],
                            dependency: Optional[str], submitted_at: Optional[dt.datetime] = None) -> None:
        """The job sbatch accepted (or that was found under the round's name) for this round."""
        f = schema.finalize
        with self._write() as conn:
            result = conn.execute(update(f).where(f.c.id == finalize_id, f.c.job_id.is_(None)).values(
                job_id=job_id, script_digest=script_digest, dependency=dependency,
                submitted_at=submitted_at or _now(), reason=None))
            if result.rowcount != 1:
                raise StateStoreError(f"{self.location}: finalize round {finalize_id} is unknown or already has "
                                      "a job recorded")

    def note_finalize(self, finalize_id: int, reason: Optional[str]) -> None:
        """Why the round's job is not submitted (e.g. sbatch's rejection), or None to clear it."""
        f = schema.finalize
        with self._write() as conn:
            conn.execute(update(f).where(f.c.id == finalize_id).values(reason=reason))

    def record_finalize_state(self, finalize_id: int, state: str, *, exit_code: Optional[int] = None,
                              elapsed_s: Optional[float] = None, started_at: Optional[dt.datetime] = None,
                              ended_at: Optional[dt.datetime] = None, reason: Optional[str] = None,
                              observed_at: Optional[dt.datetime] = None) -> bool:
        """An observation of the round's job; stored only when something changed. Returns whether it was."""
        f = schema.finalize
        state = normalize_slurm_state(state)
        values = {"last_state": state, "exit_code": exit_code, "elapsed_s": elapsed_s, "started_at": started_at,
                  "ended_at": ended_at, "reason": reason}
        with self._write() as conn:
            row = conn.execute(select(f).where(f.c.id == finalize_id)).first()
            if row is None:
                raise StateStoreError(f"{self.location}: no finalize round with id {finalize_id}")
            if all(getattr(row, k) == v for k, v in values.items()):
                return False
            conn.execute(update(f).where(f.c.id == finalize_id).values(last_observed_at=observed_at or _now(),
                                                                         **values))
        return True

    def in_flight_job_ids(self, campaign_id: int) -> List[str]:
        """Slurm job ids (array ids for arrays) of the latest submission of every job the store
        believes queued or running; the store may be behind Slurm, so ask squeue before relying on them."""
        t, s = schema.input_file, schema.submission
        query = (select(s.c.job_id).select_from(s.join(t, t.c.last_submission_id == s.c.id))
                 .where(s.c.campaign_id == campaign_id, t.c.state.in_(("submitted", "running"))).distinct())
        with self._read() as conn:
            ids = [str(j) for j in conn.scalars(query)]
        return sorted(ids, key=lambda j: (len(j), j))


def open_store(target: Union[str, os.PathLike], **options: Any) -> StateStore:
    """Shorthand for :meth:`StateStore.open`."""
    return StateStore.open(target, **options)

