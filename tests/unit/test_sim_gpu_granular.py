"""GPU-granular growth in the simulator: the cluster's partial-node bookkeeping, the engine's GPU-granular grow
(ResizeRequest.gpus) and the production policy driving it through the adapter (gpu_granular_growth)."""

from __future__ import annotations

import pytest

from slurm_elastic.policy import parse_config
from slurm_elastic.sim.cluster import Cluster, shape_of
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.engine import Simulation
from slurm_elastic.sim.errors import SimulationError
from slurm_elastic.sim.invariants import check_invariants
from slurm_elastic.sim.policy_adapter import ProductionPolicy
from tests.policy_text import SIM_ADMIT, policy_text

from .simhelpers import LinearPerf, job


def test_partial_node_prefers_the_asked_node_never_an_excluded_one_else_the_best_fit() -> None:
    c = Cluster(4, 4)
    c.take(((0, 4), (1, 2), (2, 3)))  # free: 0, 2, 1, 4
    assert c.partial_node(2, 1) == 1
    assert c.partial_node(1, None) == 2  # best fit among partly used nodes: node 2 (1 free), not the idle node 3
    assert c.partial_node(1, 1, exclude={1, 2}) is None  # a whole free node is no partial node
    assert c.partial_node(3, None) is None


def test_a_node_twice_in_one_allocation_is_checked_as_a_whole() -> None:
    c = Cluster(2, 4)
    with pytest.raises(SimulationError, match="cannot take 6"):
        c.take(((0, 4), (0, 2)))
    assert c.free == [4, 4]
    assert shape_of(((0, 2), (1, 2), (0, 1))) == (3, 2)


def _run(granular: bool) -> tuple[list[tuple[float, str, int, int]], list[int], float]:
    """A (4 GPUs, 50% busy, grows above 40%) on node 0; B holds 2 of node 1's GPUs until ~660 s."""
    config = SimConfig(2, 4, scheduler="fifo")
    jobs = [job("A", 0.0, 4), job("B", 0.0, 2)]
    perf = {"A": LinearPerf(20_000.0, 4), "B": LinearPerf(600.0, 2)}
    text = policy_text(SIM_ADMIT, scale_up_above=40, gpu_granular_growth=granular)
    result = Simulation(config, jobs, perf, policy=ProductionPolicy(parse_config(text), config)).run()
    assert check_invariants(result, 2) == []
    a = next(r for r in result.jobs if r.job_id == "A")
    b = next(r for r in result.jobs if r.job_id == "B")
    steps = [(o.time, o.job_id, o.from_nodes, o.target_nodes) for o in result.resizes if o.result == "applied"]
    return steps, list(a.gpus_seen), b.end_time


def test_the_policy_grows_a_job_by_the_free_gpus_of_a_shared_node() -> None:
    steps, gpus, b_end = _run(True)
    first = steps[0]
    assert first[1:] == ("A", 1, 2) and first[0] < b_end  # grown while B still held half of node 1
    assert gpus[:2] == [4, 6]  # +2 GPUs, not a whole node


def test_without_the_key_the_job_waits_for_a_whole_node() -> None:
    steps, gpus, b_end = _run(False)
    assert steps and steps[0][1:] == ("A", 1, 2) and steps[0][0] > b_end
    assert gpus[:2] == [4, 8]
