"""The goodput-fair allocator (allocator = true): finish-time fairness, water-filled victims, fair grow order."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from slurm_elastic.policy import Action, Decision, ElasticUnit, JobUtilization, Reason, decide
from slurm_elastic.policy.allocator import pending_rho, victim_limit
from slurm_elastic.policy.fairness import SpeedModel, fairness_value, finish_fairness
from slurm_elastic.slurm.model import Job, Node
from tests.unit.policy_builders import NOW, cfg, job, make_input, node, pending, unit, util


def _run(units: list[ElasticUnit], all_nodes: list[Node], pend: list[Job], *,
         utils: list[JobUtilization] | None = None, **cfg_values: Any) -> dict[int, Decision]:
    cfg_values.setdefault("shrink_to_admit", True)
    utils = utils if utils is not None else [util(u.unit_id, 60) for u in units]
    inp = make_input(units, all_nodes, pending_jobs=pend, utils=utils)
    return {d.unit_id: d for d in decide(inp, cfg(**cfg_values), NOW)}


def _busy(*names: str) -> list[Node]:
    return [node(n, used=4) for n in names]


def _four(uid: int, first: int, **kw: Any) -> ElasticUnit:
    names = tuple(f"n{i}" for i in range(first, first + 4))
    return unit(job(uid, nodes=names, priority=10, **kw))


def test_the_linear_sync_model_is_linear_at_full_utilization_and_slower_below() -> None:
    full = SpeedModel(base=4, util=1.0)
    assert [round(full.speed(n), 6) for n in (1, 2, 4, 8)] == [0.25, 0.5, 1.0, 2.0]
    half = SpeedModel(base=4, util=0.5)
    assert half.speed(8) < 2.0 and half.speed(2) > 0.5 and half.speed(4) == pytest.approx(1.0)
    assert half.source == "utilization model"


def test_measured_throughput_is_interpolated_and_never_extrapolated_above_linear() -> None:
    m = SpeedModel(base=2, util=0.9, points=((1, 10.0), (2, 18.0), (4, 30.0)))
    assert m.source == "throughput"
    assert m.speed(3) == pytest.approx(24.0 / 18.0)
    assert m.speed(8) == pytest.approx((30.0 + 6.0 * 4) / 18.0)  # the last step's slope, 6 per node
    assert m.speed(1) == pytest.approx(10.0 / 18.0)


def test_rho_is_one_on_the_rigid_pace_above_one_when_shrunk_below_one_when_grown() -> None:
    u = _four(100, 1)  # submitted 2 h ago, started 1 h ago, no time limit: 1 h assumed left
    f = finish_fairness(u, SpeedModel(base=4, util=1.0), NOW, restart_s=60.0)
    assert f is not None and f.rho == pytest.approx(1.0)
    assert f.rho_at(3) > 1.0 > f.rho_at(5)
    shrunk = replace(u, requested_nodes=8, attained_gpu_s=4 * 4 * 3600.0)  # asked for 8, ran on 4 all along
    g = finish_fairness(shrunk, SpeedModel(base=4, util=1.0), NOW, restart_s=60.0)
    assert g is not None and g.rho > 1.3


def test_a_waiting_job_counts_every_minute_against_a_rigid_start_at_once() -> None:
    fresh = pending(900, time_limit_min=60)  # submitted 2 h ago
    assert pending_rho(fresh, NOW) == pytest.approx(3.0)
    assert victim_limit(fresh, NOW, 1.2) == pytest.approx(3.0) and victim_limit(fresh, NOW, 4.0) == 4.0
    assert fairness_value(0.5, -0.5) < fairness_value(1.0, -0.5) < 0
    assert fairness_value(0.0, -0.5) == float("-inf")


def test_an_arrival_takes_one_node_from_each_of_three_units_not_three_from_one() -> None:
    units = [_four(100, 1), _four(101, 5), _four(102, 9)]
    all_nodes = _busy(*(f"n{i}" for i in range(1, 13)))
    walk = _run(units, all_nodes, [pending(900, count=3, priority=100)])
    assert [walk[u].target_nodes for u in (100, 101, 102)] == [1, 4, 4]  # the rule walk strips one unit
    fair = _run(units, all_nodes, [pending(900, count=3, priority=100)], allocator=True)
    assert [fair[u].target_nodes for u in (100, 101, 102)] == [3, 3, 3]
    for d in fair.values():
        assert (d.action, d.reason) == (Action.SHRINK, Reason.SHRINK_TO_ADMIT)
        assert d.inputs["rho"] == pytest.approx(1.0) and 1.0 < float(d.inputs["rho_after_shrink"] or 0) < 1.2


def test_no_victim_is_taken_past_fairness_max_rho_or_the_waiting_jobs_own_rho() -> None:
    units = [_four(100, 1)]
    all_nodes = _busy("n1", "n2", "n3", "n4")
    # at 60% utilization 4 -> 2 nodes puts its rho at ~1.14, 4 -> 1 at ~1.5
    long_run = {"priority": 100, "time_limit_min": 600}  # waited 2 h for a 10 h run: its own rho is 1.2
    assert _run(units, all_nodes, [pending(900, count=2, **long_run)], allocator=True)[100].target_nodes == 2
    held = _run(units, all_nodes, [pending(900, count=3, **long_run)], allocator=True)[100]
    assert held.action is Action.HOLD
    taken = _run(units, all_nodes, [pending(900, count=3, **long_run)], allocator=True, fairness_max_rho=2.0)
    assert taken[100].target_nodes == 1
    # waited 2 h for a 1 h run: its rho (3.0) is worse than the victim's at one node, which may then go there
    short_run = {"priority": 100, "time_limit_min": 60}
    assert _run(units, all_nodes, [pending(900, count=3, **short_run)], allocator=True)[100].target_nodes == 1


def test_a_unit_behind_its_rigid_pace_gets_the_spare_node_first() -> None:
    ahead = unit(job(100, nodes=("n1",), priority=50), max_nodes=4)
    behind = replace(unit(job(101, nodes=("n2",), priority=10), max_nodes=4),
                     requested_nodes=2, attained_gpu_s=4 * 3600.0)  # asked for 2 nodes, ran on 1
    all_nodes = [*_busy("n1", "n2"), node("f1")]
    utils = [util(100, 99), util(101, 99)]
    got = _run([ahead, behind], all_nodes, [], utils=utils, allocator=True, speedup_growth=True)
    assert got[101].action is Action.GROW and got[100].action is Action.HOLD
    assert float(got[101].inputs["rho"] or 0) > 1.3 and got[100].inputs["rho"] == pytest.approx(1.0)
    walk = _run([ahead, behind], all_nodes, [], utils=utils, speedup_growth=True)
    assert walk[101].action is Action.HOLD  # the walk ranks grows by priority / seconds saved alone


def test_two_arrivals_in_one_cycle_keep_filling_from_the_lowest_rho() -> None:
    units = [_four(100, 1), _four(101, 5), _four(102, 9)]
    all_nodes = _busy(*(f"n{i}" for i in range(1, 13)))
    arrivals = [pending(900, count=2, priority=100), pending(901, count=2, priority=90)]
    got = _run(units, all_nodes, arrivals, allocator=True)
    # 900 takes one node each from 100 and 101; 901 then one from 102 (lowest rho after a shrink) and, all
    # three at the same rho again, one more from the lowest unit id
    assert [got[u].target_nodes for u in (100, 101, 102)] == [2, 3, 3]
    assert got[100].shrink is not None and set(got[100].shrink.admits) == {900, 901}
    # a victim of priority at or above a waiting job's gives it nothing (the walk's rule, kept)
    high = [replace(units[0], job=replace(units[0].job, priority=95)), units[1], units[2]]
    got = _run(high, all_nodes, arrivals, allocator=True)
    assert got[100].shrink is not None and got[100].shrink.admits == (900,) and got[100].target_nodes == 3


def test_a_job_of_two_partitions_takes_from_the_victims_of_both() -> None:
    a = unit(job(100, nodes=("a1", "a2", "a3", "a4"), priority=10, partition="a"))
    b = unit(job(101, nodes=("b1", "b2", "b3", "b4"), priority=10, partition="b"))
    all_nodes = [node(f"{p}{i}", used=4, partitions=(p,)) for p in "ab" for i in range(1, 5)]
    got = _run([a, b], all_nodes, [pending(900, count=2, priority=100, partition="a,b")], allocator=True)
    assert [got[u].target_nodes for u in (100, 101)] == [3, 3]
    assert got[100].shrink is not None and got[100].shrink.released_nodes == ("a4",)
