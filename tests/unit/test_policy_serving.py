"""Serving units beyond one-case-per-reason: ordering against training and pending jobs, protection from
shrink-to-admit, the scale-in window and cooldown, the load objective, explain's numbers, the input builder,
and the seasonal forecast."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from slurm_elastic.policy import Action, Decision, PolicyConfig, PolicyInput, Reason, decide
from slurm_elastic.policy.forecast import DemandPoint, SeasonalProfile, peak_ahead
from slurm_elastic.policy.inputs import PolicyInputBuilder
from slurm_elastic.policy.model import ServingLoad, ServingPoint
from tests.unit.policy_builders import NOW, ago, cfg, job, make_input, nodes, pending, record, unit, util
from tests.unit.test_policy_rules import serving, spoints


def _by_id(inp: PolicyInput, config: PolicyConfig) -> dict[int, Decision]:
    return {d.unit_id: d for d in decide(inp, config, NOW)}


def test_serving_grow_goes_before_a_higher_priority_pending_job_and_a_training_grow() -> None:
    train = unit(job(200, nodes=("n2",), priority=9000))
    inp, config = serving(60, free=1, others=(train,), utils=(util(200, 95),))
    inp = replace(inp, snapshot=replace(inp.snapshot, jobs=inp.snapshot.jobs + (pending(900, priority=99999),)))
    d = _by_id(inp, config)
    assert (d[100].action, d[100].reason) == (Action.GROW, Reason.SLO_AT_RISK)
    assert d[100].grow is not None and d[100].grow.nodes == ("n3",)
    assert d[200].action is Action.HOLD


def test_serving_unit_is_never_a_shrink_to_admit_victim() -> None:
    inp, _ = serving(40, leader=("n1", "n2", "n3"), free=0)
    inp = replace(inp, snapshot=replace(inp.snapshot, jobs=inp.snapshot.jobs + (pending(900, priority=99999),)))
    d = _by_id(inp, cfg(shrink_to_admit=True))
    assert d[100].action is Action.HOLD
    assert d[100].reason is not Reason.SHRINK_TO_ADMIT


def test_reclaim_takes_only_training_nodes_above_min_and_the_serving_hold_says_so() -> None:
    train = unit(job(200, nodes=("n2", "n3", "n4"), priority=5000), min_nodes=2)
    inp, config = serving(100, free=0, others=(train,), utils=(util(200, 60),))
    d = _by_id(inp, config)
    # p99 100ms wants 3 more replicas; the training job gives only its one node above min 2
    assert (d[200].action, d[200].reason, d[200].target_nodes) == (Action.SHRINK, Reason.SERVING_RECLAIM, 2)
    assert d[200].grace_s > 0 and d[200].signal is not None  # the usual grace signal
    assert d[100].action is Action.HOLD
    assert "reclaiming 1 from training job(s) 200 (1) above their min" in d[100].message


def test_training_at_min_is_not_reclaimed() -> None:
    train = unit(job(200, nodes=("n2",), priority=5000))
    inp, config = serving(60, free=0, others=(train,), utils=(util(200, 60),))
    d = _by_id(inp, config)
    assert d[200].action is Action.HOLD
    assert (d[100].action, d[100].reason) == (Action.HOLD, Reason.NO_FREE_NODES)


def test_scale_out_ignores_the_cooldown_but_scale_in_waits_for_its_own() -> None:
    inp, config = serving(60)
    inp = replace(inp, history=(record(100, 200, Action.SHRINK, from_nodes=2, to_nodes=1),))
    assert _by_id(inp, config)[100].reason is Reason.SLO_AT_RISK
    inp, config = serving(10, leader=("n1", "n2"))
    inp = replace(inp, history=(record(100, 600),))
    d = _by_id(inp, config)[100]
    assert (d.action, d.reason) == (Action.HOLD, Reason.SLO_MET)
    assert "serving_down_cooldown_s 900s" in d.message


def test_scale_in_needs_the_whole_long_window_of_headroom() -> None:
    inp, config = serving(10, leader=("n1", "n2"))
    short = ServingLoad(100, spoints(10, 10, span=300))
    d = _by_id(replace(inp, serving={100: short}), config)[100]
    assert (d.action, d.reason) == (Action.HOLD, Reason.SLO_MET)
    assert "300s of the 900s scale-in window covered" in d.message
    # one bad minute in the window keeps the replica
    pts = list(spoints(10, 10))
    pts[10] = replace(pts[10], p99_ms=44.0)
    d = _by_id(replace(inp, serving={100: ServingLoad(100, tuple(pts))}), config)[100]
    assert (d.action, d.reason) == (Action.HOLD, Reason.SLO_MET)


def test_load_objective_sizes_the_scale_out_and_explain_shows_the_numbers() -> None:
    inp, config = serving(5, 950, free=4, slo_p99_ms=None, target_rps_per_replica=200)
    d = _by_id(inp, config)[100]
    # 950 req/s at 90% of 200 per replica: 6 replicas, capped by max 4
    assert (d.action, d.reason, d.target_nodes) == (Action.GROW, Reason.SLO_AT_RISK, 4)
    assert d.inputs["requests_per_s"] == 950.0
    assert d.inputs["rps_per_replica"] == 200.0 and d.inputs["rps_per_replica.source"] == "directive"
    assert d.inputs["p99_ms"] == 5.0


def test_replica_capacity_measured_by_the_caller_drives_the_forecast() -> None:
    inp, config = serving(20, 50, free=4)
    load = ServingLoad(100, spoints(20, 50), forecast_rps=300, forecast_lead_s=120, rps_per_replica=100)
    d = _by_id(replace(inp, serving={100: load}), config)[100]
    assert (d.reason, d.target_nodes) == (Reason.SLO_PEAK_AHEAD, 4)
    assert d.inputs["rps_per_replica.source"] == "measured"
    # without a capacity the forecast can not be turned into replicas: latency alone decides
    d = _by_id(replace(inp, serving={100: replace(load, rps_per_replica=None)}), config)[100]
    assert d.reason is Reason.SLO_MET


def test_stale_and_missing_serving_points_hold() -> None:
    inp, config = serving(60)
    assert _by_id(replace(inp, serving={}), config)[100].reason is Reason.NO_METRICS
    old = ServingLoad(100, (ServingPoint(ago(1000), 10, p99_ms=90),))
    assert _by_id(replace(inp, serving={100: old}), config)[100].reason is Reason.STALE_METRICS


def test_builder_keeps_the_long_window_and_only_serving_units() -> None:
    u = unit(job(100, nodes=("n1",)), serving=True, slo_p99_ms=50)
    t = unit(job(200, nodes=("n2",)))
    b = PolicyInputBuilder(cfg(), NOW, 30.0)
    assert b.reads(t).serving_since is None
    since = b.reads(u).serving_since
    assert since == NOW - timedelta(seconds=900 + 60)
    pts = (ServingPoint(ago(2000), 1.0), ServingPoint(ago(10), 2.0))
    inp = b.build(make_input([u, t], nodes(2)).snapshot, [u, t], samples={},
                  serving={100: ServingLoad(100, pts), 200: ServingLoad(200, pts)})
    assert set(inp.serving) == {100}
    assert [p.requests_per_s for p in inp.serving[100].points] == [2.0]


# --- forecast ---------------------------------------------------------------------------------------------


def _history(weeks: int, level: Callable[[datetime], float]) -> list[DemandPoint]:
    start = NOW - timedelta(weeks=weeks)
    return [DemandPoint(start + timedelta(minutes=15 * i), level(start + timedelta(minutes=15 * i)))
            for i in range(weeks * 7 * 96)]


def test_profile_learns_hour_of_day_and_day_of_week() -> None:
    def level(t: datetime) -> float:
        return (1000.0 if 9 <= t.hour < 17 else 100.0) * (0.5 if t.weekday() >= 5 else 1.0)

    p = SeasonalProfile.fit(_history(3, level))
    monday = NOW - timedelta(days=NOW.weekday())
    assert p.predict(monday.replace(hour=10)) == 1000.0
    assert p.predict(monday.replace(hour=3)) == 100.0
    assert p.predict(monday.replace(hour=10) + timedelta(days=5)) == 500.0  # Saturday
    # one week of history is too little per slot of the week: the slot of the day (across days) answers
    daily = SeasonalProfile.fit(_history(1, level))
    assert daily.weekly == {}
    assert daily.predict(monday.replace(hour=10)) == pytest.approx(1000.0)


def test_peak_ahead_looks_one_cold_start_ahead() -> None:
    p = SeasonalProfile.fit(_history(2, lambda t: 1000.0 if t.hour == 9 else 100.0))
    before = NOW.replace(hour=8, minute=57)
    assert peak_ahead(p, before, 60) == 100.0
    assert peak_ahead(p, before, 240) == 1000.0
    assert peak_ahead(SeasonalProfile(900), before, 240) is None


def test_profile_rejects_bad_parameters_and_skips_bad_points() -> None:
    with pytest.raises(ValueError):
        SeasonalProfile.fit([], bucket_s=7)
    with pytest.raises(ValueError):
        SeasonalProfile.fit([], quantile=1.5)
    p = SeasonalProfile.fit([DemandPoint(NOW, float("nan")), DemandPoint(NOW, -1.0), DemandPoint(NOW, 5.0)],
                            min_weeks=1)
    assert p.observations == 1 and p.predict(NOW) == 5.0


def test_no_reclaim_for_a_serving_grow_its_quota_refuses() -> None:
    train = unit(job(200, nodes=("n2", "n3"), priority=5000))
    inp, _ = serving(60, free=0, others=(train,), utils=(util(200, 60),))
    d = _by_id(inp, cfg(max_extension_nodes_per_account=0))
    assert d[100].action is Action.HOLD and "reclaiming" not in d[100].message
    assert d[200].action is Action.HOLD
    # one node of quota left: one node reclaimed although the latency asks for more
    inp, _ = serving(100, free=0, others=(unit(job(200, nodes=("n2", "n3", "n4"), priority=5000)),),
                     utils=(util(200, 60),))
    d = _by_id(inp, cfg(max_extension_nodes_per_account=1))
    assert (d[200].action, d[200].reason, d[200].target_nodes) == (Action.SHRINK, Reason.SERVING_RECLAIM, 2)
