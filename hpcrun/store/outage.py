"""Whether an error of the state store is an outage (the server or its filesystem away for now) or a refusal an
operator must fix. The supervisor waits an outage out (operate/supervision/store_outage.py); a command such as
``status`` says so in one line and exits 75 (EX_TEMPFAIL: try again later)."""

from __future__ import annotations

import errno
from typing import Optional

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

# a server's answer that is a refusal, not an outage: waiting would not change it (the driver's words)
REFUSALS = ("password authentication failed", "no pg_hba.conf entry", "does not exist", "permission denied",
            "authentication failed", "too many connections for role", "sslmode value")
# SQLite on a network filesystem during its server's failover (the driver's words): an outage, never corruption
SQLITE_OUTAGES = ("disk i/o error", "unable to open database file", "database is locked", "locking protocol")
# ... and what a network filesystem's client says meanwhile of a file of the store, its lock or the plan directory
FS_OUTAGES = {errno.EIO, errno.ENOTCONN, errno.ESTALE, errno.ETIMEDOUT, errno.EHOSTDOWN, errno.EHOSTUNREACH,
              errno.ECONNABORTED, errno.ECONNRESET}


def is_outage(dialect: str, exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the store cannot be reached now, as opposed to a refusal."""
    seen: Optional[BaseException] = exc
    while seen is not None:
        if isinstance(seen, DBAPIError):
            words = str(seen.orig).lower()
            if dialect == "sqlite":
                return any(w in words for w in SQLITE_OUTAGES)
            if any(w in words for w in REFUSALS):
                return False
            return bool(seen.connection_invalidated or isinstance(seen, (OperationalError, InterfaceError)))
        if isinstance(seen, OSError):
            return seen.errno in FS_OUTAGES
        seen = seen.__cause__ or seen.__context__
    return False


def first_line(exc: BaseException) -> str:
    """The driver's first line (psycopg adds a hint on a second)."""
    text = str(getattr(exc, "orig", None) or exc)
    return (text.strip().splitlines() or [type(exc).__name__])[0][:200]
