"""Tables and ordered migrations of the campaign state database (SQLAlchemy Core).

The schema is written once with SQLAlchemy types so that the same definitions create
the store on SQLite, PostgreSQL and MySQL/MariaDB; no dialect-specific SQL lives here.
Every table is prefixed ``hpcrun_`` because a server database may be shared with
other applications.

Changing the schema: never edit what an existing migration creates. Add a new
``Migration`` with the next version number whose function alters the live tables
(SQLAlchemy Core DDL constructs or ``Table.create``), and update the module-level
table objects below to the new shape. ``_v1`` therefore builds its tables from a
private copy (``_v1_tables``) so that later edits to the current tables cannot
silently change what version 1 means.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    insert,
    insert_sentinel,
    select,
    text,
)
from sqlalchemy.engine import Connection

from hpcrun.store.sql.coltypes import ID, NAMING, UTCDateTime
from hpcrun.store.sql.schema_v10 import v10_columns, v10_tables
from hpcrun.store.sql.schema_v11 import v11, v11_indexes

INPUT_STATES = ("pending", "submitted", "running", "done", "failed", "parked")

def _v1_tables(md: MetaData) -> Dict[str, Table]:
    """The tables as version 1 created them (see the module docstring)."""
    tables = _v1_campaign(md) + _v1_inputs(md) + _v1_observations(md)
    return {t.name: t for t in tables}


def _v1_campaign(md: MetaData) -> Tuple[Table, ...]:
    """Version 1: the schema version, campaigns and their submissions."""
    version = Table(
        "hpcrun_schema_version", md,
        Column("version", Integer, primary_key=True, autoincrement=False),
        Column("description", String(200), nullable=False),
        Column("applied_at", UTCDateTime, nullable=False),
    )
    campaign = Table(
        "hpcrun_campaign", md,
        Column("id", ID, primary_key=True),
        Column("name", String(200), nullable=False, unique=True),
        Column("spec_digest", String(128), nullable=False),
        Column("profile_digest", String(128), nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
    )
    submission = Table(
        "hpcrun_submission", md,
        Column("id", ID, primary_key=True),
        Column("campaign_id", ID, ForeignKey("hpcrun_campaign.id", ondelete="CASCADE"), nullable=False),
        Column("job_id", String(64), nullable=False),          # "123", or the array's "123" with array_index
        Column("array_index", Integer, nullable=True),
        Column("script_path", Text, nullable=False),
        Column("script_digest", String(128), nullable=False),
        Column("submitted_at", UTCDateTime, nullable=False),
        Column("tag", String(255), nullable=False),            # job name/comment used to reconcile with the scheduler
        Column("claim_token", String(64), nullable=True),
        Column("last_state", String(32), nullable=True),       # latest job state seen, for change detection
        Column("last_observed_at", UTCDateTime, nullable=True),
        # lets SQLAlchemy return the ids of a bulk insert in order on SQLite too (one statement per
        # batch instead of one per row); filled by SQLAlchemy, meaningless afterwards
        insert_sentinel("insert_sentinel"),
        Index(None, "campaign_id", "job_id", "array_index"),
        Index(None, "tag"),
        Index(None, "claim_token"),
    )
    return version, campaign, submission


def _v1_inputs(md: MetaData) -> Tuple[Table, ...]:
    """Version 1: every input and which submissions carried it."""
    input_file = Table(
        "hpcrun_input", md,
        Column("id", ID, primary_key=True),
        Column("campaign_id", ID, ForeignKey("hpcrun_campaign.id", ondelete="CASCADE"), nullable=False),
        Column("path", Text, nullable=False),
        # sha256 of the path: the uniqueness key, because MySQL cannot index a 4 KiB path
        Column("path_key", String(64), nullable=False),
        Column("size", BigInteger, nullable=True),
        Column("checksum", String(128), nullable=True),
        Column("checksum_algo", String(16), nullable=True),
        Column("state", Enum(*INPUT_STATES, name="input_state", native_enum=False, create_constraint=True,
                             length=16, validate_strings=True), nullable=False, server_default="pending"),
        Column("attempts", Integer, nullable=False, server_default="0"),
        Column("last_reason", Text, nullable=True),
        Column("claim_token", String(64), nullable=True),
        Column("claimed_by", String(255), nullable=True),
        Column("claimed_at", UTCDateTime, nullable=True),
        Column("last_submission_id", ID, ForeignKey("hpcrun_submission.id", ondelete="SET NULL"), nullable=True),
        Column("updated_at", UTCDateTime, nullable=False),
        UniqueConstraint("campaign_id", "path_key"),
        Index(None, "campaign_id", "state"),
        Index(None, "claim_token"),
        Index(None, "last_submission_id"),
    )
    submission_input = Table(
        "hpcrun_submission_input", md,
        Column("submission_id", ID, ForeignKey("hpcrun_submission.id", ondelete="CASCADE"), primary_key=True),
        Column("input_id", ID, ForeignKey("hpcrun_input.id", ondelete="CASCADE"), primary_key=True),
        # (input, submission) rather than (input): "an input's latest submission" is then one index probe;
        # with only (input), PostgreSQL answers max(submission_id) by scanning the primary key backwards
        Index(None, "input_id", "submission_id"),
    )
    return input_file, submission_input


def _v1_observations(md: MetaData) -> Tuple[Table, ...]:
    """Version 1: what polls observed of each submission, and the QA of each output."""
    state_change = Table(
        "hpcrun_state_change", md,
        Column("id", ID, primary_key=True),
        Column("submission_id", ID, ForeignKey("hpcrun_submission.id", ondelete="CASCADE"), nullable=False),
        Column("observed_at", UTCDateTime, nullable=False),
        Column("slurm_state", String(32), nullable=False),
        Column("exit_code", Integer, nullable=True),
        Column("signal", Integer, nullable=True),
        Column("node", String(255), nullable=True),
        Column("elapsed_s", Float, nullable=True),
        Column("cpu_s", Float, nullable=True),
        Column("max_rss_bytes", BigInteger, nullable=True),
        Column("reason", Text, nullable=True),
        Index(None, "submission_id", "observed_at"),
    )
    qa_outcome = Table(
        "hpcrun_qa_outcome", md,
        Column("id", ID, primary_key=True),
        Column("input_id", ID, ForeignKey("hpcrun_input.id", ondelete="CASCADE"), nullable=False),
        Column("submission_id", ID, ForeignKey("hpcrun_submission.id", ondelete="SET NULL"), nullable=True),
        Column("output_path", Text, nullable=False),
        Column("events_in", BigInteger, nullable=True),
        Column("events_out", BigInteger, nullable=True),
        Column("passed", Boolean(create_constraint=False), nullable=False),
        Column("checked_at", UTCDateTime, nullable=False),
        Index(None, "input_id"),
    )
    return state_change, qa_outcome


def _v2_columns() -> Dict[str, Sequence[Column[Any]]]:
    """Columns version 2 adds: where an input sits in the plan, and what the accounting says of a run."""
    return {
        "hpcrun_input": (
            Column("job_index", Integer, nullable=True),       # the plan job that processes it
            Column("job_name", String(255), nullable=True),    # its name (status needs no manifest)
            Column("events", BigInteger, nullable=True),       # events in the file, when the spec gives them
        ),
        "hpcrun_state_change": (
            Column("alloc_cpus", Integer, nullable=True),
            Column("started_at", UTCDateTime, nullable=True),
            Column("ended_at", UTCDateTime, nullable=True),
        ),
    }


def _v3_finalize(md: MetaData) -> Table:
    """The table version 3 adds: the campaign-level finalize job, one row per round.

    A row is written *before* its submission (job_id still NULL), so a submitter killed between
    submitting and recording leaves a row that the next submit settles by the job's fixed name.
    """
    return Table(
        "hpcrun_finalize", md,
        Column("id", ID, primary_key=True),
        Column("campaign_id", ID, ForeignKey("hpcrun_campaign.id", ondelete="CASCADE"), nullable=False),
        Column("round", Integer, nullable=False),               # 1, then one more per --finalize-again
        Column("tag", String(255), nullable=False),              # the Slurm job name, <campaign>.finalize
        Column("after", String(8), nullable=False),              # any | ok
        Column("created_at", UTCDateTime, nullable=False),
        Column("job_id", String(64), nullable=True),             # NULL until the scheduler's answer is recorded
        Column("script_digest", String(128), nullable=True),
        Column("dependency", Text, nullable=True),               # the --dependency value given, "" for none
        Column("submitted_at", UTCDateTime, nullable=True),
        Column("last_state", String(32), nullable=True),
        Column("last_observed_at", UTCDateTime, nullable=True),
        Column("exit_code", Integer, nullable=True),
        Column("elapsed_s", Float, nullable=True),
        Column("started_at", UTCDateTime, nullable=True),
        Column("ended_at", UTCDateTime, nullable=True),
        Column("reason", Text, nullable=True),
        UniqueConstraint("campaign_id", "round"),
    )


def _v4_supervisor(md: MetaData) -> Table:
    """The table version 4 adds: the campaign's supervisor (``hpcrun run``) and its heartbeat.

    One row per campaign, rewritten by each supervisor that takes over; the OS or server lock
    decides who may run, the heartbeat tells the others (and the web view) that it is alive.
    """
    return Table(
        "hpcrun_supervisor", md,
        Column("campaign_id", ID, ForeignKey("hpcrun_campaign.id", ondelete="CASCADE"), primary_key=True),
        Column("holder", String(300), nullable=False),          # user@host:pid
        Column("started_at", UTCDateTime, nullable=False),
        Column("heartbeat_at", UTCDateTime, nullable=False),
        Column("rounds", Integer, nullable=False),
        Column("phase", String(32), nullable=False),            # running | finished | stopped
        Column("note", Text, nullable=True),                    # the last round's summary
        Column("poll_interval_s", Float, nullable=True),        # the pause it chose after that round
    )


def _v4_columns() -> Dict[str, Sequence[Column[Any]]]:
    """Columns version 4 adds: the retry policy's failure class, what each resubmission changed, requested memory."""
    return {
        "hpcrun_input": (
            Column("adjust", Text, nullable=True),             # JSON: what the next submission must change
        ),
        "hpcrun_submission": (
            Column("failure_class", String(32), nullable=True),  # set when the failure was classified
            Column("changes", Text, nullable=True),              # what this submission changed, in words
        ),
        "hpcrun_state_change": (
            Column("req_mem_bytes", BigInteger, nullable=True),  # memory the job asked for (seff's "requested")
        ),
    }


def _v5_tables(md: MetaData) -> Tuple[Table, ...]:
    """The tables version 5 adds: leases (fencing), the operators' audit trail, the pause switch.

    A lease is taken with the supervisor or submit lock and bumps its epoch; every write of the
    holder checks that the epoch is still its own, so a holder that lost its lock (its database
    session was dropped while it hung) and did not notice has its writes refused by the store.
    """
    lease = Table(
        "hpcrun_lease", md,
        Column("campaign_id", ID, ForeignKey("hpcrun_campaign.id", ondelete="CASCADE"), primary_key=True),
        Column("purpose", String(32), primary_key=True),        # supervisor | submit
        Column("epoch", Integer, nullable=False),
        Column("holder", String(300), nullable=False),          # user@host:pid
        Column("taken_at", UTCDateTime, nullable=False),
    )
    audit = Table(
        "hpcrun_audit", md,
        Column("id", ID, primary_key=True, autoincrement=True),
        Column("campaign_id", ID, ForeignKey("hpcrun_campaign.id", ondelete="CASCADE"), nullable=False, index=True),
        Column("at", UTCDateTime, nullable=False),
        Column("who", String(300), nullable=False),             # user@host:pid
        Column("command", String(64), nullable=False),          # submit, retry, cancel, pause, resume, unpark ...
        Column("detail", Text, nullable=False),                 # what it changed, in words
    )
    pause = Table(
        "hpcrun_pause", md,
        Column("campaign_id", ID, ForeignKey("hpcrun_campaign.id", ondelete="CASCADE"), primary_key=True),
        Column("by", String(300), nullable=False),
        Column("at", UTCDateTime, nullable=False),
        Column("note", Text, nullable=True),
    )
    return lease, audit, pause


def _v6_columns() -> Dict[str, Sequence[Column[Any]]]:
    """Version 6: which cluster ran each submission (job ids repeat across clusters)."""
    return {"hpcrun_submission": (Column("cluster", String(64), nullable=True),)}   # NULL: the login node's own


def _v6_health(md: MetaData) -> Table:
    """Version 6: each cluster's health as the supervisor last saw it (answering, in maintenance, since when)."""
    return Table(
        "hpcrun_cluster", md,
        Column("campaign_id", ID, ForeignKey("hpcrun_campaign.id", ondelete="CASCADE"), primary_key=True),
        Column("name", String(64), primary_key=True),           # "" for the login node's own cluster
        Column("state", String(16), nullable=False),            # up | down | maintenance
        Column("detail", Text, nullable=True),                  # the scheduler's words, the reservation
        Column("since", UTCDateTime, nullable=False),            # when it entered this state
        Column("checked_at", UTCDateTime, nullable=False),
    )


def _v7_exports(md: MetaData) -> Table:
    """Version 7: each output sent on to outputs.export (one row per input; attempts and the verdict)."""
    return Table(
        "hpcrun_export", md,
        Column("input_id", ID, ForeignKey("hpcrun_input.id", ondelete="CASCADE"), primary_key=True),
        Column("campaign_id", ID, ForeignKey("hpcrun_campaign.id", ondelete="CASCADE"), nullable=False),
        Column("source", Text, nullable=False),                  # the output on the cluster's filesystem
        Column("dest", Text, nullable=False),                    # root://... or a path
        Column("state", String(16), nullable=False),             # pending | verified | failed (given up)
        Column("attempts", Integer, nullable=False),
        Column("bytes", BigInteger, nullable=True),
        Column("checksum", String(128), nullable=True),          # adler32 of the source, as verified
        Column("seconds", Float, nullable=True),                 # the verified copy's duration
        Column("last_error", Text, nullable=True),
        Column("next_at", UTCDateTime, nullable=False),          # not before (backoff)
        Column("updated_at", UTCDateTime, nullable=False),
        Index(None, "campaign_id", "state", "next_at"),
    )


def _v8_script_texts(md: MetaData) -> Table:
    """Version 8: the exact text of each script rendered at submission, once per distinct text."""
    return Table(
        "hpcrun_script_text", md,
        Column("digest", String(64), primary_key=True),          # sha256, as the submission records it
        Column("text", Text, nullable=False),
    )


def _v9_columns() -> Dict[str, Sequence[Column[Any]]]:
    """Version 9: who asked hpcrun to cancel a submission (``hpcrun cancel``): its CANCELLED is then the
    operators' decision; any other CANCELLED came from the site and is retried."""
    return {"hpcrun_submission": (Column("cancel_requested_by", String(300), nullable=True),)}


def _v9_outages(md: MetaData) -> Table:
    """Version 9: a daemon of a cluster that did not answer (controller, accounting), since when; the row
    stays with ``ended_at`` once it answers again (a poll right after an accounting outage waits for the
    records the controller sends late)."""
    return Table(
        "hpcrun_outage", md,
        Column("campaign_id", ID, ForeignKey("hpcrun_campaign.id", ondelete="CASCADE"), primary_key=True),
        Column("cluster", String(64), primary_key=True),         # "" for the login node's own cluster
        Column("daemon", String(32), primary_key=True),          # controller | accounting
        Column("detail", Text, nullable=True),                   # the scheduler's words
        Column("since", UTCDateTime, nullable=False),
        Column("checked_at", UTCDateTime, nullable=False),
        Column("ended_at", UTCDateTime, nullable=True),          # NULL: still not answering
    )


def _current_tables(md: MetaData) -> Dict[str, Table]:
    tables = _v1_tables(md)
    for table in (_v3_finalize(md), _v4_supervisor(md), *_v5_tables(md), _v6_health(md), _v7_exports(md),
                  _v8_script_texts(md), _v9_outages(md), *v10_tables(md)):
        tables[table.name] = table
    for added in (_v2_columns(), _v4_columns(), _v6_columns(), _v9_columns(), v10_columns()):
        for name, columns in added.items():
            for column in columns:
                tables[name].append_column(column)
    Index("ix_hpcrun_input_campaign_id_job_index", tables["hpcrun_input"].c.campaign_id,
          tables["hpcrun_input"].c.job_index)
    v11_indexes(tables["hpcrun_input"])
    return tables


# The current schema, used by the queries in hpcrun/store/store.py.
metadata = MetaData(naming_convention=NAMING)
_tables = _current_tables(metadata)
schema_version = _tables["hpcrun_schema_version"]
campaign = _tables["hpcrun_campaign"]
input_file = _tables["hpcrun_input"]
submission = _tables["hpcrun_submission"]
submission_input = _tables["hpcrun_submission_input"]
state_change = _tables["hpcrun_state_change"]
qa_outcome = _tables["hpcrun_qa_outcome"]
finalize = _tables["hpcrun_finalize"]
supervisor = _tables["hpcrun_supervisor"]
lease = _tables["hpcrun_lease"]
audit = _tables["hpcrun_audit"]
pause = _tables["hpcrun_pause"]
cluster_health = _tables["hpcrun_cluster"]
export = _tables["hpcrun_export"]
script_text = _tables["hpcrun_script_text"]
outage = _tables["hpcrun_outage"]
generation = _tables["hpcrun_generation"]
provenance = _tables["hpcrun_provenance"]


@dataclass(frozen=True)
class Migration:
    """One schema step; ``apply`` runs inside the migration transaction."""

    version: int
    description: str
    apply: Callable[[Connection], Any]


def _v1(conn: Connection) -> None:
    md = MetaData(naming_convention=NAMING)
    tables = _v1_tables(md)
    md.create_all(conn, tables=[t for name, t in tables.items() if name != "hpcrun_schema_version"])


def _add_column(conn: Connection, table: str, column: Column[Any]) -> None:
    """ALTER TABLE ... ADD COLUMN with the column type compiled for this backend (nullable only)."""
    assert column.nullable, "a column added to a live table must be nullable"
    preparer = conn.dialect.identifier_preparer
    type_sql = column.type.compile(dialect=conn.dialect)
    conn.execute(text(f"ALTER TABLE {preparer.quote(table)} ADD COLUMN {preparer.quote(column.name)} {type_sql}"))


def _v2(conn: Connection) -> None:
    for table, columns in _v2_columns().items():
        for column in columns:
            _add_column(conn, table, column)
    md = MetaData(naming_convention=NAMING)
    inputs = Table("hpcrun_input", md, Column("campaign_id", Integer), Column("job_index", Integer))
    Index("ix_hpcrun_input_campaign_id_job_index", inputs.c.campaign_id, inputs.c.job_index).create(conn)


def _creates(tables: Callable[[MetaData], Sequence[Table]],
             columns: Optional[Dict[str, Sequence[Column[Any]]]] = None) -> Callable[[Connection], None]:
    """A migration that creates tables (their foreign keys refer to the campaign and input tables, which
    exist) and adds nullable columns."""
    def apply(conn: Connection) -> None:
        md = MetaData(naming_convention=NAMING)
        for name in ("hpcrun_campaign", "hpcrun_input"):   # the foreign keys' targets
            Table(name, md, Column("id", ID, primary_key=True))
        for table in tables(md):
            table.create(conn)
        for name, added in (columns or {}).items():
            for column in added:
                _add_column(conn, name, column)
    return apply


MIGRATIONS: Sequence[Migration] = (
    Migration(1, "campaign, inputs, submissions, state changes, QA outcomes", _v1),
    Migration(2, "plan job of each input, expected events; CPUs, start and end of each observation", _v2),
    Migration(3, "campaign-level finalize job (one row per round)", _creates(lambda md: [_v3_finalize(md)])),
    Migration(4, "supervisor heartbeat; failure class and changes of each attempt; requested memory",
              _creates(lambda md: [_v4_supervisor(md)], _v4_columns())),
    Migration(5, "leases (fencing epochs of the supervisor and submit locks), audit trail, pause switch",
              _creates(_v5_tables)),
    Migration(6, "the cluster of each submission; each cluster's health",
              _creates(lambda md: [_v6_health(md)], _v6_columns())),
    Migration(7, "outputs sent on to outputs.export: attempts, bytes, checksum, verdict",
              _creates(lambda md: [_v7_exports(md)])),
    Migration(8, "the exact text of scripts rendered at submission (by digest)",
              _creates(lambda md: [_v8_script_texts(md)])),
    Migration(9, "who asked to cancel each submission; daemons not answering (scheduler outages)",
              _creates(lambda md: [_v9_outages(md)], _v9_columns())),
    Migration(10, "generations of a campaign (of each input and submission); provenance of each output",
              _creates(v10_tables, v10_columns())),
    Migration(11, "indexes of inputs by state, then job or submission (a round at 10^6 inputs)", v11),
)


class SchemaTooNew(Exception):
    """The database was migrated by a newer hpcrun than this one."""

    def __init__(self, found: int, known: int):
        self.found = found
        self.known = known
        super().__init__(f"schema version {found} is newer than the {known} this hpcrun knows")


def check_migrations(migrations: Sequence[Migration]) -> int:
    """Versions must be 1, 2, 3 ... in order: a gap or a swap is a programming error."""
    for i, m in enumerate(migrations, start=1):
        if m.version != i:
            raise ValueError(f"migration #{i} has version {m.version}; versions must be 1, 2, 3 ... in order")
    return len(migrations)


def current_version(conn: Connection) -> int:
    """0 for an empty database, else the highest applied version."""
    if not conn.dialect.has_table(conn, schema_version.name):
        return 0
    return int(conn.scalar(select(func.max(schema_version.c.version))) or 0)


def migrate(conn: Connection, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Apply the missing migrations in order on ``conn``'s open transaction; return the version.

    The caller owns the transaction, so either every step and its version row commit
    together or nothing does (except on MySQL, whose DDL commits implicitly).
    """
    target = check_migrations(migrations)
    schema_version.create(conn, checkfirst=True)
    found = current_version(conn)
    if found > target:
        raise SchemaTooNew(found, target)
    for m in migrations[found:]:
        m.apply(conn)
        conn.execute(insert(schema_version).values(
            version=m.version, description=m.description[:200],
            applied_at=dt.datetime.now(dt.timezone.utc)))
    return target
