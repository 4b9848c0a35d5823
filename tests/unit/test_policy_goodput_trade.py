"""Goodput trades (policy/goodput_trade.py): what a unit's last node is worth, victims by it, and node moves."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from slurm_elastic.controller.hold_filter import BANDED_INPUTS, VOLATILE_INPUTS
from slurm_elastic.policy import Action, Basis, Decision, Reason, decide
from slurm_elastic.policy.goodput_trade import loss_s, model_slowdown
from slurm_elastic.policy.speedup import model_speedup
from tests.unit.policy_builders import NOW, cfg, job, make_input, nodes, pending, tput, unit, util


@pytest.mark.parametrize(
    ("util_pct", "n", "expected"),
    [
        (100, 2, 2.0),  # all compute: half the nodes, twice the step
        (50, 2, 0.5 * 2 + 0.5 * 0.5),
        (20, 4, 0.2 * 4 / 3 + 0.8 * 3 / 4),  # mostly sync: faster on one node fewer
    ],
)
def test_linear_sync_model_one_node_down(util_pct: float, n: int, expected: float) -> None:
    assert model_slowdown(util_pct, n) == pytest.approx(expected)
    assert model_slowdown(util_pct, 1) == float("inf")


def test_the_slowdown_is_the_inverse_of_growing_back() -> None:
    # from n - 1 to n the model reads the utilization at n - 1; the same step time ratio both ways at full use
    assert model_slowdown(100, 3) == pytest.approx(model_speedup(100, 2, 1))


def test_loss_is_the_added_time_plus_a_restart() -> None:
    assert loss_s(1.5, 3660, 60) == pytest.approx(3600 * 0.5 + 60)
    assert loss_s(0.9, 3660, 60) == pytest.approx(-3600 * 0.1 + 60)  # a node that slows the job down
    assert loss_s(1.5, None, 60) is None
    assert loss_s(1.5, 60, 60) is None  # its time limit is spent: how long it still runs is unknown


def _three(limit_a: int, limit_b: int) -> tuple[list[Any], list[Any]]:
    a = unit(job(100, nodes=("n1", "n2", "n3"), priority=10, time_limit_min=limit_a))
    b = unit(job(200, nodes=("n4", "n5", "n6"), priority=20, time_limit_min=limit_b))
    return [a, b], nodes(6, busy=[f"n{i}" for i in range(1, 7)])


def test_victim_by_goodput_takes_the_node_worth_least() -> None:
    # a: busy (95%) with 1 h left; b: 45% busy with 10 h left. Losing a node costs a ~1,690 s
    # (3,540 s x 0.458 + 60) and b ~1,560 s (35,940 s x 0.042 + 60). Priority picks a, added time at linear
    # scaling (victim_by_remaining) picks a too; the goodput loss picks b.
    units, all_nodes = _three(120, 660)
    utils = [util(100, 95), util(200, 45)]
    pend = [pending(900, count=1, priority=100)]
    inp = make_input(units, all_nodes, pending_jobs=pend, utils=utils)
    base = {"shrink_to_admit": True, "scale_up_above": 99}
    for extra, victim in (({}, 100), ({"victim_by_remaining": True}, 100), ({"victim_by_goodput": True}, 200)):
        ds = {d.unit_id: d for d in decide(inp, cfg(**base, **extra), NOW)}
        assert ds[victim].action is Action.SHRINK and ds[victim].reason is Reason.SHRINK_TO_ADMIT, extra
        assert ds[300 - victim].action is Action.HOLD, extra
    ds = {d.unit_id: d for d in decide(inp, cfg(**base, victim_by_goodput=True), NOW)}
    b = ds[200]
    assert b.inputs["last_node_source"] == "utilization model"
    assert b.inputs["last_node_slowdown"] == pytest.approx(round(model_slowdown(45, 3), 3))
    assert b.inputs["victim_loss_s"] == pytest.approx((35940 * (model_slowdown(45, 3) - 1) + 60), abs=0.1)
    assert ds[100].inputs["last_node_loss_s"] > b.inputs["victim_loss_s"]


def test_victim_by_goodput_reads_published_throughput() -> None:
    # same utilization and time left; a measured its last step as nearly linear, b as nearly flat: b loses least
    units, all_nodes = _three(660, 660)
    utils = [util(100, 70, throughput=[*tput(2, 100.0), *tput(3, 148.0)]),
             util(200, 70, throughput=[*tput(2, 100.0), *tput(3, 104.0)])]
    inp = make_input(units, all_nodes, pending_jobs=[pending(900, count=1, priority=100)], utils=utils)
    ds = {d.unit_id: d for d in decide(inp, cfg(shrink_to_admit=True, victim_by_goodput=True), NOW)}
    assert (ds[200].action, ds[100].action) == (Action.SHRINK, Action.HOLD)
    assert ds[200].inputs["last_node_source"] == "throughput"
    assert ds[200].inputs["last_node_slowdown"] == pytest.approx(1.04, abs=0.001)  # 104 / 100 samples/s


def _moves(donor_util: float, donor_limit_min: int, **kw: Any) -> dict[int, Decision]:
    # r: 1 node at 95%, its next node is worth ~13,700 s (speedup 1.74 over 32,340 s, net of a 60 s restart);
    # d: 3 nodes, not growing. No node is free.
    r = unit(job(100, nodes=("n1",), time_limit_min=600))
    d = unit(job(200, nodes=("n2", "n3", "n4"), time_limit_min=donor_limit_min))
    inp = make_input([r, d], nodes(4, busy=["n1", "n2", "n3", "n4"]), utils=[util(100, 95), util(200, donor_util)])
    kw.setdefault("speedup_growth", True)
    return {x.unit_id: x for x in decide(inp, cfg(**kw), NOW)}


def test_a_node_moves_to_where_it_saves_more() -> None:
    ds = _moves(45, 600, goodput_moves=True)
    d, r = ds[200], ds[100]
    assert (d.action, d.reason, d.target_nodes, d.basis) == (Action.SHRINK, Reason.GOODPUT_MOVE, 2, Basis.UTILIZATION)
    assert d.shrink is not None and d.shrink.released_nodes == ("n4",)
    assert d.inputs["move_to"] == r.display_id and d.inputs["move_node"] == "n4"
    assert d.inputs["move_gain_s"] > d.inputs["move_loss_s"]
    assert "gives node n4 to unit" in d.message and "slowdown 1.042, utilization model" in d.message
    assert (r.action, r.reason) == (Action.HOLD, Reason.NO_FREE_NODES)
    assert "gives it node n4 (GOODPUT_MOVE)" in r.message
    # off: both hold
    ds = _moves(45, 600)
    assert [ds[i].action for i in (100, 200)] == [Action.HOLD, Action.HOLD]


def test_no_move_when_the_donor_loses_more_than_the_grower_saves() -> None:
    # d at 80% with 20 h left: its last node is worth ~22,800 s > ~13,700 s
    ds = _moves(80, 1200, goodput_moves=True)
    assert ds[200].action is Action.HOLD and ds[200].reason is not Reason.GOODPUT_MOVE
    assert ds[200].inputs["last_node_loss_s"] > 13_000
    # with 10 h left its last node is worth ~10,800 s: it moves
    assert _moves(80, 600, goodput_moves=True)[200].reason is Reason.GOODPUT_MOVE


def test_no_move_from_a_unit_at_its_min_or_protected() -> None:
    r = unit(job(100, nodes=("n1",), time_limit_min=600))
    for d in (unit(job(200, nodes=("n2", "n3", "n4"), time_limit_min=600), min_nodes=3),
              unit(job(200, nodes=("n2", "n3", "n4"), time_limit_min=600, started_ago=60))):  # startup protection
        inp = make_input([r, d], nodes(4, busy=["n1", "n2", "n3", "n4"]), utils=[util(100, 95), util(200, 45)])
        ds = {x.unit_id: x for x in decide(inp, cfg(speedup_growth=True, goodput_moves=True), NOW)}
        assert ds[200].action is Action.HOLD and "GOODPUT_MOVE" not in ds[100].message


def test_one_move_per_unit_per_cycle() -> None:
    # two growers, one donor with plenty above its min: only the larger saving gets a node
    r1 = unit(job(100, nodes=("n1",), time_limit_min=600))
    r2 = unit(job(101, nodes=("n2",), time_limit_min=300))
    d = unit(job(200, nodes=("n3", "n4", "n5", "n6"), time_limit_min=600), max_nodes=6)
    inp = make_input([r1, r2, d], nodes(6, busy=[f"n{i}" for i in range(1, 7)]),
                     utils=[util(100, 95), util(101, 95), util(200, 40)])
    ds = {x.unit_id: x for x in decide(inp, cfg(speedup_growth=True, goodput_moves=True), NOW)}
    assert (ds[200].action, ds[200].target_nodes) == (Action.SHRINK, 3)
    assert ds[200].inputs["move_to"] == ds[100].display_id
    assert "GOODPUT_MOVE" in ds[100].message and "GOODPUT_MOVE" not in ds[101].message


def test_holds_are_not_rewritten_each_cycle_for_the_loss() -> None:
    assert "last_node_loss_s" in VOLATILE_INPUTS  # shrinks with the time left every cycle
    assert "last_node_slowdown" in BANDED_INPUTS


def test_no_move_while_a_job_waits_in_the_partition() -> None:
    # the freed node would go to the waiting job first (shrink-to-admit decides that trade); low priority, so it
    # does not reserve anything the grower could use either
    r = unit(job(100, nodes=("n1",), time_limit_min=600))
    d = unit(job(200, nodes=("n2", "n3", "n4"), time_limit_min=600))
    inp = make_input([r, d], nodes(4, busy=["n1", "n2", "n3", "n4"]), utils=[util(100, 95), util(200, 45)],
                     pending_jobs=[pending(900, count=2, priority=1)])
    ds = {x.unit_id: x for x in decide(inp, cfg(speedup_growth=True, goodput_moves=True), NOW)}
    assert ds[200].action is Action.HOLD and "GOODPUT_MOVE" not in ds[100].message


def test_no_move_from_a_unit_past_its_time_limit() -> None:
    r = unit(job(100, nodes=("n1",), time_limit_min=600))
    d = unit(job(200, nodes=("n2", "n3", "n4"), time_limit_min=60))  # started 1 h ago: nothing left
    inp = make_input([r, d], nodes(4, busy=["n1", "n2", "n3", "n4"]), utils=[util(100, 95), util(200, 45)])
    ds = {x.unit_id: x for x in decide(inp, cfg(speedup_growth=True, goodput_moves=True), NOW)}
    assert ds[200].action is Action.HOLD and ds[200].inputs["last_node_loss_s"] is None


def test_no_move_from_a_unit_at_or_below_the_size_it_asked_for() -> None:
    # moves trade what units grew into, never a job's request (measured: taking nodes below their request from the
    # long many-node jobs, one per cooldown, cost workload-6's p99 +39%)
    r = unit(job(100, nodes=("n1",), time_limit_min=600))
    for asked, moves in ((3, False), (4, False), (2, True)):
        d = replace(unit(job(200, nodes=("n2", "n3", "n4"), time_limit_min=600)), requested_nodes=asked)
        inp = make_input([r, d], nodes(4, busy=["n1", "n2", "n3", "n4"]), utils=[util(100, 95), util(200, 45)])
        ds = {x.unit_id: x for x in decide(inp, cfg(speedup_growth=True, goodput_moves=True), NOW)}
        assert (ds[200].reason is Reason.GOODPUT_MOVE) is moves, asked
