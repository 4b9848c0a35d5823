"""Grow: only onto free nodes that fit (partition, GRES per node), behind pending jobs of equal or higher
priority, keeping the reserve; one extension job per decision."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_elastic.policy import Action, Decision, ElasticUnit, Reason, decide
from slurm_elastic.slurm.model import Job, Node
from tests.unit.policy_builders import NOW, cfg, ext, job, make_input, node, nodes, pending, unit, util


def _grow(
    units: list[ElasticUnit],
    all_nodes: list[Node],
    *,
    pending_jobs: tuple[Job, ...] = (),
    mean: float = 95,
    **cfg_values: Any,
) -> dict[int, Decision]:
    inp = make_input(units, all_nodes, pending_jobs=pending_jobs, utils=[util(u.unit_id, mean) for u in units])
    return {d.unit_id: d for d in decide(inp, cfg(**cfg_values), NOW)}


def test_grow_takes_free_nodes_in_natural_order_as_one_extension_job() -> None:
    u = unit(job(100, nodes=("n1",), time_limit_min=120, started_ago=3600, account="a", qos="q", user="bob"),
             step=2, max_nodes=8)
    all_nodes = [node(f"n{i}") for i in (12, 2, 10, 1, 3)]
    all_nodes[3] = node("n1", used=4)
    d = _grow([u], all_nodes)[100]
    assert (d.action, d.reason, d.target_nodes) == (Action.GROW, Reason.OVERUTILIZED, 3)
    assert d.grow is not None
    assert d.grow.nodes == ("n2", "n3")
    assert d.grow.extension_jobs == 1
    assert (d.grow.partition, d.grow.account, d.grow.qos, d.grow.user) == ("gpu", "a", "q", "bob")
    assert d.grow.tres_per_node == "gres:gpu:4"
    assert d.grow.time_limit_s == 3600
    assert "+2 node(s): n2,n3" in d.message


@pytest.mark.parametrize(
    ("candidate", "fits"),
    [
        (node("x1"), True),
        (node("x1", partitions=("cpu",)), False),  # other partition
        (node("x1", partitions=("cpu", "gpu")), True),  # also in ours
        (node("x1", gpus=2), False),  # fewer GPUs than the job's per node
        (node("x1", gpus=8, used=4), False),  # some GPUs in use: not free
        (node("x1", state="MIXED"), True),  # a CPU-only job on it, no GPU allocated
        (node("x1", flags=("DRAIN",)), False),
        (node("x1", state="DOWN"), False),
        (node("x1", flags=("NOT_RESPONDING",)), False),
        (node("x1", flags=("COMPLETING",)), False),
        (node("x1", state="ALLOCATED", gpus=4, used=0), False),
    ],
)
def test_what_counts_as_a_free_node_that_fits(candidate: Node, fits: bool) -> None:
    u = unit(job(100, nodes=("n1",)))
    d = _grow([u], [node("n1", used=4), candidate])[100]
    assert (d.action is Action.GROW) is fits, d.message
    if not fits:
        assert d.reason is Reason.NO_FREE_NODES


def test_typed_gpus_must_match() -> None:
    u = unit(job(100, nodes=("n1",), gpu_type="h100"))
    d = _grow([u], [node("n1", used=4, gpu_type="h100"), node("a1", gpu_type="a100"), node("h2", gpu_type="h100")])
    assert d[100].grow is not None and d[100].grow.nodes == ("h2",)


def test_nodes_asked_for_by_a_pending_extension_are_not_free() -> None:
    other = unit(job(200, nodes=("n2",)), exts=[ext(700, ("n3",), state="PENDING", started_ago=900)])
    u = unit(job(100, nodes=("n1",)))
    d = _grow([u, other], nodes(4, busy=["n1", "n2"]))
    assert d[100].grow is not None and d[100].grow.nodes == ("n4",)
    assert d[200].reason is Reason.EXTENSION_PENDING


@pytest.mark.parametrize(
    ("pend", "blocks"),
    [
        (pending(900, priority=2000), True),
        (pending(900, priority=1000), True),  # equal priority: the pending job first
        (pending(900, priority=999), False),
        (pending(900, priority=2000, partition="other"), False),
        (pending(900, priority=2000, partition="other,gpu"), True),  # multi-partition job
        (pending(900, priority=2000, gpus=8), False),  # could not use a 4-GPU node
        (pending(900, priority=2000, gpus=0), True),  # a CPU job could use it
        (pending(900, priority=2000, reason="Dependency"), False),  # not waiting for nodes
        (pending(900, priority=2000, reason="JobHeldUser"), False),
        (pending(900, priority=2000, reason=None), True),  # just submitted
        (pending(900, priority=2000, count=5), True),  # does not fit entirely, still holds what it could use
    ],
)
def test_pending_jobs_of_equal_or_higher_priority_come_first(pend: Job, blocks: bool) -> None:
    u = unit(job(100, nodes=("n1",), priority=1000))
    d = _grow([u], nodes(2, busy=["n1"]), pending_jobs=(pend,))[100]
    if blocks:
        assert (d.action, d.reason) == (Action.HOLD, Reason.PENDING_HIGHER_PRIORITY), d.message
    else:
        assert d.action is Action.GROW, d.message


def test_pending_job_takes_only_what_it_needs() -> None:
    u = unit(job(100, nodes=("n1",), priority=1000))
    d = _grow([u], nodes(3, busy=["n1"]), pending_jobs=(pending(900, count=1),))[100]
    assert d.grow is not None and d.grow.nodes == ("n3",)


def test_pending_extension_jobs_never_compete() -> None:
    other = unit(job(200, nodes=("n2",)), exts=[ext(700, (), state="PENDING", count=1, started_ago=900)])
    ext_job = pending(700, priority=9999)
    u = unit(job(100, nodes=("n1",)))
    d = _grow([u, other], nodes(3, busy=["n1", "n2"]), pending_jobs=(ext_job,))
    assert d[100].action is Action.GROW


def test_higher_priority_unit_grows_first() -> None:
    low = unit(job(100, nodes=("n1",), priority=10))
    high = unit(job(200, nodes=("n2",), priority=20))
    d = _grow([low, high], nodes(3, busy=["n1", "n2"]))
    assert d[200].grow is not None and d[200].grow.nodes == ("n3",)
    assert d[100].reason is Reason.NO_FREE_NODES
    assert "went to higher-priority grows" in d[100].message


def test_reserve_limits_a_grow_partially() -> None:
    u = unit(job(100, nodes=("n1",)), step=3)
    d = _grow([u], nodes(4, busy=["n1"]), partition={"gpu": {"free_node_reserve": 1}})[100]
    assert d.action is Action.GROW and d.target_nodes == 3
    assert "+2 of 3 wanted, limited by free_node_reserve" in d.message


def test_reserve_of_an_overlapping_partition_is_kept() -> None:
    u = unit(job(100, nodes=("n1",), partition="train"))
    shared = [node("n1", used=4, partitions=("train",)), node("s1", partitions=("train", "serve"))]
    d = _grow([u], shared, partition={"serve": {"free_node_reserve": 1}})[100]
    assert d.reason is Reason.RESERVE_KEPT


def test_partial_grant_when_free_nodes_run_out() -> None:
    u = unit(job(100, nodes=("n1",)), step=3)
    d = _grow([u], nodes(2, busy=["n1"]))[100]
    assert d.target_nodes == 2 and "+1 of 3 wanted, limited by free nodes" in d.message


def test_grow_never_passes_max() -> None:
    u = unit(job(100, nodes=("n1",)), exts=[ext(500, ("n2",))], step=4, max_nodes=3)
    d = _grow([u], nodes(8, busy=["n1", "n2"]))[100]
    assert d.target_nodes == 3 and d.grow is not None and len(d.grow.nodes) == 1


def test_max_defaults_to_the_submitted_node_count() -> None:
    u = unit(job(100, nodes=("n1",)), max_nodes=None, submitted=2)
    d = _grow([u], nodes(4, busy=["n1"]))[100]
    assert d.target_nodes == 2
    u = unit(job(100, nodes=("n1",)), max_nodes=None)
    assert _grow([u], nodes(4, busy=["n1"]))[100].reason is Reason.AT_MAX


def test_no_time_limit_means_no_near_end_and_no_extension_limit() -> None:
    d = _grow([unit(job(100, nodes=("n1",)))], nodes(2, busy=["n1"]))[100]
    assert d.grow is not None and d.grow.time_limit_s is None


def test_action_cap_keeps_the_highest_priority_actions() -> None:
    units = [unit(job(100 + i, nodes=(f"n{i + 1}",), priority=p)) for i, p in enumerate([5, 50, 50, 1])]
    d = _grow(units, nodes(10, busy=["n1", "n2", "n3", "n4"]), max_actions_per_cycle=2)
    assert [d[i].action for i in (100, 101, 102, 103)] == [Action.HOLD, Action.GROW, Action.GROW, Action.HOLD]
    assert d[100].reason is Reason.ACTION_CAP and "would grow 1 -> 2 (OVERUTILIZED" in d[100].message
    assert d[100].inputs["would"] == "OVERUTILIZED"
