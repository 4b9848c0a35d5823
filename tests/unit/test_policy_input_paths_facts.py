"""The controller and the simulator build the same policy input, and decide the same, where a grow fails and a node
is under power saving: the grow back-off (GROW_BACKOFF) and the power rules get their facts from the same code in
both (slurm_elastic/backoff.py: refused_grow_end, controller/power.py: PowerTracker and power_state).

As in test_policy_input_paths.py: a short run of the simulator's adapter is recorded (the snapshots it shows the
policy, the utilization it samples) and replayed through the real controller. The simulated engine never applies
job b's grow (its node stays free): the adapter journals the grow FAILED; the replaying Slurm refuses the
controller's sbatch with the reply recorded from the live cluster (the scenario grow_refused): journaled FAILED.
Node n3 is a cold node: powered down, then booting, then up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

import slurm_elastic.controller.cycle as cycle
import slurm_elastic.sim.policy_adapter as adapter
from slurm_elastic.controller.config import ControllerConfig
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.controller.history import HISTORY_SPAN, resize_history
from slurm_elastic.policy import Action, Outcome, PolicyConfig, Reason, decide, parse_config
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.elastic import JobView, NodeView, SimClusterState
from slurm_elastic.sim.journal import SimJournal
from slurm_elastic.sim.policy_adapter import AdapterSettings, ProductionPolicy, at
from slurm_elastic.slurm.runner import CommandResult, classify
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import ActionKind, ActionRecord, ActionState
from tests.policy_text import UNIT, policy_text
from tests.unit.policy_builders import NOW, cfg, job, make_input, node, pending, unit, util
from tests.unit.slurm_replay import SCENARIO_DIR, read_recording
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_policy_input_paths import (
    GPUS,
    INTERVAL,
    Recorder,
    Recording,
    ReplayAgents,
    ReplaySlurm,
    record_run,
)

POLICY = parse_config(policy_text(UNIT, window_s=60, scale_down_below=40, scale_up_above=80, shrink_to_admit=False,
                                  cooldown_s=30, grace_s=90, max_metric_age_s=120))
#: Per cycle: job a (2 nodes) in band, job b (1 node) busy; n4's power state (sim/power.py).
#: Ten cycles: b's grow onto the powered-down n3 fails at the third, the back-off holds it at the fourth, n3 boots
#: at the fifth (for someone else) and b grows again at the sixth; that grow fails too, the back-off (doubled) holds
#: b for three cycles with two failed grows in its history (both paths keep every resize of the day, not only a
#: unit's last: sim/journal.py), and b grows a third time at the tenth.
UTIL_A = (0.5,) * 10
UTIL_B = (0.95,) * 10
POWER = ("off", "off", "off", "off", "booting", "on", "on", "on", "on", "on")


def _view(job_id: str, nodes: tuple[int, ...], util: float) -> JobView:
    return JobView(job_id=job_id, state="RUNNING", submit_time=0.0, start_time=0.0, requested_gpus=GPUS * len(nodes),
                   num_nodes=len(nodes), num_gpus=GPUS * len(nodes), nodes=nodes, gpus_per_node=(GPUS,) * len(nodes),
                   min_nodes=1, max_nodes=2, gpu_util=util, throughput=100.0 * len(nodes), progress=0.1, resizes=0,
                   last_resize_time=None, restarting_until=None, account="nlp")


def _cluster(now: float, util_a: float, util_b: float, power: str) -> SimClusterState:
    jobs = (_view("a", (0, 1), util_a), _view("b", (2,), util_b))
    holders: dict[int, tuple[str, ...]] = {0: ("a",), 1: ("a",), 2: ("b",), 3: ()}
    nodes = tuple(NodeView(i, GPUS, 0 if holders[i] else GPUS, holders[i], power if i == 3 else "")
                  for i in range(4))
    return SimClusterState(now=now, gpus_per_node=GPUS, total_gpus=4 * GPUS, free_gpus=GPUS, nodes=nodes, jobs=jobs)


def _record(monkeypatch: pytest.MonkeyPatch) -> Recording:
    return record_run(monkeypatch, POLICY, lambda i, now: _cluster(now, UTIL_A[i], UTIL_B[i], POWER[i]), UTIL_A,
                      UTIL_B)


def _recorded_refusal() -> CommandResult:
    """sbatch's refusal, as the live test cluster answered it (scenario grow_refused)."""
    _, commands = read_recording(SCENARIO_DIR / "grow_refused.json")
    (cmd,) = [c for c in commands if c["argv"][0] == "sbatch" and c["rc"] != 0]
    return CommandResult(tuple(cmd["argv"]), int(cmd["rc"]), cmd["stdout"], cmd["stderr"])


class RefusingSlurm(ReplaySlurm):
    """The recorded snapshots; every extension job's sbatch is refused as Slurm refused one."""

    def submit_as(self, user: str, script: str, sbatch_args: Sequence[str], env: Mapping[str, str] | None = None
                  ) -> int:
        self.calls.append(("submit_as", user))
        raise classify(_recorded_refusal())


def _replay(rec: Recording, monkeypatch: pytest.MonkeyPatch) -> tuple[Recorder, list[tuple[str, Any]]]:
    return _replay_with(rec, monkeypatch, POLICY)


def _replay_with(rec: Recording, monkeypatch: pytest.MonkeyPatch, policy: PolicyConfig,
                 clock: FakeClock | None = None, store: SqlStore | None = None
                 ) -> tuple[Recorder, list[tuple[str, Any]]]:
    ctl_rec = Recorder()
    monkeypatch.setattr(cycle, "decide", ctl_rec)
    clock = clock or FakeClock(at(rec.times[0]))
    slurm = RefusingSlurm(rec, clock)
    ctl = Controller(ControllerConfig(interval_s=INTERVAL, holder="test"), policy, slurm=slurm,
                     store=store or memory_store(clock), collector=ReplayAgents(rec, clock), clock=clock)
    for i, _ in enumerate(rec.times):
        summary = ctl.run_cycle()
        assert summary.error is None and summary.skipped is None, summary
        if i + 1 < len(rec.times):
            clock.advance(INTERVAL)
    return ctl_rec, slurm.calls


def test_a_failed_grow_and_a_cold_node_give_the_same_input_and_decisions_in_the_controller_and_the_simulator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _record(monkeypatch)
    ctl, calls = _replay(rec, monkeypatch)
    assert len(ctl.inputs) == len(rec.sim.inputs) == len(rec.times)
    for i, (mine, sims) in enumerate(zip(ctl.inputs, rec.sim.inputs, strict=True)):
        assert mine == sims, f"cycle {i}: the controller's and the simulator's policy inputs differ"
        assert ctl.decisions[i] == rec.sim.decisions[i], f"cycle {i}: the decisions differ"
    # The situation covers what the shared facts feed: b's grow onto the powered-down n3 failed (Slurm refused
    # it), the back-off held b, and n3's resume was measured by the same tracker from POWERING_UP -> up.
    b = rec.sim.inputs[0].units[1].unit_id
    assert [next((str(d.action), str(d.reason)) for d in ds if d.unit_id == b) for ds in rec.sim.decisions] == [
        ("hold", "WINDOW_NOT_FILLED"), ("hold", "WINDOW_NOT_FILLED"), ("grow", "OVERUTILIZED"),
        ("hold", "GROW_BACKOFF"), ("hold", "NO_FREE_NODES"), ("grow", "OVERUTILIZED"), *[("hold", "GROW_BACKOFF")] * 3,
        ("grow", "OVERUTILIZED")]
    assert [[(h.unit_id, str(h.action), str(h.outcome)) for h in inp.history] for inp in rec.sim.inputs[5:7]] == [
        [(b, "grow", "failed")], [(b, "grow", "failed")] * 2]
    grow = next(d for d in rec.sim.decisions[2] if d.unit_id == b)
    assert "powered-down node(s) for Slurm to resume: n3" in grow.message  # the power walk, in both
    assert [c for c in calls if c[0] == "submit_as"] == [("submit_as", "sim")] * 3  # refused three times
    assert [e.failure for e in rec.sim.inputs[3].extension_ends] == ["GROW_REFUSED"]
    assert rec.sim.inputs[-1].power.resume_s == ctl.inputs[-1].power.resume_s == {"n3": INTERVAL}


# --- a waiting moldable job in the round plan ---------------------------------------------------------------------

PLAN_TEXT = policy_text(UNIT, window_s=60, scale_down_below=10, scale_up_above=95, cooldown_s=30, grace_s=90,
                        max_metric_age_s=120, shrink_to_admit=True, allocator=True, moldable_start=True,
                        fairness_max_rho=2.0)
PLAN_POLICY = parse_config(PLAN_TEXT)
PLAN_CYCLES = 4


UNITS = {"a": (0, 1), "b": (2, 3), "d": (4, 5)}
BUSY = 0.9  # in band (scale_up_above 95): each unit's second node is worth nearly a node's work


def _full_cluster(now: float) -> SimClusterState:
    """a, b and d hold two nodes each (no node free); c waits for three (its min is one: SCRIPT's directives)."""
    waiting = JobView(job_id="c", state="PENDING", submit_time=0.0, start_time=None, requested_gpus=3 * GPUS,
                      num_nodes=0, num_gpus=0, nodes=(), gpus_per_node=(), min_nodes=1, max_nodes=3, gpu_util=0.0,
                      throughput=0.0, progress=0.0, resizes=0, last_resize_time=None, restarting_until=None,
                      account="nlp")
    jobs = (*(_view(name, nodes, BUSY) for name, nodes in UNITS.items()), waiting)
    holders = {i: (name,) for name, nodes in UNITS.items() for i in nodes}
    nodes = tuple(NodeView(i, GPUS, 0, holders[i]) for i in range(6))
    return SimClusterState(now=now, gpus_per_node=GPUS, total_gpus=6 * GPUS, free_gpus=0, nodes=nodes, jobs=jobs)


def _record_plan(monkeypatch: pytest.MonkeyPatch) -> Recording:
    rec = Recorder()
    monkeypatch.setattr(adapter, "decide", rec)
    policy = ProductionPolicy(PLAN_POLICY, SimConfig(num_nodes=6, gpus_per_node=GPUS, interval=INTERVAL,
                                                     start_delay=0.0), AdapterSettings())
    times = tuple(INTERVAL * (i + 1) for i in range(PLAN_CYCLES))
    for now in times:
        policy(_full_cluster(now), now)
    ids = [policy._ids[trace] for trace in UNITS]
    util = tuple({i: 100.0 * BUSY for i in ids} for _ in times)
    in_use = tuple({i: round(2 * GPUS * BUSY) for i in ids} for _ in times)
    return Recording(times, tuple(i.snapshot for i in rec.inputs), util, in_use, rec)


def test_a_waiting_moldable_job_enters_the_round_plan_at_its_min_in_the_controller_and_the_simulator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """allocator + moldable start: both paths give the waiting job c the same floor (its #ELASTIC min, through
    policy/moldable.py's start_floors), so the plan admits it at a share in both; the inputs and decisions are
    equal cycle by cycle. Three busy units of two nodes: c's share is two of its three nodes, one from each of two
    units (small shrinks of several), the third unit keeps both of its nodes."""
    rec = _record_plan(monkeypatch)
    ctl, _ = _replay_with(rec, monkeypatch, PLAN_POLICY)
    c = next(j.job_id for j in rec.snapshots[0].jobs if j.is_pending)
    assert all(inp.pending_min_nodes == {c: 1} for inp in rec.sim.inputs)
    for i, (mine, sims) in enumerate(zip(ctl.inputs, rec.sim.inputs, strict=True)):
        assert mine == sims, f"cycle {i}: the controller's and the simulator's policy inputs differ"
        assert ctl.decisions[i] == rec.sim.decisions[i], f"cycle {i}: the decisions differ"
    admits = [d for ds in rec.sim.decisions for d in ds if d.shrink is not None and c in d.shrink.admits]
    assert [(d.current_nodes, d.target_nodes) for d in admits] == [(2, 1), (2, 1)], admits
    assert all(d.inputs["plan_nodes"] == 1 and d.inputs["admit_share"] == 2 for d in admits)
def test_the_simulators_journal_keeps_the_days_resizes_as_the_controller_reads_them() -> None:
    """A shrink-to-admit (a real decision), applied: the simulator's journal gives the records the controller's
    journal row of that action gives (one per admitted job, with its basis). A later grow does not replace it
    (admit_victim_interval_s reads a unit's last shrink-to-admit, not its last resize); a day after it was
    decided it is gone, as from the controller's read of the last day, and so is an ended unit's history."""
    u = unit(job(100, nodes=("n1", "n2", "n3", "n4"), priority=10))
    inp = make_input([u], [node(n, used=4) for n in ("n1", "n2", "n3", "n4")],
                     pending_jobs=[pending(900, count=1, priority=100)], utils=[util(100, 60)])
    (d,) = decide(inp, cfg(shrink_to_admit=True), NOW)
    assert d.reason is Reason.SHRINK_TO_ADMIT and d.shrink is not None
    later = NOW + timedelta(seconds=d.grace_s)
    journal = SimJournal()
    SimJournal.settle(journal.record(d, NOW), Outcome.APPLIED, later)
    row = ActionRecord(id=1, job_id=100, kind=ActionKind.SHRINK, idempotency_key="shrink:100:1",
                       params={"from": d.current_nodes, "to": d.target_nodes, "reason": str(d.reason),
                               **d.shrink.to_dict()},
                       state=ActionState.APPLIED, message="", transient=False, attempts=1, nodes=1, gpus=4,
                       decision_id=None, cycle_id=None, fencing_epoch=None, created_at=NOW, updated_at=later,
                       finished_at=later)
    assert journal.history(later) == resize_history([row], {100: u})
    assert [(r.for_job, r.admit_basis is not None) for r in journal.history(later)] == [(900, True)]
    grow = replace(d, action=Action.GROW, reason=Reason.OVERUTILIZED, current_nodes=3, target_nodes=4, shrink=None)
    journal.record(grow, NOW + timedelta(hours=1))
    assert [(str(r.action), r.for_job) for r in journal.history(NOW + timedelta(hours=1))] == [
        ("shrink", 900), ("grow", None)]
    assert [str(r.action) for r in journal.history(NOW + HISTORY_SPAN + timedelta(seconds=1))] == ["grow"]
    journal.forget(100)
    assert journal.history(NOW + HISTORY_SPAN) == ()
