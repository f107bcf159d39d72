"""Column types and naming shared by every version of the store's schema (hpcrun/store/sql/schema.py)."""

from __future__ import annotations

import datetime as dt
from typing import Optional

from sqlalchemy import BigInteger, DateTime, Integer
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

# Stable constraint names, so that a later migration can drop or alter them by name on
# every backend (SQLite, PostgreSQL and MySQL otherwise each invent their own).
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# 64-bit ids on servers; SQLite needs exactly INTEGER for an auto-increment rowid alias.
ID = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, on every backend.

    SQLite and MySQL DATETIME keep no zone, so values are stored as naive UTC and the
    zone is put back on read; a naive value on the way in is a bug and is refused.
    """

    impl = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")  # MySQL drops microseconds otherwise
    cache_ok = True

    def process_bind_param(self, value: Optional[dt.datetime], dialect: Dialect) -> Optional[dt.datetime]:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the state store only takes timezone-aware values")
        if value.tzinfo is not dt.timezone.utc:  # most values are UTC already: skip the conversion
            value = value.astimezone(dt.timezone.utc)
        return value.replace(tzinfo=None)

    def process_result_value(self, value: Optional[dt.datetime], dialect: Dialect) -> Optional[dt.datetime]:
        if value is None:
            return None
        if isinstance(value, str):  # pragma: no cover - only if a foreign tool wrote text
            value = dt.datetime.fromisoformat(value)
        return value.replace(tzinfo=dt.timezone.utc)
