"""Shared by the store tests (not a test module): a fake clock and fresh stores."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from slurm_elastic.store import SqlStore, sqlite_url

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


class FakeClock:
    """Injected clock: time moves only when a test says so (never sleep-based)."""

    def __init__(self, start: datetime = T0) -> None:
        self.t = start
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.t

    def advance(self, seconds: float) -> datetime:
        with self._lock:
            self.t += timedelta(seconds=seconds)
            return self.t


def memory_store(clock: FakeClock, **kw: object) -> SqlStore:
    return SqlStore.open("sqlite://", clock=clock, **kw)  # type: ignore[arg-type]


def file_store(path: Path, clock: FakeClock, **kw: object) -> SqlStore:
    return SqlStore.open(sqlite_url(path), clock=clock, **kw)  # type: ignore[arg-type]
