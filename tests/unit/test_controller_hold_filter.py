"""Holds stored by change (controller/hold_filter.py): a steady hold is one row plus a heartbeat every
``hold_heartbeat_s``; a changed reason or input is a new row; grows and shrinks are always rows; a restart or a
lease handover starts from the store; ``explain`` still says why the job has its size.

The cycles read Slurm replies recorded from the live test cluster: a steady cluster (controller_scenarios.steady_cli,
which fails on any Slurm write) for the holds, a replayed scenario for the shrink."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest

from slurm_elastic.api.authz import AccessPolicy, Caller
from slurm_elastic.api.service import Service, ServiceSettings
from slurm_elastic.controller.config import ControllerConfig, parse_controller_config
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.controller.hold_filter import HoldFilter, HoldKey
from slurm_elastic.controller.metrics import ControllerMetrics
from slurm_elastic.errors import ConfigError
from slurm_elastic.policy import PolicyConfig, parse_config
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import UNCHANGED_SINCE, DecisionFilter, NewDecision
from tests.policy_text import UNIT, policy_text
from tests.unit.controller_scenarios import SteadyRunner, steady_cli
from tests.unit.slurm_replay import replay
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import POLICY, T0, Agents

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


@dataclass
class Steady:
    ctl: Controller
    slurm: SlurmCli
    runner: SteadyRunner
    agents: Agents
    clock: FakeClock
    store: SqlStore
    metrics: ControllerMetrics
    job: int
    nodes: list[str]

    def busy(self, util: float) -> None:
        self.agents.util = {(n, self.job): util for n in self.nodes}

    def another(self, cfg: ControllerConfig, policy: PolicyConfig) -> Controller:
        """A second controller on the same Slurm, store, agents and clock: a restart, or a new lease holder."""
        return Controller(cfg, policy, slurm=self.slurm, store=self.store, collector=self.agents, clock=self.clock)

    def run(self, cycles: int, ctl: Controller | None = None) -> None:
        for _ in range(cycles):
            (ctl or self.ctl).run_cycle()
            self.runner.check()  # a Slurm write or an unrecorded command, even one the controller caught
            self.clock.advance(2.0)


def _config(holder: str = "test") -> ControllerConfig:
    # a snapshot is stamped with the host's time, the cycle with the fake one: never call it stale here
    return ControllerConfig(interval_s=2.0, holder=holder, hold_heartbeat_s=HEARTBEAT_S, max_snapshot_age_s=86400)


@pytest.fixture
def steady() -> Steady:
    """A job at its max (3 nodes, recorded on the live cluster) and 50% busy: it holds IN_BAND cycle after cycle."""
    slurm, runner = steady_cli("steady_at_max")
    clock = FakeClock(runner.rec.clock_start)
    store = memory_store(clock)
    agents = Agents(clock)
    metrics = ControllerMetrics()
    ctl = Controller(_config(), POLICY, slurm=slurm, store=store, collector=agents, clock=clock, metrics=metrics)
    s = Steady(ctl, slurm, runner, agents, clock, store, metrics, runner.rec.jobs["steady"],
               runner.rec.nodes["steady"])
    assert len(s.nodes) == 3
    s.busy(50.0)
    return s


def _rows(store: SqlStore, job_id: int) -> list:  # type: ignore[type-arg]
    return sorted(store.decisions.list_decisions(DecisionFilter(job_id=job_id)), key=lambda d: d.id)


def _count(metrics: ControllerMetrics, name: str) -> float:
    return sum(s.value for m in metrics.registry.collect() for s in m.samples if s.name == name)


def test_a_steady_hold_is_stored_once_not_every_cycle(steady: Steady) -> None:
    steady.run(6)  # the window fills: WINDOW_NOT_FILLED holds, then IN_BAND
    settled = len(_rows(steady.store, steady.job))
    assert _rows(steady.store, steady.job)[-1].reason == "IN_BAND"
    steady.run(20)  # 40 s < heartbeat
    rows = _rows(steady.store, steady.job)
    assert settled == 2 and len(rows) == settled and rows[-1].reason == "IN_BAND"
    # the metrics still count every decision taken; the unstored holds have their own counter
    assert _count(steady.metrics, "slurm_elastic_controller_decisions_total") == 26
    assert _count(steady.metrics, "slurm_elastic_controller_holds_unchanged_total") == 26 - settled


def test_a_changed_reason_or_input_is_stored_at_once(steady: Steady) -> None:
    store, job = steady.store, steady.job
    steady.run(8)
    before = len(_rows(store, job))
    steady.busy(75.0)  # still in the band, in another utilization band
    steady.run(12)
    changed = _rows(store, job)[before:]
    assert changed and all(d.reason == "IN_BAND" for d in changed)
    # the window mean climbs from 50 to 75 and stays: a row each time it moved 10 points from the stored one (the
    # window's max jumps at once), not one per cycle; the stored level is within a band of the current one
    assert 2 <= len(changed) <= 3 and abs(float(changed[-1].inputs["mean_util"]) - 75.0) < 10
    n = len(_rows(store, job))
    steady.busy(95.0)  # busy, but at its max: another reason
    steady.run(8)
    reasons = [d.reason for d in _rows(store, job)[n:]]
    assert reasons[-1] == "AT_MAX" and reasons.count("AT_MAX") <= 2  # a row per utilization band it crossed
    n = len(_rows(store, job))
    steady.run(8)
    assert len(_rows(store, job)) == n  # and none once it stays


def test_an_unchanged_hold_is_stored_again_after_the_heartbeat(steady: Steady) -> None:
    store, job = steady.store, steady.job
    steady.run(6)
    first = _rows(store, job)[-1]
    assert first.reason == "IN_BAND" and UNCHANGED_SINCE not in first.inputs
    steady.run(int(HEARTBEAT_S / 2) + 2)  # a little over one heartbeat (2 s cycles)
    beats = [d for d in _rows(store, job) if d.id > first.id]
    assert len(beats) == 1
    (beat,) = beats
    assert beat.reason == "IN_BAND" and beat.inputs[UNCHANGED_SINCE] == first.time.isoformat()
    assert (beat.time - first.time).total_seconds() == pytest.approx(HEARTBEAT_S, abs=2.0)
    steady.run(int(HEARTBEAT_S / 2) + 1)  # the next heartbeat still counts from the first row of the run
    again = [d for d in _rows(store, job) if d.id > beat.id]
    assert len(again) == 1 and again[0].inputs[UNCHANGED_SINCE] == first.time.isoformat()


def test_grows_and_shrinks_are_always_stored_and_the_next_hold_after_them() -> None:
    """Recorded: 8 cycles in band at its max, then idle for 12 (the grace signal, the shrink, the cooldown)."""
    r = replay("in_band_then_idle", Agents)
    rows = _rows(r.store, r.rec.jobs["job"])
    (shrink,) = [d for d in rows if d.action == "shrink"]
    assert [d.action for d in rows if d.id < shrink.id][-1] == "hold"
    after = [d for d in rows if d.id > shrink.id]
    assert after and after[0].action == "hold"  # the hold after a shrink is stored, whatever it was before
    assert [d.current_nodes for d in after] == [3, 2]  # the grace, then the new size: one row each


def test_a_restart_starts_from_the_stored_holds_and_a_new_lease_holder_too(steady: Steady) -> None:
    store, job = steady.store, steady.job
    steady.run(8)
    n = len(_rows(store, job))
    restarted = steady.another(_config(), POLICY)
    steady.run(5, restarted)
    assert len(_rows(store, job)) == n  # the hold before the restart still stands: not written again
    # Another controller, with other thresholds, takes the lease and stores its hold. When the first one gets
    # the lease back it trusts nothing it remembered from its last epoch: the store's last hold differs from
    # what it would write, so it writes it (unchanged from its own point of view).
    _release(store)
    other = steady.another(_config("other"), parse_config(policy_text(UNIT, scale_up_above=70)))
    steady.run(3, other)
    rows = _rows(store, job)
    assert len(rows) == n + 1 and rows[-1].inputs["scale_up_above"] == 70
    _release(store)
    steady.run(3, restarted)
    rows = _rows(store, job)
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


def test_explain_shows_the_standing_hold_and_since_when(steady: Steady) -> None:
    store, clock = steady.store, steady.clock
    steady.run(6)
    first = _rows(store, steady.job)[-1]
    steady.run(int(HEARTBEAT_S / 2) + 5)
    svc = Service(store, ServiceSettings(access=AccessPolicy(), base_policy=lambda: ("version = 1\n", "p.toml")),
                  clock=clock)
    r = svc.handle(Caller(0, "root"), "explain", {"job": steady.job})
    assert r["decisions"][0]["action"] == "hold" and r["decisions"][0]["reason"] == "IN_BAND"
    hold = r["hold"]
    assert hold["reason"] == "IN_BAND" and hold["since"] == first.time.isoformat()
    assert hold["recorded"] > hold["since"]  # a heartbeat row
    cycle = store.decisions.last_cycle()
    assert cycle is not None and hold["last_cycle"] == cycle.started_at.isoformat()
    assert clock() - timedelta(seconds=4) <= cycle.started_at
