"""Speedup-aware growth (speedup_growth): the linear-sync model, the gain, the grow/hold rule and the ranking."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_elastic.controller.hold_filter import BANDED_INPUTS, VOLATILE_INPUTS
from slurm_elastic.policy import Action, Basis, Decision, Reason, ThroughputSample, decide
from slurm_elastic.policy.config import resolve_unit
from slurm_elastic.policy.inputs import uses_goodput
from slurm_elastic.policy.speedup import efficiency_of, grow_gain, model_speedup, speedup_from_efficiency
from tests.unit.policy_builders import NOW, cfg, job, make_input, nodes, pending, tput, unit, util


@pytest.mark.parametrize(
    ("util_pct", "n", "add", "expected"),
    [
        (100, 1, 1, 2.0),  # all compute: linear
        (0, 2, 2, 0.5),  # all sync, and sync grows with the nodes: twice as slow
        (50, 1, 1, 1 / (0.25 + 1.0)),  # half the step is sync: slower on two nodes
        (80, 4, 1, 1 / (0.8 * 4 / 5 + 0.2 * 5 / 4)),
    ],
)
def test_linear_sync_model(util_pct: float, n: int, add: int, expected: float) -> None:
    assert model_speedup(util_pct, n, add) == pytest.approx(expected)


def test_constant_sync_form_for_the_bench() -> None:
    assert model_speedup(50, 1, 1, sync_growth=0) == pytest.approx(1 / 0.75)


def test_efficiency_round_trip() -> None:
    assert efficiency_of(speedup_from_efficiency(0.7, 3, 1), 3, 1) == pytest.approx(0.7)
    assert efficiency_of(model_speedup(100, 2, 2), 2, 2) == pytest.approx(1.0)
    assert efficiency_of(model_speedup(40, 1, 1), 1, 1) < 0  # a slowdown


def test_gain_is_time_saved_net_of_the_restart() -> None:
    g = grow_gain(2.0, "x", 3660, 60)
    assert g.gain_s == pytest.approx(3600 * 0.5 - 60)
    assert grow_gain(1.01, "x", 1000, 60).pays is False
    assert grow_gain(1.5, "x", None, 60).gain_s == float("inf")


def _decide(units_utils: list[tuple[int, float, list[ThroughputSample]]], *, free: int = 1,
            limit_min: int | None = 600, pending_jobs: tuple[Any, ...] = (), **kw: Any) -> dict[int, Decision]:
    busy = [f"n{i + 1}" for i in range(len(units_utils))]
    us = [unit(job(jid, nodes=(busy[i],), time_limit_min=limit_min, priority=1000), max_nodes=4)
          for i, (jid, _, _) in enumerate(units_utils)]
    utils = [util(jid, mean, throughput=tp, restart=90.0) for jid, mean, tp in units_utils]
    inp = make_input(us, nodes(len(busy) + free, busy=busy), utils=utils, pending_jobs=pending_jobs)
    kw.setdefault("speedup_growth", True)
    return {d.unit_id: d for d in decide(inp, cfg(**kw), NOW)}


def test_grows_below_the_band_when_the_next_node_pays() -> None:
    d = _decide([(100, 92, [])], scale_up_above=95, scale_down_below=20)[100]  # the band alone would hold
    assert (d.action, d.reason, d.basis) == (Action.GROW, Reason.SPEEDUP_GAIN, Basis.UTILIZATION)
    assert d.inputs["speedup_source"] == "utilization model"
    assert d.inputs["next_speedup"] == pytest.approx(round(model_speedup(92, 1, 1), 3))
    assert d.inputs["restart_cost_s"] == 90.0 and d.inputs["restart_cost.source"] == "observed"
    assert "saves" in d.message and "net of a 90s restart" in d.message


def test_off_the_band_rule_decides() -> None:
    d = _decide([(100, 92, [])], scale_up_above=95, scale_down_below=20, speedup_growth=False)[100]
    assert (d.action, d.reason) == (Action.HOLD, Reason.IN_BAND)


def test_low_efficiency_holds_even_above_the_band() -> None:
    d = _decide([(100, 85, [])], scale_up_above=50, scale_down_below=10)[100]  # model efficiency 0.38 < 0.5
    assert (d.action, d.reason) == (Action.HOLD, Reason.LOW_SPEEDUP_GAIN)
    assert "efficiency 0.38 < 0.50" in d.message


def test_near_the_end_the_restart_eats_the_gain() -> None:
    d = _decide([(100, 95, [])], limit_min=63, min_remaining_for_grow_s=0)[100]  # ~180 s left of a 63 min limit
    assert (d.action, d.reason) == (Action.HOLD, Reason.LOW_SPEEDUP_GAIN)
    assert "<= 0" in d.message


def test_published_throughput_wins_over_the_model() -> None:
    # utilization says near-linear, but the measured last step was poor: throughput decides
    samples = tput(1, 100.0, age=3500) + tput(2, 120.0)
    busy = ("n1", "n2")
    u = unit(job(100, nodes=busy, time_limit_min=600), max_nodes=4)
    inp = make_input([u], nodes(4, busy=busy), utils=[util(100, 95, throughput=samples)])
    (d,) = decide(inp, cfg(speedup_growth=True), NOW)
    assert (d.action, d.reason, d.basis) == (Action.HOLD, Reason.LOW_SPEEDUP_GAIN, Basis.THROUGHPUT)
    assert d.inputs["speedup_source"] == "throughput"
    assert d.inputs["speedup_efficiency"] == pytest.approx(0.2)  # (120 - 100) / 100


def test_the_spare_node_goes_to_the_largest_saving() -> None:
    # one free node, two candidates: the better-scaling unit gets it whatever the unit ids say
    got = _decide([(100, 92, []), (101, 99, [])], free=1)
    assert got[101].action is Action.GROW and got[101].reason is Reason.SPEEDUP_GAIN
    assert got[100].action is Action.HOLD and got[100].reason is Reason.NO_FREE_NODES
    got = _decide([(100, 99, []), (101, 92, [])], free=1)
    assert got[100].action is Action.GROW and got[101].action is Action.HOLD


def test_pending_jobs_of_higher_priority_keep_the_spare_nodes() -> None:
    got = _decide([(100, 99, [])], free=1, pending_jobs=(pending(900, priority=5000),))
    assert (got[100].action, got[100].reason) == (Action.HOLD, Reason.PENDING_HIGHER_PRIORITY)


def test_hold_filter_knows_the_new_inputs() -> None:
    assert "grow_gain_s" in VOLATILE_INPUTS  # shrinks with the time left every cycle
    assert {"speedup_efficiency", "next_speedup"} <= set(BANDED_INPUTS)


def test_throughput_is_read_for_speedup_growth() -> None:
    u = unit(job(100))
    assert uses_goodput(resolve_unit(cfg(speedup_growth=True), u))
    assert not uses_goodput(resolve_unit(cfg(), u))
