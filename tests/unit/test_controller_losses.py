"""Slurm-side losses (controller/losses.py): an extension job preempted by Slurm or lost with a node is recorded
once as a shrink decision (PREEMPTED_BY_SLURM / NODE_FAILURE), counts as a resize for the cooldown, and is not
punished by the grow back-off. The real thing on the live cluster: tests/cluster/test_slurm_losses_cluster.py.

Jobs, nodes and snapshots are parsed by the real adapter from replies recorded on the live test cluster; the
controller tests replay recorded scenarios: a preemption (tests/unit/resize_scenarios.py), and what takes the
cluster minutes (tests/unit/loss_scenarios.py): a node failing, a node set DOWN, a job purged from squeue. sacct
failing is its recorded reply while slurmdbd can not be reached, served in place of the scenario's sacct reply."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic.controller.config import parse_controller_config
from slurm_elastic.controller.extension import build_request
from slurm_elastic.controller.losses import LossRecorder, find_losses, loss_decisions
from slurm_elastic.directives.spec import ElasticSpec
from slurm_elastic.errors import ConfigError
from slurm_elastic.policy import Action, ElasticUnit, ExtensionJob, Outcome, Reason
from slurm_elastic.slurm.model import ClusterSnapshot, Job
from slurm_elastic.slurm.runner import CommandResult
from slurm_elastic.store import SqlStore
from slurm_elastic.store.errors import LeaseLostError
from slurm_elastic.store.records import DecisionFilter, ExtensionRecord, NewDecision
from tests.unit import loss_scenarios  # noqa: F401 - registers its scenarios
from tests.unit.resize_scenarios import recorded_job, recorded_snapshot
from tests.unit.slurm_replay import STEP_S, Recording, ReplayRunner, command_key, recorded_cli, replay
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import T0, Agents

LOSS = {str(Reason.PREEMPTED_BY_SLURM), str(Reason.NODE_FAILURE)}
# sacct while slurmdbd can not be reached, recorded from the test cluster (its PROVENANCE.md).
_NO_DBD_FILE = Path(__file__).resolve().parents[1] / "fixtures/slurm/22.05/recorded/sacct-no-dbd.txt.stderr"
NO_DBD, _, _NO_DBD_EXIT = _NO_DBD_FILE.read_text().rpartition("exit ")
NO_DBD_RC = int(_NO_DBD_EXIT)


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
def _losses(store: SqlStore, job_id: int) -> list:  # type: ignore[type-arg]
    return [d for d in store.decisions.list_decisions(DecisionFilter(job_id=job_id, limit=1000))
            if d.reason in LOSS]


def _unit_of(job_id: int) -> ElasticUnit:
    return replace(_unit(), job=recorded_job(job_id, ("n1",)))


def _last_snapshot(rec: Recording) -> ClusterSnapshot:
    """The recording's last snapshot (its last squeue and what follows it), parsed by the real adapter (after
    its first, which finds out how this release lists nodes)."""
    cli, runner = recorded_cli(rec.name)
    cli.snapshot()
    runner.pos = max(i for i, c in enumerate(rec.commands) if command_key(c["argv"])[0] == "squeue")
    snap = cli.snapshot()
    runner.check()
    return snap


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
    """Recorded: the slurmd under the extension dies; Slurm marks the node DOWN (tests/unit/loss_scenarios.py)."""
    r = replay("extension_node_fail", Agents)
    busy, ext = r.rec.jobs["busy"], r.rec.jobs["ext"]
    rec = next(e for e in r.store.jobs.extensions(busy, active_only=False) if e.job_id == ext)
    assert rec.state == "NODE_FAIL" and rec.ended_at is not None  # closed by reconcile
    decisions = r.store.decisions.list_decisions(DecisionFilter(job_id=busy, limit=1000))
    (loss,) = [d for d in decisions if d.reason in LOSS]  # once, through a restarted controller too
    assert (loss.action, loss.reason, loss.current_nodes, loss.target_nodes) == ("shrink", "NODE_FAILURE", 2, 1)
    assert loss.inputs["extension_job"] == ext and loss.inputs["lost_nodes"] == [rec.nodelist]
    # Not acted on: nothing cancelled, no leader update; the grow before and the regrow after
    assert not [c for c in r.runner.calls if c[0] == "scancel" or c[:2] == ["scontrol", "update"]]
    assert len(r.runner.ran("runuser")) == 2
    # The loss counts as a resize: cooldown holds (free nodes since bob's job ended) for cooldown_s = 20 s...
    after = sorted((d for d in decisions if d.time >= loss.time and d.reason not in LOSS), key=lambda d: d.id)
    within = [d for d in after if (d.time - loss.time).total_seconds() < 20]
    assert within and all(d.action == "hold" and d.reason == "COOLDOWN" for d in within)
    # ...and once it is over the unit regrows at once: no back-off on top (a FAILED extension waits 60 s).
    grows = [d for d in after if d.action == "grow"]
    assert grows and (grows[0].time - loss.time).total_seconds() < 60
    assert not r.store.decisions.list_decisions(DecisionFilter(job_id=busy, reason="GROW_BACKOFF"))


class _NoAccounting(ReplayRunner):
    """The recording, but its sacct reads fail as sacct does while slurmdbd is down (a reply recorded from the
    test cluster: tests/fixtures/slurm/22.05/recorded/PROVENANCE.md); the command is still checked."""

    def __call__(self, argv: Sequence[str], **kw: Any) -> CommandResult:
        result = super().__call__(argv, **kw)
        if os.path.basename(argv[0]) == "sacct":
            return CommandResult(tuple(argv), NO_DBD_RC, "", NO_DBD)
        return result


@pytest.mark.parametrize("sacct_works", [True, False])
def test_a_loss_while_the_controller_was_away_is_read_from_sacct(sacct_works: bool,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Recorded: the extension was preempted and left squeue (MinJobAge) while no controller ran: the restarted
    one asks sacct how it ended and records the loss. Without accounting it closes the record as ENDED, says so
    once, and records nothing it can not know."""
    r = replay("extension_preempted_while_away", Agents, ReplayRunner if sacct_works else _NoAccounting)
    busy, ext = r.rec.jobs["busy"], r.rec.jobs["ext"]
    (rec,) = [e for e in r.store.jobs.extensions(busy, active_only=False) if e.job_id == ext]
    assert r.runner.ran("sacct") == [["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", str(ext)]]  # once
    if sacct_works:
        assert rec.state == "PREEMPTED" and rec.ended_at is not None
        (loss,) = _losses(r.store, busy)
        assert (loss.reason, loss.inputs["extension_job"], loss.inputs["slurm_state"]) == (
            "PREEMPTED_BY_SLURM", ext, "PREEMPTED")
        assert loss.inputs["lost_nodes"] == [rec.nodelist] and (loss.current_nodes, loss.target_nodes) == (2, 1)
    else:
        assert rec.state == "ENDED" and rec.ended_at is not None and _losses(r.store, busy) == []
        assert caplog.text.count("sacct unreadable") == 1


def test_node_down_under_a_running_extension_then_node_fail_is_one_loss() -> None:
    """Recorded: three cycles see the extension's node NOT_RESPONDING (not yet a loss), the next sees it DOWN."""
    r = replay("extension_node_fail", Agents)
    busy, ext = r.rec.jobs["busy"], r.rec.jobs["ext"]
    (loss,) = _losses(r.store, busy)
    assert loss.time == r.rec.clock_start + timedelta(seconds=13 * STEP_S)  # the cycle after the 3 silent ones
    node = loss.inputs["lost_nodes"][0]
    assert loss.reason == "NODE_FAILURE" and loss.inputs["extension_job"] == ext
    assert loss.inputs["node_states"] == {node: "DOWN+NOT_RESPONDING"}
    assert (loss.current_nodes, loss.target_nodes) == (2, 1)
    ctl, clock, unit = r.world.ctl, r.world.clock, _unit_of(busy)
    history = ctl.losses.history({busy: unit}, clock())
    assert [(h.action, h.outcome, h.from_nodes, h.to_nodes, h.reason) for h in history] == [
        (Action.SHRINK, Outcome.APPLIED, 2, 1, "NODE_FAILURE")]
    assert ctl.losses.history({}, clock()) == ()  # only running units
    assert ctl.losses.history({busy: unit}, clock() + timedelta(days=2)) == ()


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


def _record(store: SqlStore, rec: LossRecorder, cycle: int, unit: ElasticUnit, snap: ClusterSnapshot, now: Any,
            fencing: Any = None) -> list[NewDecision]:
    """The cycle's losses step: decide, then record (controller/cycle.py: _write_rulings)."""
    new = [v.decision for v in rec.decide({unit.unit_id: unit}, snap, now)]
    if new:
        store.decisions.record_decisions(cycle, new, fencing=fencing)
    return new


def test_dry_run_records_losses_too() -> None:
    clock = FakeClock(T0)
    store, snap, unit = _preempted_extension(clock)
    rec = LossRecorder(store)
    cycle = store.decisions.begin_cycle(holder="t", dry_run=True)
    assert len(_record(store, rec, cycle, unit, snap, clock())) == 1
    assert _record(store, rec, cycle, unit, snap, clock()) == []


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
        _record(store, LossRecorder(store), cycle, unit, snap, clock(), fencing=old.token())
    assert _losses(store, 10) == []
    cycle = store.decisions.begin_cycle(holder="ctl-b")
    assert len(_record(store, LossRecorder(store), cycle, unit, snap, clock(), fencing=new.token())) == 1
    assert _record(store, LossRecorder(store), cycle, unit, snap, clock(), fencing=new.token()) == []
    assert len(_losses(store, 10)) == 1


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


def test_a_leader_that_loses_a_non_batch_node_with_no_kill_is_recorded_once() -> None:
    """Recorded: with --no-kill Slurm drops a dead non-batch node from the leader and the job goes on; the
    controller records it as NODE_FAILURE against the leader, once, and the cooldown applies."""
    r = replay("leader_no_kill_node_fail", Agents)
    leader, node = r.rec.jobs["leader"], r.rec.nodes["leader"][1]
    (loss,) = _losses(r.store, leader)  # once, however many cycles see it
    assert (loss.action, loss.reason, loss.current_nodes, loss.target_nodes) == ("shrink", "NODE_FAILURE", 2, 1)
    assert loss.inputs["lost_nodes"] == [node] and loss.inputs["extension_job"] == leader
    assert f"leader job {leader} (--no-kill) lost node(s) {node}" in loss.message
    assert loss.time < r.world.clock() - timedelta(seconds=10 * STEP_S)


def test_a_node_the_controller_released_is_not_a_leader_loss() -> None:
    """Recorded: the node a shrink released is set DOWN afterwards; it is not the job's loss."""
    r = replay("released_nodes_down", Agents)
    idle = r.rec.jobs["idle"]
    snap = _last_snapshot(r.rec)
    (job,) = [j for j in snap.jobs if j.job_id == idle]
    released = sorted(set(r.rec.nodes["idle"]) - set(job.nodes))
    assert job.node_count == 2 and len(released) == 1
    assert all(n.state == "DOWN" for n in snap.nodes if n.name in released)
    assert _losses(r.store, idle) == []


def test_a_leader_that_left_squeue_ends_as_sacct_has_it() -> None:
    """Recorded: the leader was cancelled and purged from squeue (MinJobAge on 22.05; from 23.02 on a finished
    job is not in squeue --all at all) before the next cycle: its record ends with sacct's state."""
    r = replay("leader_purged", Agents)
    leader = r.rec.jobs["leader"]
    rec = r.store.jobs.get_job(leader)
    assert rec is not None and rec.state == "CANCELLED"
    assert [c[-1] for c in r.runner.ran("sacct")] == [str(leader)]
