"""Holds stored by change (controller/hold_filter.py): a steady hold is one row plus a heartbeat every
``hold_heartbeat_s``; a changed reason or input is a new row; grows and shrinks are always rows; a restart or a
lease handover starts from the store; ``explain`` still says why the job has its size."""

from __future__ import annotations

from datetime import timedelta

import pytest

from slurm_elastic.api.authz import AccessPolicy, Caller
from slurm_elastic.api.service import Service, ServiceSettings
from slurm_elastic.controller.config import ControllerConfig, parse_controller_config
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.controller.hold_filter import UNCHANGED_SINCE, HoldFilter, HoldKey
from slurm_elastic.controller.metrics import ControllerMetrics
from slurm_elastic.errors import ConfigError
from slurm_elastic.policy import parse_config
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import DecisionFilter, NewDecision
from tests.policy_text import UNIT, policy_text
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import POLICY, T0, Agents, FakeSlurm, run

HEARTBEAT_S = 60.0


def _hold(reason: str = "IN_BAND", nodes: int = 3, **inputs: object) -> NewDecision:
    base: dict[str, object] = {"current_nodes": nodes, "min_nodes": 1, "max_nodes": 3, "mean_util": 55.2,
                               "samples": 5, "metric_age_s": 1.5, "basis": "utilization"}
    base.update(inputs)
    return NewDecision(job_id=10, action="hold", reason=reason, message=f"{reason} at 12:00:01",
                       inputs=base, current_nodes=nodes, target_nodes=nodes)


def _differs(new: NewDecision, stored: NewDecision) -> bool:
    return HoldKey.of(new).differs(HoldKey.of(stored))


def test_what_matters_leaves_out_clocks_and_counts_and_levels_that_moved_less_than_a_band() -> None:
    a = _hold()  # mean_util 55.2
    assert not _differs(_hold(mean_util=58.9, samples=9, metric_age_s=20.0), a)
    assert not _differs(_hold(mean_util=49.9), _hold(mean_util=50.1))  # jitter across a round number: no row
    assert _differs(_hold(mean_util=65.2), a)  # moved by a band (10 points)
    assert _differs(_hold(mean_util=45.0), a)
    assert _differs(_hold(mean_util=None), a)  # the measurement vanished
    assert _differs(_hold(reason="NO_FREE_NODES"), a)
    assert _differs(_hold(nodes=2), a)
    assert _differs(_hold(scale_up_above=90), a)  # an input the filter does not know counts as it is
    assert not _differs(_hold(unchanged_since="2026-11-29T11:00:00+00:00"), a)


@pytest.fixture
def steady() -> tuple[Controller, FakeSlurm, Agents, FakeClock, SqlStore, ControllerMetrics]:
    """Job 10 at its max (3 nodes) and 50% busy: it holds IN_BAND cycle after cycle."""
    clock = FakeClock(T0)
    store = memory_store(clock)
    slurm = FakeSlurm(clock)
    agents = Agents(clock)
    metrics = ControllerMetrics()
    ctl = Controller(ControllerConfig(interval_s=2.0, holder="test", hold_heartbeat_s=HEARTBEAT_S), POLICY,
                     slurm=slurm, store=store, collector=agents, clock=clock, metrics=metrics)
    slurm.add_job(10, ["n1", "n2", "n3"])
    agents.util = {(n, 10): 50.0 for n in ("n1", "n2", "n3")}
    return ctl, slurm, agents, clock, store, metrics


def _rows(store: SqlStore, job_id: int = 10) -> list:  # type: ignore[type-arg]
    return sorted(store.decisions.list_decisions(DecisionFilter(job_id=job_id)), key=lambda d: d.id)


def _count(metrics: ControllerMetrics, name: str) -> float:
    return sum(s.value for m in metrics.registry.collect() for s in m.samples if s.name == name)


def test_a_steady_hold_is_stored_once_not_every_cycle(steady: tuple) -> None:  # type: ignore[type-arg]
    ctl, _, _, clock, store, metrics = steady
    run(ctl, clock, 6)  # the window fills: WINDOW_NOT_FILLED holds, then IN_BAND
    settled = len(_rows(store))
    assert _rows(store)[-1].reason == "IN_BAND"
    run(ctl, clock, 20)  # 40 s < heartbeat
    rows = _rows(store)
    assert settled == 2 and len(rows) == settled and rows[-1].reason == "IN_BAND"
    # the metrics still count every decision taken; the unstored holds have their own counter
    assert _count(metrics, "slurm_elastic_controller_decisions_total") == 26
    assert _count(metrics, "slurm_elastic_controller_holds_unchanged_total") == 26 - settled


def test_a_changed_reason_or_input_is_stored_at_once(steady: tuple) -> None:  # type: ignore[type-arg]
    ctl, slurm, agents, clock, store, _ = steady
    run(ctl, clock, 8)
    before = len(_rows(store))
    agents.util = {(n, 10): 75.0 for n in ("n1", "n2", "n3")}  # still in the band, in another utilization band
    run(ctl, clock, 12)
    changed = _rows(store)[before:]
    assert changed and all(d.reason == "IN_BAND" for d in changed)
    # the window mean climbs from 50 to 75 and stays: a row each time it moved 10 points from the stored one (the
    # window's max jumps at once), not one per cycle; the stored level is within a band of the current one
    assert 2 <= len(changed) <= 3 and abs(float(changed[-1].inputs["mean_util"]) - 75.0) < 10
    n = len(_rows(store))
    agents.util = {(n_, 10): 95.0 for n_ in ("n1", "n2", "n3")}  # busy, but at its max: another reason
    run(ctl, clock, 8)
    reasons = [d.reason for d in _rows(store)[n:]]
    assert reasons[-1] == "AT_MAX" and reasons.count("AT_MAX") <= 2  # a row per utilization band it crossed
    n = len(_rows(store))
    run(ctl, clock, 8)
    assert len(_rows(store)) == n  # and none once it stays


def test_an_unchanged_hold_is_stored_again_after_the_heartbeat(steady: tuple) -> None:  # type: ignore[type-arg]
    ctl, _, _, clock, store, _ = steady
    run(ctl, clock, 6)
    first = _rows(store)[-1]
    assert first.reason == "IN_BAND" and UNCHANGED_SINCE not in first.inputs
    run(ctl, clock, int(HEARTBEAT_S / 2) + 2)  # a little over one heartbeat (2 s cycles)
    beats = [d for d in _rows(store) if d.id > first.id]
    assert len(beats) == 1
    (beat,) = beats
    assert beat.reason == "IN_BAND" and beat.inputs[UNCHANGED_SINCE] == first.time.isoformat()
    assert (beat.time - first.time).total_seconds() == pytest.approx(HEARTBEAT_S, abs=2.0)
    run(ctl, clock, int(HEARTBEAT_S / 2) + 1)  # the next heartbeat still counts from the first row of the run
    again = [d for d in _rows(store) if d.id > beat.id]
    assert len(again) == 1 and again[0].inputs[UNCHANGED_SINCE] == first.time.isoformat()


def test_grows_and_shrinks_are_always_stored_and_the_next_hold_after_them(steady: tuple) -> None:  # type: ignore[type-arg]
    ctl, slurm, agents, clock, store, _ = steady
    run(ctl, clock, 8)
    agents.util = {(n, 10): 5.0 for n in ("n1", "n2", "n3")}
    run(ctl, clock, 12)  # shrinks (grace 5 s), then cools down
    rows = _rows(store)
    (shrink,) = [d for d in rows if d.action == "shrink"]
    after = [d for d in rows if d.id > shrink.id]
    assert after and after[0].action == "hold"  # the hold after a shrink is stored, whatever it was before
    assert [d.current_nodes for d in after] == [3, 2]  # the grace, then the new size: one row each


def test_a_restart_starts_from_the_stored_holds_and_a_new_lease_holder_too(steady: tuple) -> None:  # type: ignore[type-arg]
    ctl, slurm, agents, clock, store, _ = steady
    run(ctl, clock, 8)
    n = len(_rows(store))
    restarted = Controller(ControllerConfig(interval_s=2.0, holder="test", hold_heartbeat_s=HEARTBEAT_S), POLICY,
                           slurm=slurm, store=store, collector=agents, clock=clock)
    run(restarted, clock, 5)
    assert len(_rows(store)) == n  # the hold before the restart still stands: not written again
    # Another controller, with other thresholds, takes the lease and stores its hold. When the first one gets
    # the lease back it trusts nothing it remembered from its last epoch: the store's last hold differs from
    # what it would write, so it writes it (unchanged from its own point of view).
    _release(store)
    other = Controller(ControllerConfig(interval_s=2.0, holder="other", hold_heartbeat_s=HEARTBEAT_S),
                       parse_config(policy_text(UNIT, scale_up_above=70)), slurm=slurm, store=store,
                       collector=agents, clock=clock)
    run(other, clock, 3)
    rows = _rows(store)
    assert len(rows) == n + 1 and rows[-1].inputs["scale_up_above"] == 70
    _release(store)
    run(restarted, clock, 3)
    rows = _rows(store)
    assert len(rows) == n + 2 and rows[-1].reason == "IN_BAND" and rows[-1].inputs["scale_up_above"] != 70
    assert HoldKey.of(rows[-1]) == HoldKey.of(rows[n - 1])  # what it had stored before, stored again


def _release(store: SqlStore) -> None:
    lease = store.lease.get()
    assert lease is not None and store.lease.release(lease.token())


def test_a_failed_write_changes_nothing_remembered() -> None:
    clock = FakeClock(T0)
    store = memory_store(clock)
    f = HoldFilter(HEARTBEAT_S)
    cycle = store.decisions.begin_cycle(holder="t")
    store.decisions.record_decisions(cycle, [_hold()])  # lets the filter seed from a hold of job 10
    bad = NewDecision(job_id=11, action="grow", reason="", message="", inputs={}, current_nodes=1, target_nodes=2)
    with pytest.raises(Exception):  # noqa: B017,PT011 - the store refuses the empty reason
        f.record(store, cycle, [_hold(mean_util=80.0), bad], clock())
    assert f.record(store, cycle, [_hold(mean_util=80.0)], clock()).written == 1  # still a change


def test_heartbeat_zero_stores_every_hold() -> None:
    clock = FakeClock(T0)
    store = memory_store(clock)
    f = HoldFilter(0)
    cycle = store.decisions.begin_cycle(holder="t")
    assert [f.record(store, cycle, [_hold()], clock()).written for _ in range(3)] == [1, 1, 1]


def test_hold_heartbeat_s_is_validated_like_the_other_keys() -> None:
    base = "version = 1\n[controller]\n"
    assert parse_controller_config(base).hold_heartbeat_s == 600.0
    assert parse_controller_config(base + "hold_heartbeat_s = 0\n").hold_heartbeat_s == 0.0
    for bad in ("-1", "100000", "true", '"600"'):
        with pytest.raises(ConfigError, match="hold_heartbeat_s"):
            parse_controller_config(base + f"hold_heartbeat_s = {bad}\n")


def test_explain_shows_the_standing_hold_and_since_when(steady: tuple) -> None:  # type: ignore[type-arg]
    ctl, slurm, agents, clock, store, _ = steady
    run(ctl, clock, 6)
    first = _rows(store)[-1]
    run(ctl, clock, int(HEARTBEAT_S / 2) + 5)
    svc = Service(store, ServiceSettings(access=AccessPolicy(), base_policy=lambda: ("version = 1\n", "p.toml")),
                  clock=clock)
    r = svc.handle(Caller(0, "root"), "explain", {"job": 10})
    assert r["decisions"][0]["action"] == "hold" and r["decisions"][0]["reason"] == "IN_BAND"
    hold = r["hold"]
    assert hold["reason"] == "IN_BAND" and hold["since"] == first.time.isoformat()
    assert hold["recorded"] > hold["since"]  # a heartbeat row
    cycle = store.decisions.last_cycle()
    assert cycle is not None and hold["last_cycle"] == cycle.started_at.isoformat()
    assert clock() - timedelta(seconds=4) <= cycle.started_at
