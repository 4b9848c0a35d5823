"""The one object every store part uses to reach the database: engine, models, clock and transactions.

``write(op)`` and ``read(op)`` are the only ways in. Each is one transaction that either commits as a whole or
raises a typed error (see :mod:`slurm_elastic.store.dberrors`); in particular an exception raised by COMMIT itself
(disk full, lost connection) reaches the caller, so no write is ever reported done unless it was committed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from slurm_elastic.store.dberrors import translated
from slurm_elastic.store.engine import BEGIN_OPTION, is_sqlite_memory, redacted
from slurm_elastic.store.errors import StoreInputError
from slurm_elastic.store.models import Models

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def require_aware(value: datetime, what: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise StoreInputError(f"{what} must be a timezone-aware datetime, got naive {value.isoformat()}")
    return value.astimezone(UTC)


class Database:
    def __init__(self, engine: Engine, models: Models, *, clock: Clock = utc_now,
                 busy_timeout_ms: int = 5000) -> None:
        self.engine = engine
        self.models = models
        self.url = redacted(engine.url)
        self.busy_timeout_ms = busy_timeout_ms
        self._clock = clock
        self._write_engine = engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
        # An in-memory SQLite database is one shared connection: serialize its users.
        self._lock: AbstractContextManager[object] = (
            threading.RLock() if is_sqlite_memory(engine.url) else nullcontext()
        )

    def now(self) -> datetime:
        return require_aware(self._clock(), "the clock's time")

    def translated(self, operation: str) -> AbstractContextManager[None]:
        return translated(operation, self.url, self.busy_timeout_ms)

    @contextmanager
    def write(self, operation: str) -> Iterator[Session]:
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite), committed when the block ends."""
        with self._lock, self.translated(operation), Session(self._write_engine, expire_on_commit=False) as s, \
                s.begin():
            yield s

    @contextmanager
    def read(self, operation: str) -> Iterator[Session]:
        """A read-only transaction, rolled back at the end."""
        with self._lock, self.translated(operation), Session(self.engine, expire_on_commit=False) as s:
            try:
                yield s
            finally:
                s.rollback()
