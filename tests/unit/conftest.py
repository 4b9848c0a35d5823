"""Fixtures shared by the store tests: a fake clock and a fresh in-memory store per test.

A test module that needs a different store (a file, other settings) defines its own ``store`` fixture, which
takes precedence over this one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slurm_elastic.store import SqlStore
from tests.unit.storehelpers import FakeClock, memory_store


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> Iterator[SqlStore]:
    st = memory_store(clock)
    yield st
    st.close()
