"""Session fixture: bring the real test cluster up once (or reuse a running one) and wait for idle nodes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.harness import TestCluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[TestCluster]:
    c = TestCluster()
    if not c.is_up():
        c.start()
    c.cancel_all()
    c.wait_nodes_idle()
    yield c
    c.cancel_all()


@pytest.fixture
def clean_cluster(cluster: TestCluster) -> Iterator[TestCluster]:
    """The cluster with no jobs before and after the test."""
    cluster.cancel_all()
    cluster.wait_nodes_idle()
    yield cluster
    cluster.cancel_all()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
