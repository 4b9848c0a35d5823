"""Session fixture: bring the real test cluster up once (or reuse a running one) and wait for idle nodes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.agents_harness import Agents, running_agents
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


@pytest.fixture(scope="module")
def agents(cluster: TestCluster, request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    """One real agent per node over virtual GPUs, sampling every second (4 s window), for a test module."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    with running_agents(cluster, tmp_path_factory.mktemp(f"{name}-agents"), interval_s=1.0, window_s=4) as a:
        yield a


@pytest.fixture
def stack(agents: Agents, clean_cluster: TestCluster) -> Agents:
    """The module's agents on a cluster with no jobs before and after the test."""
    return agents


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
