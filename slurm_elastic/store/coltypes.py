"""Column types that behave the same on SQLite, MariaDB/MySQL and PostgreSQL."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Dialect, Integer, Text, TypeDecorator
from sqlalchemy.dialects import mysql

# Surrogate keys: BIGINT everywhere except SQLite, where only "INTEGER PRIMARY KEY" is the autoincrementing rowid.
BigId = BigInteger().with_variant(Integer(), "sqlite")
# Slurm job ids are unsigned 32-bit: too big for a signed INT.
JobId = BigInteger().with_variant(Integer(), "sqlite")
# MySQL's TEXT stops at 64 KiB; policies and decision inputs may be longer.
LongText = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")


class UtcDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out; stored as naive UTC with microseconds (MySQL's DATETIME
    would otherwise round to whole seconds, which breaks lease expiry and ordering)."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


def dump_json(value: object) -> str:
    """Canonical JSON text (sorted keys, no NaN). Raises ValueError/TypeError for what JSON cannot hold."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False, default=_refuse)


def _refuse(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("NaN/Infinity")
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


class JsonText(TypeDecorator[dict[str, Any]]):
    """A JSON object stored as canonical text (portable, byte-for-byte comparable, no dialect JSON quirks)."""

    impl = LongText
    cache_ok = True

    def process_bind_param(self, value: dict[str, Any] | None, dialect: Dialect) -> str | None:
        return None if value is None else dump_json(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> dict[str, Any] | None:
        if value is None:
            return None
        loaded = json.loads(value)
        return loaded if isinstance(loaded, dict) else {"value": loaded}
