"""Whether an error of the state store is an outage (the server or its filesystem away for now) or a refusal an
operator must fix. The supervisor waits an outage out (operate/supervision/store_outage.py); a command such as
``status`` says so in one line and exits 75 (EX_TEMPFAIL: try again later)."""

from __future__ import annotations

import errno
from typing import Optional

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

# a server's answer that is a refusal, not an outage: waiting would not change it (the driver's words)
REFUSALS = ("password authentication failed", "no pg_hba.conf entry", "does not exist", "permission denied",
            "authentication failed", "certificate verify failed", "sslmode value")
# PostgreSQL's SQLSTATE classes of an outage: connection exceptions (08), insufficient resources (53: too many
# connections, a full disk), operator intervention (57: a shutdown, a server starting up, a statement cancelled),
# transaction rollbacks (40: a deadlock or serialization failure, gone at the next try), and a write to a standby
# not yet promoted (25006). Any other (a missing table, a syntax error, a privilege) is a refusal.
OUTAGE_CLASSES = ("08", "53", "57", "40")
READ_ONLY = "25006"
# SQLite on a network filesystem during its server's failover (the driver's words): an outage, never corruption.
# ("database is locked" is another process holding the lock past the busy timeout: said as such, not waited on)
SQLITE_OUTAGES = ("disk i/o error", "unable to open database file", "locking protocol")
# ... and what a network filesystem's client says meanwhile of a file of the store, its lock or the plan directory
FS_OUTAGES = {errno.EIO, errno.ENOTCONN, errno.ESTALE, errno.ETIMEDOUT, errno.EHOSTDOWN, errno.EHOSTUNREACH,
              errno.ECONNABORTED, errno.ECONNRESET}


def is_outage(dialect: str, exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the store cannot be reached now, as opposed to a refusal."""
    seen: Optional[BaseException] = exc
    while seen is not None:
        if isinstance(seen, DBAPIError):
            return _db_outage(dialect, seen)
        if isinstance(seen, OSError):
            return seen.errno in FS_OUTAGES
        seen = seen.__cause__ or seen.__context__
    return False


def _db_outage(dialect: str, exc: DBAPIError) -> bool:
    words = str(exc.orig).lower()
    if dialect == "sqlite":
        return any(w in words for w in SQLITE_OUTAGES)
    if any(w in words for w in REFUSALS):
        return False
    state = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    if state:
        return str(state)[:2] in OUTAGE_CLASSES or state == READ_ONLY
    # no SQLSTATE: the client's own failure (refused, reset, timed out): an outage if it says it lost the server
    return bool(exc.connection_invalidated or isinstance(exc, (OperationalError, InterfaceError)))


def first_line(exc: BaseException) -> str:
    """The driver's first line (psycopg adds a hint on a second)."""
    text = str(getattr(exc, "orig", None) or exc)
    return (text.strip().splitlines() or [type(exc).__name__])[0][:200]
