"""Slurm-side losses (controller/losses.py): an extension job preempted by Slurm or lost with a node is recorded
once as a shrink decision (PREEMPTED_BY_SLURM / NODE_FAILURE), counts as a resize for the cooldown, and is not
punished by the grow back-off. The real thing on the live cluster: tests/cluster/test_slurm_losses_cluster.py.

Jobs, nodes and snapshots are parsed by the real adapter from replies recorded on the live test cluster; the
controller tests replay recorded scenarios (tests/unit/resize_scenarios.py) where the cluster can produce the loss
on demand (a preemption). DownSlurm/AccountingSlurm (on FakeSlurm) stay for what the shared cluster can not be
made to do within a recording: a node failing (a killed slurmd takes ~95 s to NODE_FAIL, and takes the node from
the others' tests), a purge from squeue (MinJobAge, 120 s), sacct failing; each such test says so."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from slurm_elastic.controller.config import ControllerConfig, parse_controller_config
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.controller.extension import build_request
from slurm_elastic.controller.losses import LossRecorder, find_losses, loss_decisions
from slurm_elastic.directives.spec import ElasticSpec
from slurm_elastic.errors import ConfigError
from slurm_elastic.policy import Action, ElasticUnit, ExtensionJob, Outcome, Reason
from slurm_elastic.slurm.errors import SlurmError
from slurm_elastic.slurm.model import ClusterSnapshot, Job
from slurm_elastic.store import SqlStore
from slurm_elastic.store.errors import LeaseLostError
from slurm_elastic.store.records import DecisionFilter, ExtensionRecord
from tests.unit.resize_scenarios import recorded_job, recorded_snapshot
from tests.unit.slurm_replay import replay
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import POLICY, T0, Agents, FakeSlurm, run

LOSS = {str(Reason.PREEMPTED_BY_SLURM), str(Reason.NODE_FAILURE)}


# FakeSlurm: nodes that fail (see the module docstring).
class DownSlurm(FakeSlurm):
    """FakeSlurm whose nodes can be down (its snapshot otherwise derives node states from the jobs)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.node_state: dict[str, tuple[str, tuple[str, ...]]] = {}

    def snapshot(self) -> ClusterSnapshot:
        snap = super().snapshot()
        nodes = tuple(replace(n, state=self.node_state[n.name][0], state_flags=self.node_state[n.name][1])
                      if n.name in self.node_state else n for n in snap.nodes)
        return replace(snap, nodes=nodes)


# --- find_losses, table-driven ---------------------------------------------------------------------------------
def _job(job_id: int, state: str, nodes: tuple[str, ...]) -> Job:
    """A job recorded from the test cluster, renumbered, in ``state`` on ``nodes``."""
    return replace(recorded_job(job_id, nodes or ("n2",)), state=state, nodes=nodes, node_count=max(1, len(nodes)))


def _rec(job_id: int, state: str, nodelist: str, *, parent: int = 10, ended: bool = False) -> ExtensionRecord:
    return ExtensionRecord(job_id=job_id, parent_job_id=parent, node_count=len(nodelist.split(",")),
                           nodelist=nodelist, state=state, action_id=1, idempotency_key=f"grow:{parent}:{job_id}",
                           created_at=T0, updated_at=T0, ended_at=T0 if ended else None)


def _snap(jobs: list[Job], down: dict[str, tuple[str, tuple[str, ...]]] | None = None,
          gone: tuple[str, ...] = ()) -> ClusterSnapshot:
    """The test cluster's nodes and partitions as recorded, all in use (MIXED) but ``down``, without ``gone``."""
    base = recorded_snapshot()
    nodes = tuple(replace(n, state=(down or {}).get(n.name, ("MIXED", ()))[0],
                          state_flags=(down or {}).get(n.name, ("MIXED", ()))[1])
                  for n in base.nodes if n.name not in gone)
    return ClusterSnapshot(taken_at=T0, jobs=tuple(jobs), nodes=nodes, partitions=base.partitions)


def _unit(exts: tuple[ExtensionJob, ...] = ()) -> ElasticUnit:
    leader = recorded_job(10, ("n1",))
    return ElasticUnit(job=leader, spec=ElasticSpec(min_nodes=1, max_nodes=4), extensions=exts)


def _ext(job: Job) -> ExtensionJob:
    return ExtensionJob(job_id=job.job_id, state=job.state, nodes=job.nodes, node_count=job.node_count)


DOWN = ("DOWN", ("NOT_RESPONDING",))
CASES = [
    # id, Slurm job (state, nodes) or None (left squeue), store record (state, nodelist, ended), down nodes,
    # already recorded, expected (reason, lost nodes, counted) per loss
    ("preempted", ("PREEMPTED", ("n2",)), ("RUNNING", "n2", False), {}, set(),
     [(Reason.PREEMPTED_BY_SLURM, ("n2",), 0)]),
    ("node_fail", ("NODE_FAIL", ("n2",)), ("RUNNING", "n2", False), {"n2": DOWN}, set(),
     [(Reason.NODE_FAILURE, ("n2",), 0)]),
    ("running on a down node", ("RUNNING", ("n2", "n3")), ("RUNNING", "n2,n3", False), {"n3": DOWN}, set(),
     [(Reason.NODE_FAILURE, ("n3",), 1)]),
    ("running on a FAIL node", ("RUNNING", ("n2",)), ("RUNNING", "n2", False), {"n2": ("FAIL", ())}, set(),
     [(Reason.NODE_FAILURE, ("n2",), 1)]),
    ("dead node already dropped from the job (--no-kill)", ("RUNNING", ("n2",)), ("RUNNING", "n2,n3", False),
     {"n3": DOWN}, set(), [(Reason.NODE_FAILURE, ("n3",), 0)]),
    ("node removed from slurm.conf", ("RUNNING", ("n2",)), ("RUNNING", "n2", False), "gone:n2", set(),
     [(Reason.NODE_FAILURE, ("n2",), 1)]),
    ("only not responding: not yet a loss", ("RUNNING", ("n2",)), ("RUNNING", "n2", False),
     {"n2": ("MIXED", ("NOT_RESPONDING",))}, set(), []),
    ("drained: not a loss", ("RUNNING", ("n2",)), ("RUNNING", "n2", False), {"n2": ("MIXED", ("DRAIN",))}, set(),
     []),
    ("healthy", ("RUNNING", ("n2",)), ("RUNNING", "n2", False), {}, set(), []),
    ("pending on a down node (reconcile cancels it)", ("PENDING", ()), ("PENDING", "n2", False), {"n2": DOWN},
     set(), []),
    ("completed", ("COMPLETED", ("n2",)), ("RUNNING", "n2", False), {}, set(), []),
    ("cancelled by us", ("CANCELLED", ("n2",)), ("CANCELLED", "n2", True), {}, set(), []),
    ("failed on its own", ("FAILED", ("n2",)), ("RUNNING", "n2", False), {}, set(), []),
    ("timeout", ("TIMEOUT", ("n2",)), ("RUNNING", "n2", False), {}, set(), []),
    ("closed by reconcile as PREEMPTED, gone from squeue", None, ("PREEMPTED", "n2", True), {}, set(),
     [(Reason.PREEMPTED_BY_SLURM, ("n2",), 0)]),
    ("closed by reconcile as NODE_FAIL, gone from squeue", None, ("NODE_FAIL", "n2,n3", True), {}, set(),
     [(Reason.NODE_FAILURE, ("n2", "n3"), 0)]),
    ("gone from squeue unseen: cause unknown", None, ("ENDED", "n2", True), {}, set(), []),
    ("already recorded", ("PREEMPTED", ("n2",)), ("PREEMPTED", "n2", True), {}, {(11, "n2")}, []),
    ("one node recorded, the other lost later", ("NODE_FAIL", ("n2", "n3")), ("RUNNING", "n2,n3", False),
     {"n2": DOWN, "n3": DOWN}, {(11, "n3")}, [(Reason.NODE_FAILURE, ("n2",), 0)]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_find_losses(case: tuple) -> None:  # type: ignore[type-arg]
    _, slurm_job, (rec_state, nodelist, ended), down, already, expected = case
    jobs = [_job(11, *slurm_job)] if slurm_job else []
    gone = (down[5:],) if isinstance(down, str) else ()
    snap = _snap(jobs, None if isinstance(down, str) else down, gone)
    unit = _unit(tuple(_ext(j) for j in jobs))
    losses = find_losses(unit, [_rec(11, rec_state, nodelist, ended=ended)], snap, already)
    assert [(loss.reason, loss.lost_nodes, loss.counted) for loss in losses] == expected
    for loss in losses:
        assert loss.extension_job == 11 and loss.unit_id == 10
        assert set(loss.node_states) == set(loss.lost_nodes)
        assert loss.slurm_state == (slurm_job[0] if slurm_job else rec_state)


def test_records_of_other_units_are_not_this_units_losses() -> None:
    snap = _snap([_job(11, "PREEMPTED", ("n2",))])
    assert find_losses(_unit(), [_rec(11, "PREEMPTED", "n2", parent=99)], snap) == []


def test_loss_decisions_chain_the_node_counts_down_to_the_current_size() -> None:
    # leader n1 + running extension 12 on n3,n4 (n4 down, still counted) + extension 11 on n2 preempted
    preempted, running = _job(11, "PREEMPTED", ("n2",)), _job(12, "RUNNING", ("n3", "n4"))
    unit = _unit((_ext(preempted), _ext(running)))
    assert unit.current_nodes == 3
    snap = _snap([preempted, running], {"n4": DOWN})
    losses = find_losses(unit, [_rec(11, "RUNNING", "n2"), _rec(12, "RUNNING", "n3,n4")], snap)
    d1, d2 = loss_decisions(unit, losses)
    assert (d1.action, d1.reason, d1.current_nodes, d1.target_nodes) == ("shrink", "PREEMPTED_BY_SLURM", 4, 3)
    assert (d2.action, d2.reason, d2.current_nodes, d2.target_nodes) == ("shrink", "NODE_FAILURE", 3, 2)
    assert d1.inputs["extension_job"] == 11 and d1.inputs["slurm_state"] == "PREEMPTED"
    assert d2.inputs["lost_nodes"] == ["n4"] and d2.inputs["node_states"] == {"n4": "DOWN+NOT_RESPONDING"}
    assert d2.inputs["extension_nodes"] == ["n3", "n4"] and "12" in d2.message and "n4" in d2.message


# --- through the controller: once, cooldown, no back-off -------------------------------------------------------
def _world(clock: FakeClock, store: SqlStore | None = None) -> tuple[Controller, DownSlurm, Agents, SqlStore]:
    store = store or memory_store(clock)
    slurm, agents = DownSlurm(clock), Agents(clock)
    ctl = Controller(ControllerConfig(interval_s=2.0, holder="test"), POLICY, slurm=slurm,
                     store=store, collector=agents, clock=clock)
    return ctl, slurm, agents, store


def _grown(clock: FakeClock) -> tuple[Controller, DownSlurm, Agents, SqlStore, int]:
    ctl, slurm, agents, store = _world(clock)
    slurm.add_job(10, ["n1"])
    agents.util[("n1", 10)] = 95.0
    run(ctl, clock, 8)
    ext_id = slurm.next_id
    (node,) = slurm.jobs[ext_id].nodes
    agents.util[(node, ext_id)] = 95.0
    assert [c[0] for c in slurm.calls].count("submit") == 1
    return ctl, slurm, agents, store, ext_id


def _losses(store: SqlStore) -> list:  # type: ignore[type-arg]
    return [d for d in store.decisions.list_decisions(DecisionFilter(job_id=10)) if d.reason in LOSS]


def test_a_preempted_extension_is_recorded_once_starts_the_cooldown_and_is_not_backed_off() -> None:
    """Recorded: Slurm preempts the scavenger extension for a --qos=high job (tests/unit/resize_scenarios.py)."""
    r = replay("extension_preempted", Agents)
    busy, ext, high = r.rec.jobs["busy"], r.rec.jobs["ext"], r.rec.jobs["high"]
    (rec,) = r.store.jobs.extensions(busy, active_only=False)
    assert rec.job_id == ext and rec.state == "PREEMPTED" and rec.ended_at is not None  # closed by reconcile
    decisions = r.store.decisions.list_decisions(DecisionFilter(job_id=busy, limit=1000))
    (loss,) = [d for d in decisions if d.reason in LOSS]  # once, through a restarted controller too
    assert (loss.action, loss.reason, loss.current_nodes, loss.target_nodes) == ("shrink", "PREEMPTED_BY_SLURM", 2, 1)
    assert loss.inputs["extension_job"] == ext and loss.inputs["slurm_state"] == "PREEMPTED"
    assert loss.inputs["lost_nodes"] == [rec.nodelist]
    # Not acted on: the controller cancelled nothing, updated nothing, submitted the one grow (bob's is the test's)
    assert not [c for c in r.runner.calls if c[0] == "scancel" or c[:2] == ["scontrol", "update"]]
    assert [c[2] for c in r.runner.ran("runuser")] == ["alice", "bob"]
    # The loss counts as a resize: cooldown holds for cooldown_s = 20 s after it...
    after = sorted((d for d in decisions if d.time >= loss.time and d.reason not in LOSS), key=lambda d: d.id)
    within = [d for d in after if (d.time - loss.time).total_seconds() < 20]
    assert within and all(d.action == "hold" and d.reason == "COOLDOWN" for d in within)
    # ...and then it would grow at once (no back-off), but the high job holds the node
    later = [d for d in after if (d.time - loss.time).total_seconds() >= 20]
    assert later and all(d.reason == "NO_FREE_NODES" for d in later), [d.reason for d in later]
    assert high not in {e.job_id for e in r.store.jobs.extensions(busy, active_only=False)}


def test_a_node_failed_extension_is_recorded_once_starts_the_cooldown_and_is_not_backed_off() -> None:
    """FakeSlurm: a node failure on the shared live cluster (a killed slurmd, ~95 s to NODE_FAIL) is not
    recorded on demand; tests/cluster/test_slurm_losses_cluster.py has it for real."""
    end_state, reason = "NODE_FAIL", "NODE_FAILURE"
    clock = FakeClock(T0)
    ctl, slurm, agents, store, ext_id = _grown(clock)
    node = slurm.jobs[ext_id].nodes[0]
    run(ctl, clock, 12)  # grows to max (3)...
    for running in slurm.jobs.values():
        agents.util[(running.nodes[0], running.job_id)] = 95.0
    run(ctl, clock, 14)  # ...and holds there for longer than the cooldown (20 s)
    submits = [c[0] for c in slurm.calls].count("submit")
    assert submits == 2
    (before,) = store.decisions.last_decisions(10, 1)
    assert before.reason == "AT_MAX"  # no cooldown left from the grows: any cooldown below is the loss's
    # Slurm ends every extension (the newest one last).
    lost = sorted(i for i in slurm.jobs if i != 10 and slurm.jobs[i].state == "RUNNING")
    for i in lost:
        slurm.jobs[i] = replace(slurm.jobs[i], state=end_state)
    if end_state == "NODE_FAIL":
        slurm.node_state = {slurm.jobs[i].nodes[0]: DOWN for i in lost}
    loss_at = clock()
    run(ctl, clock, 1)
    ctl.reconcile()  # closes the records with Slurm's state
    run(ctl, clock, 3)
    ctl2, _, _, _ = _world(clock, store)  # a restarted controller on the same store records nothing again
    ctl2.slurm = slurm
    ctl2.reconcile()
    ctl2.run_cycle()
    recorded = _losses(store)
    assert len(recorded) == len(lost) and {d.reason for d in recorded} == {reason}
    assert sorted(d.inputs["extension_job"] for d in recorded) == lost
    first = min(recorded, key=lambda d: d.id)
    assert first.action == "shrink" and first.current_nodes == 1 + len(lost) and first.target_nodes == len(lost)
    assert first.inputs["slurm_state"] == end_state and first.inputs["lost_nodes"]
    assert node in {n for d in recorded for n in d.inputs["lost_nodes"]}
    # Not acted on: nothing cancelled, the controller did not do this.
    assert not [c for c in slurm.calls if c[0] in {"cancel", "shrink"}]
    # The loss counts as a resize: cooldown holds (not a grow) for cooldown_s = 20 s after it...
    later = [d for d in store.decisions.list_decisions(DecisionFilter(job_id=10, since=loss_at))
             if d.reason not in LOSS]
    assert later and all(d.action == "hold" and d.reason == "COOLDOWN" for d in later)
    assert [c[0] for c in slurm.calls].count("submit") == submits
    # ...and once it is over the unit regrows at once: no back-off on top (a FAILED extension waits 60 s).
    run(ctl, clock, 8)
    assert [c[0] for c in slurm.calls].count("submit") > submits
    grows = store.decisions.list_decisions(DecisionFilter(job_id=10, action="grow", since=loss_at))
    assert grows and not store.decisions.list_decisions(DecisionFilter(job_id=10, reason="GROW_BACKOFF"))
    assert (clock() - loss_at).total_seconds() < 60


# FakeSlurm: the extension purged from slurmctld (MinJobAge, 120 s) while no controller ran, and sacct failing.
class AccountingSlurm(DownSlurm):
    """DownSlurm with an accounting database: the final states of jobs that left squeue (sacct)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.accounting: dict[int, str] = {}
        self.sacct_error: SlurmError | None = None
        self.sacct_calls: list[list[int]] = []

    def final_states(self, job_ids: list[int]) -> dict[int, str]:
        self.sacct_calls.append(list(job_ids))
        if self.sacct_error is not None:
            raise self.sacct_error
        return {i: self.accounting[i] for i in job_ids if i in self.accounting}


@pytest.mark.parametrize("sacct_works", [True, False])
def test_a_loss_while_the_controller_was_away_is_read_from_sacct(sacct_works: bool,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """The extension was preempted and left squeue (MinJobAge) while no controller ran: the restarted one asks
    sacct how it ended and records the loss. Without accounting it closes the record as ENDED, says so once,
    and records nothing it can not know."""
    clock = FakeClock(T0)
    ctl, slurm, agents, store, ext_id = _grown(clock)
    away = AccountingSlurm(clock)
    away.jobs, away.next_id = slurm.jobs, slurm.next_id
    nodes = slurm.jobs[ext_id].nodes
    del away.jobs[ext_id]  # preempted, then purged from slurmctld's memory before anyone looked
    away.accounting[ext_id] = "PREEMPTED"
    if not sacct_works:
        away.sacct_error = SlurmError("sacct: error: Problem talking to the database")
    clock.advance(300)
    restarted, _, _, _ = _world(clock, store)
    restarted.slurm = away
    restarted.reconcile()
    restarted.reconcile()
    restarted.run_cycle()
    (rec,) = [r for r in store.jobs.extensions(10, active_only=False) if r.job_id == ext_id]
    assert away.sacct_calls == [[ext_id]]  # asked once, only for the vanished job
    if sacct_works:
        assert rec.state == "PREEMPTED" and rec.ended_at is not None
        (loss,) = _losses(store)
        assert (loss.reason, loss.inputs["extension_job"], loss.inputs["slurm_state"]) == (
            "PREEMPTED_BY_SLURM", ext_id, "PREEMPTED")
        assert loss.inputs["lost_nodes"] == list(nodes) and (loss.current_nodes, loss.target_nodes) == (2, 1)
    else:
        assert rec.state == "ENDED" and rec.ended_at is not None and _losses(store) == []
        assert caplog.text.count("sacct unreadable") == 1


# FakeSlurm: a node going NOT_RESPONDING, DOWN, then NODE_FAIL (a killed slurmd on the shared cluster).
def test_node_down_under_a_running_extension_then_node_fail_is_one_loss() -> None:
    clock = FakeClock(T0)
    ctl, slurm, agents, store, ext_id = _grown(clock)
    node = slurm.jobs[ext_id].nodes[0]
    slurm.node_state = {node: ("MIXED", ("NOT_RESPONDING",))}
    run(ctl, clock, 3)
    assert _losses(store) == []  # silent, not yet given up by Slurm (SlurmdTimeout)
    slurm.node_state = {node: DOWN}
    run(ctl, clock, 3)
    slurm.jobs[ext_id] = replace(slurm.jobs[ext_id], state="NODE_FAIL")
    run(ctl, clock, 2)
    ctl.reconcile()
    run(ctl, clock, 2)
    (loss,) = _losses(store)
    assert loss.reason == "NODE_FAILURE" and loss.inputs["extension_job"] == ext_id
    assert loss.inputs["slurm_state"] == "RUNNING" and loss.inputs["node_states"] == {node: "DOWN+NOT_RESPONDING"}
    assert (loss.current_nodes, loss.target_nodes) == (2, 1)
    history = ctl.losses.history({10: _unit()}, clock())
    assert [(h.action, h.outcome, h.from_nodes, h.to_nodes, h.reason) for h in history] == [
        (Action.SHRINK, Outcome.APPLIED, 2, 1, "NODE_FAILURE")]
    assert ctl.losses.history({}, clock()) == ()  # only running units
    assert ctl.losses.history({10: _unit()}, clock() + timedelta(days=2)) == ()


def test_a_failed_extension_is_still_backed_off_and_is_not_a_loss() -> None:
    """The recorded extension job exits 3 at once: its FAILED end is its own, not Slurm's taking."""
    r = replay("grow_extension_fails", Agents)
    busy = r.rec.jobs["busy"]
    assert len(r.runner.ran("runuser")) == 1  # 15 cycles past the cooldown, inside the 60 s back-off
    assert r.store.decisions.list_decisions(DecisionFilter(job_id=busy, reason="GROW_BACKOFF"))
    assert [d for d in r.store.decisions.list_decisions(DecisionFilter(job_id=busy)) if d.reason in LOSS] == []


def _preempted_extension(clock: FakeClock) -> tuple[SqlStore, ClusterSnapshot, ElasticUnit]:
    """Job 10 whose extension 11 (on n2, recorded RUNNING) Slurm has just preempted."""
    store = memory_store(clock)
    ext = _job(11, "PREEMPTED", ("n2",))
    store.jobs.record_extension(job_id=11, parent_job_id=10, node_count=1, state="RUNNING", nodelist="n2")
    return store, _snap([recorded_job(10, ("n1",)), ext]), _unit((_ext(ext),))


def test_dry_run_records_losses_too() -> None:
    clock = FakeClock(T0)
    store, snap, unit = _preempted_extension(clock)
    rec = LossRecorder(store)
    cycle = store.decisions.begin_cycle(holder="t", dry_run=True)
    assert len(rec.record(cycle, {10: unit}, snap, clock())) == 1
    assert rec.record(cycle, {10: unit}, snap, clock()) == []


def test_a_controller_that_lost_the_lease_records_no_loss_and_the_new_holder_records_it_once() -> None:
    """HA handover: the old holder found the loss unrecorded, but its lease expired and the standby took it
    before it wrote. Its write is fenced off (nothing written); the new holder records the loss exactly once."""
    clock = FakeClock(T0)
    store, snap, unit = _preempted_extension(clock)
    old = store.lease.acquire("ctl-a", timedelta(seconds=10))
    assert old is not None
    clock.advance(11)
    new = store.lease.acquire("ctl-b", timedelta(seconds=10))
    assert new is not None
    cycle = store.decisions.begin_cycle(holder="ctl-a")
    with pytest.raises(LeaseLostError):
        LossRecorder(store).record(cycle, {10: unit}, snap, clock(), fencing=old.token())
    assert _losses(store) == []
    cycle = store.decisions.begin_cycle(holder="ctl-b")
    assert len(LossRecorder(store).record(cycle, {10: unit}, snap, clock(), fencing=new.token())) == 1
    assert LossRecorder(store).record(cycle, {10: unit}, snap, clock(), fencing=new.token()) == []
    assert len(_losses(store)) == 1


# --- the extension QOS ---------------------------------------------------------------------------------------------
def test_extension_qos_config() -> None:
    assert parse_controller_config("version = 1\n").extension_qos == ""
    assert parse_controller_config("version = 1\n[extension]\nqos = 'scavenger'\n").extension_qos == "scavenger"
    for bad in ("'scav enger'", "'--qos=high'", "'a;b'", "1", "'" + "q" * 65 + "'"):
        with pytest.raises(ConfigError, match="extension.qos"):
            parse_controller_config(f"version = 1\n[extension]\nqos = {bad}\n")
    with pytest.raises(ConfigError, match=r"extension.nope: unknown key \(known: env, qos, notice_grace_s\)"):
        parse_controller_config("version = 1\n[extension]\nnope = 1\n")


def test_extension_request_uses_the_extension_qos_and_keeps_no_kill_no_requeue() -> None:
    leader = recorded_job(10, ("n1",))  # QOS normal
    own = build_request(leader, ["n2"], "grow:10:1", T0, rendezvous="h:1")
    scav = build_request(leader, ["n2"], "grow:10:1", T0, rendezvous="h:1", qos="scavenger")
    assert "--qos=normal" in own.sbatch_args and "--qos=scavenger" not in own.sbatch_args
    assert "--qos=scavenger" in scav.sbatch_args and "--qos=normal" not in scav.sbatch_args
    assert {"--no-kill", "--no-requeue"} <= set(scav.sbatch_args)


def test_the_controller_submits_extensions_in_the_configured_qos() -> None:
    r = replay("grow_in_extension_qos", Agents)
    (submit,) = r.runner.ran("runuser")
    assert "--qos=scavenger" in submit and "--qos=normal" not in submit
    assert not [c for c in r.runner.calls if c[:2] == ["scontrol", "update"]]  # the leader is never moved
    busy = r.rec.jobs["busy"]
    assert [e.job_id for e in r.store.jobs.extensions(busy)] == [r.rec.jobs["ext"]]


def test_extensions_ended_since_keeps_the_active_and_the_recently_ended() -> None:
    clock = FakeClock(T0)
    store = memory_store(clock)
    for job_id in (11, 12, 13):
        store.jobs.record_extension(job_id=job_id, parent_job_id=10, node_count=1, state="RUNNING", nodelist="n2")
    store.jobs.update_extension(11, state="PREEMPTED", ended=True)  # ended at T0
    clock.advance(7200)
    store.jobs.update_extension(12, state="NODE_FAIL", ended=True)  # ended at T0 + 2 h
    recent = store.jobs.extensions(active_only=False, ended_since=clock() - timedelta(hours=1))
    assert sorted(e.job_id for e in recent) == [12, 13]
    assert len(store.jobs.extensions(active_only=False)) == 3
    assert [e.job_id for e in store.jobs.extensions(active_only=True, ended_since=T0)] == [13]


# FakeSlurm: a dead non-batch node under a --no-kill leader (a killed slurmd on the shared cluster).
def test_a_leader_that_loses_a_non_batch_node_with_no_kill_is_recorded_once() -> None:
    """With --no-kill Slurm drops a dead non-batch node from the leader and the job goes on (measured on 22.05);
    the controller records it as NODE_FAILURE against the leader, once, and the cooldown applies."""
    clock = FakeClock(T0)
    ctl, slurm, agents, store = _world(clock)
    slurm.add_job(10, ["n1", "n2"])
    agents.util.update({("n1", 10): 60.0, ("n2", 10): 60.0})
    run(ctl, clock, 3)
    slurm.jobs[10] = replace(slurm.jobs[10], nodes=("n1",), node_count=1)
    slurm.node_state["n2"] = ("DOWN", ("NOT_RESPONDING",))
    agents.util.pop(("n2", 10))
    run(ctl, clock, 3)
    (loss,) = _losses(store)
    assert (loss.action, loss.reason, loss.current_nodes, loss.target_nodes) == ("shrink", "NODE_FAILURE", 2, 1)
    assert loss.inputs["lost_nodes"] == ["n2"] and loss.inputs["extension_job"] == 10
    assert "leader job 10 (--no-kill) lost node(s) n2" in loss.message
    run(ctl, clock, 20)
    assert len(_losses(store)) == 1  # once, however many cycles see it


# FakeSlurm: released nodes that go DOWN later (downing nodes of the shared cluster).
def test_a_node_the_controller_released_is_not_a_leader_loss() -> None:
    clock = FakeClock(T0)
    ctl, slurm, agents, store = _world(clock)
    slurm.add_job(10, ["n1", "n2", "n3"])
    agents.util.update({(n, 10): 5.0 for n in ("n1", "n2", "n3")})  # underused: the controller shrinks it
    run(ctl, clock, 20)
    assert slurm.jobs[10].node_count < 3
    for n in ("n2", "n3"):
        slurm.node_state[n] = ("DOWN", ())  # released nodes that go down later are not the job's loss
    run(ctl, clock, 5)
    assert _losses(store) == []


# FakeSlurm: a leader gone from squeue (23.02+ at once; on the 22.05 test cluster only after MinJobAge, 120 s).
def test_a_leader_that_left_squeue_ends_as_sacct_has_it() -> None:
    """From 23.02 on a finished job is not in squeue --all at all: its record ends with sacct's state."""
    clock = FakeClock(T0)
    ctl, slurm, agents, store, ext_id = _grown(clock)
    away = AccountingSlurm(clock)
    away.jobs, away.next_id = dict(slurm.jobs), slurm.next_id
    del away.jobs[10]
    away.accounting[10] = "TIMEOUT"
    ctl.slurm = away
    ctl.run_cycle()
    rec = store.jobs.get_job(10)
    assert rec is not None and rec.state == "TIMEOUT"
    assert [10] in away.sacct_calls
