"""Goodput (throughput-aware) scaling and restart-cost awareness."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_elastic.policy import Action, Basis, Decision, Reason, ThroughputSample, decide
from slurm_elastic.policy.signals import marginal_efficiency, restart_gain_s
from tests.unit.policy_builders import NOW, cfg, ext, job, make_input, nodes, tput, unit, util


@pytest.mark.parametrize(
    ("small", "small_tp", "big", "big_tp", "expected"),
    [
        (1, 100.0, 2, 200.0, 1.0),  # linear
        (1, 100.0, 2, 150.0, 0.5),
        (2, 200.0, 4, 200.0, 0.0),  # flat
        (2, 200.0, 4, 180.0, -0.1),  # worse
        (2, 0.0, 4, 100.0, None),
        (2, 100.0, 2, 100.0, None),
    ],
)
def test_marginal_efficiency(small: int, small_tp: float, big: int, big_tp: float, expected: float | None) -> None:
    got = marginal_efficiency(small, small_tp, big, big_tp)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_restart_gain() -> None:
    assert restart_gain_s(None, 60, 1.0, 1, 4) == float("inf")
    assert restart_gain_s(3660, 60, 1.0, 1, 4) == pytest.approx(900)
    assert restart_gain_s(30, 60, 1.0, 1, 1) == 0


def _one(samples: list[ThroughputSample], *, mean: float = 95, exts: int = 1, **kw: Any) -> Decision:
    ext_jobs = [ext(500 + i, (f"e{i}",), started_ago=3000) for i in range(exts)]
    u = unit(job(100, nodes=("n1",)), exts=ext_jobs, max_nodes=8)
    busy = ["n1", *(f"e{i}" for i in range(exts))]
    all_nodes = nodes(4, busy=busy) + [n for n in nodes(exts, prefix="e", busy=busy[1:])]
    inp = make_input([u], all_nodes, utils=[util(100, mean, throughput=samples)])
    kw.setdefault("goodput", True)
    (d,) = decide(inp, cfg(**kw), NOW)
    return d


def test_grows_while_the_predicted_next_step_pays() -> None:
    d = _one(tput(1, 100.0, age=3500) + tput(2, 190.0))
    assert (d.action, d.basis) == (Action.GROW, Basis.THROUGHPUT)
    assert "predicted marginal efficiency 0.90 >= 0.50" in d.message
    assert d.inputs["marginal_efficiency_last"] == 0.9


def test_holds_when_the_measured_next_step_did_not_pay() -> None:
    # it ran at 3 nodes before and gained little there
    d = _one(tput(1, 100.0, age=5000) + tput(3, 215.0, age=4000) + tput(2, 190.0))
    assert (d.action, d.reason, d.basis) == (Action.HOLD, Reason.LOW_MARGINAL_EFFICIENCY, Basis.THROUGHPUT)
    assert "measured marginal efficiency of the next step 0.26 < 0.50" in d.message


def test_flat_throughput_after_a_grow_shrinks_back() -> None:
    d = _one(tput(1, 100.0, age=3500) + tput(2, 101.0), mean=70)
    assert (d.action, d.reason, d.target_nodes) == (Action.SHRINK, Reason.LOW_MARGINAL_EFFICIENCY, 1)
    assert d.shrink is not None and d.shrink.cancel_extensions == (500,)


def test_threshold_is_configurable() -> None:
    d = _one(tput(1, 100.0, age=3500) + tput(2, 130.0), goodput_min_marginal_efficiency=0.2)
    assert d.action is Action.GROW


@pytest.mark.parametrize(
    "samples",
    [
        [],  # publishes nothing
        tput(2, 200.0, count=2),  # too few samples at the current size
        tput(1, 100.0, age=3500) + tput(2, 101.0, age=1000),  # stale at the current size
    ],
)
def test_falls_back_to_utilization(samples: list[ThroughputSample]) -> None:
    d = _one(samples)
    assert (d.action, d.basis) == (Action.GROW, Basis.UTILIZATION)


def test_only_one_size_known_falls_back_to_utilization() -> None:
    assert _one(tput(2, 200.0)).basis is Basis.UTILIZATION


def test_goodput_off_ignores_throughput() -> None:
    d = _one(tput(1, 100.0, age=3500) + tput(2, 101.0), goodput=False)
    assert (d.action, d.basis) == (Action.GROW, Basis.UTILIZATION)


def test_underutilized_still_shrinks_on_utilization() -> None:
    d = _one(tput(1, 100.0, age=3500) + tput(2, 190.0), mean=10)
    assert (d.reason, d.basis) == (Reason.UNDERUTILIZED, Basis.UTILIZATION)


def _restart(time_limit_min: int | None, restart: float | None = None, **kw: Any) -> Decision:
    u = unit(job(100, nodes=("n1", "n2", "n3", "n4"), time_limit_min=time_limit_min, started_ago=3600),
             max_nodes=8)
    inp = make_input([u], nodes(6, busy=["n1", "n2", "n3", "n4"]), utils=[util(100, 95, restart=restart)])
    values = {"restart_cost_aware": True, "min_remaining_for_grow_s": 0, **kw}
    (d,) = decide(inp, cfg(**values), NOW)
    return d


def test_restart_cost_gain_must_exceed_cost() -> None:
    # 4 nodes -> 5: remaining R, gain (R - 60) / 4 must exceed 60 s, so R > 300 s
    assert _restart(65).reason is Reason.RESTART_COST  # R = 300 s
    assert _restart(66).action is Action.GROW  # R = 360 s
    assert _restart(None).action is Action.GROW  # no time limit
    d = _restart(70, restart=120)  # R = 600 s, observed restart 120 s: gain 120 s
    assert d.reason is Reason.RESTART_COST and d.inputs["restart_cost.source"] == "observed"
    assert _restart(66, restart_cost_aware=False).action is Action.GROW


def test_restart_cost_uses_the_predicted_efficiency() -> None:
    u = unit(job(100, nodes=("n1",), time_limit_min=70, started_ago=3600), exts=[ext(500, ("e0",), started_ago=3000)],
             max_nodes=8)
    samples = tput(1, 100.0, age=3500) + tput(2, 160.0)  # efficiency 0.6
    inp = make_input([u], nodes(3, busy=["n1"]) + nodes(1, prefix="e", busy=["e0"]),
                     utils=[util(100, 95, throughput=samples)])
    # R = 600 s: gain (600-60) * 0.6 * 1/2 = 162 s > 60 s; with a 300 s restart: 90 s < 300 s
    config = {"goodput": True, "restart_cost_aware": True, "min_remaining_for_grow_s": 0}
    assert decide(inp, cfg(**config), NOW)[0].action is Action.GROW
    d = decide(inp, cfg(restart_cost_s=300, **config), NOW)[0]
    assert d.reason is Reason.RESTART_COST and d.inputs["expected_gain_s"] == 90.0


def test_old_throughput_is_forgotten_so_a_size_that_did_not_pay_is_tried_again_later() -> None:
    # 3 nodes paid little 4000 s ago: hold. Past throughput_max_age_s that number is forgotten and the next
    # step is predicted from the last one (0.90): grow again.
    samples = tput(1, 100.0, age=3500) + tput(3, 215.0, age=4000) + tput(2, 190.0)
    assert _one(samples).reason is Reason.LOW_MARGINAL_EFFICIENCY
    d = _one(tput(1, 100.0, age=3500) + tput(3, 215.0, age=8000) + tput(2, 190.0), throughput_max_age_s=7200)
    assert (d.action, d.basis) == (Action.GROW, Basis.THROUGHPUT)
    # With every smaller size forgotten too, nothing is known beyond the current size: utilization decides.
    d = _one(tput(1, 100.0, age=3500) + tput(2, 190.0), throughput_max_age_s=3000)
    assert d.basis is Basis.UTILIZATION
