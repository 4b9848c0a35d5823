"""The cancel of an extension job: journaled before scancel runs, finished by reconcile after a crash
(controller/cancels.py), for a failed grow's extension and for reconcile's three recoveries (a duplicate, an orphan,
one pending on a dead node). Slurm's reply is scancel's, recorded from the live test cluster (the scenario
reconcile_dangling_grows, tests/fixtures/slurm/22.05/scenarios/)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from slurm_elastic.api.usage import resize_time
from slurm_elastic.controller.actuator import Actuator
from slurm_elastic.controller.cancels import cancel_key
from slurm_elastic.controller.extension import ExtensionTag
from slurm_elastic.controller.reconcile import FinalStates, reconcile_pass
from slurm_elastic.controller.rulings import CancelExtension, CycleContext
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.model import ClusterSnapshot, Job
from slurm_elastic.slurm.runner import CommandRunner, RetryPolicy, SlurmCommands
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import ActionKind, ActionRecord, ActionState, JobObservation
from tests.unit.policy_builders import NOW, job, node, snapshot
from tests.unit.slurm_replay import SCENARIO_DIR, Recording, ReplayRunner
from tests.unit.storehelpers import FakeClock, memory_store

EXT = 882  # the extension job whose scancel the scenario recorded


class Crash(Exception):
    pass


def _scancel_cli() -> tuple[SlurmCli, ReplayRunner]:
    """The real SlurmCli whose only recorded command is ``scancel 882`` (its reply from the live cluster)."""
    rec = Recording.load(SCENARIO_DIR / "reconcile_dangling_grows.json")
    (cmd,) = [c for c in rec.commands if c["argv"] == ["scancel", str(EXT)]]
    runner = ReplayRunner(replace(rec, commands=[cmd]))
    runner_: CommandRunner = runner
    return SlurmCli(SlurmCommands(env={}, runner=runner_, retry=RetryPolicy(), sleep=lambda _s: None)), runner


def _store() -> SqlStore:
    store = memory_store(FakeClock(NOW))
    store.jobs.record_extension(job_id=EXT, parent_job_id=100, node_count=1, state="PENDING", nodelist="n5")
    return store


CANCEL = CancelExtension(100, EXT, "RESUME_FAILED", ("n5",))


def _pass(snap: ClusterSnapshot, slurm: SlurmCli, store: SqlStore, act: Actuator) -> list[str]:
    """One reconcile pass whose recovery cancels go through ``act`` (as Controller.reconcile wires it)."""
    return reconcile_pass(snap, slurm=slurm, store=store, older_than=timedelta(0), final_states=FinalStates(),
                          cancel=lambda c: act.recover_extension(c, None))


def test_the_cancel_is_journaled_then_run_once() -> None:
    store = _store()
    slurm, runner = _scancel_cli()
    steps: list[tuple[str, ActionState | None]] = []

    def fault(step: str) -> None:  # what the journal holds when scancel has not run yet
        found = store.journal.find_by_idempotency_key(cancel_key(EXT))
        steps.append((step, found.state if found else None))
        assert runner.pos == 0

    act = Actuator(slurm, store, {}, fault=fault)
    ctx = CycleContext(cycle_id=store.decisions.begin_cycle(), token=None, now=NOW)
    assert act.cancel_extension(CANCEL, None, ctx) == f"extension job {EXT} cancelled"
    runner.finish()  # scancel ran, once
    assert steps == [("cancel:after-intent", ActionState.INTENT)]
    a = store.journal.find_by_idempotency_key(cancel_key(EXT))
    assert a is not None and (a.kind, a.state, a.job_id, a.gpus) == (ActionKind.CANCEL_EXTENSION,
                                                                     ActionState.APPLIED, 100, 0)
    assert a.params["reason"] == "RESUME_FAILED" and a.params["nodes"] == ["n5"]
    rec = store.jobs.get_extension(EXT)
    assert rec is not None and rec.state == "CANCELLED" and rec.ended_at is not None
    # asked again (a decider that saw the failure twice): journaled already, nothing sent to Slurm
    assert "already journaled" in act.cancel_extension(CANCEL, None, ctx)
    runner.check()
    # the extension never joined: no GPUs reclaimed, and no resize in the job's usage
    assert store.journal.gpu_totals(NOW - timedelta(hours=1)).reclaimed == 0
    assert resize_time(a) is None


@pytest.mark.parametrize("state", ["PENDING", "COMPLETED"])
def test_reconcile_finishes_a_cancel_cut_off_after_its_intent(state: str) -> None:
    store = _store()
    slurm, runner = _scancel_cli()

    def crash(step: str) -> None:
        raise Crash(step)

    ctx = CycleContext(cycle_id=store.decisions.begin_cycle(), token=None, now=NOW)
    with pytest.raises(Crash):
        Actuator(slurm, store, {}, fault=crash).cancel_extension(CANCEL, None, ctx)
    (open_,) = store.journal.dangling(older_than=timedelta(0))
    assert (open_.kind, open_.state) == (ActionKind.CANCEL_EXTENSION, ActionState.INTENT) and runner.pos == 0
    ext = replace(job(EXT, nodes=(), state=state), node_count=1)
    snap = snapshot([job(100, nodes=("n1",)), ext], [node("n1", used=4), node("n5")])
    done = _pass(snap, slurm, store, Actuator(slurm, store, {}))
    a = store.journal.get(open_.id)
    assert a.state == ActionState.APPLIED and store.journal.dangling(older_than=timedelta(0)) == []
    if state == "PENDING":  # Slurm still holds it: cancelled now
        runner.finish()
        assert done == [f"action {a.id}: reconciled: extension job {EXT} cancelled"]
    else:  # it ended meanwhile: nothing sent to Slurm
        assert runner.pos == 0
        assert done == [f"action {a.id}: reconciled: extension job {EXT} no longer runs"]
    rec = store.jobs.get_extension(EXT)
    assert rec is not None and rec.ended_at is not None


# --- reconcile's three recovery cancels: journaled like the actuator's -----------------------------------------
LEADER, KEPT, KEY = 100, 881, "grow:100:1"


def _tagged(job_id: int, state: str = "RUNNING", nodes: tuple[str, ...] = ("n5",)) -> Job:
    """An extension job of LEADER as squeue shows it: the controller's tag in its comment."""
    return replace(job(job_id, nodes=nodes, state=state), node_count=1,
                   comment=ExtensionTag(LEADER, KEY).render())


def _duplicate(store: SqlStore) -> ClusterSnapshot:
    """A crash after a grow's sbatch, twice: two extension jobs carry its key; the older one is kept."""
    store.journal.record_intent(job_id=LEADER, kind=ActionKind.GROW, idempotency_key=KEY, nodes=1)
    return snapshot([job(LEADER, nodes=("n1",)), _tagged(KEPT), _tagged(EXT, nodes=("n6",))],
                    [node("n1", used=4), node("n5", used=4), node("n6", used=4)])


def _orphan(store: SqlStore) -> ClusterSnapshot:
    """The leader (alice's) ended; its applied grow's extension still runs."""
    store.jobs.upsert_job(JobObservation(job_id=LEADER, user="alice", partition="gpu", state="RUNNING",
                                         current_nodes=1, min_nodes=1, max_nodes=2))
    grow = store.journal.record_intent(job_id=LEADER, kind=ActionKind.GROW, idempotency_key=KEY, nodes=1)
    store.journal.mark_in_progress(grow)
    store.journal.mark_applied(grow, "submitted")
    return snapshot([_tagged(EXT)], [node("n1"), node("n5", used=4)])


def _dead_node(store: SqlStore) -> ClusterSnapshot:
    """An extension pinned to n5 pends; n5 went DOWN before it started."""
    return snapshot([job(LEADER, nodes=("n1",)), _tagged(EXT, state="PENDING")],
                    [node("n1", used=4), node("n5", state="DOWN")])


PATHS = {"DUPLICATE_EXTENSION": _duplicate, "ORPHAN_EXTENSION": _orphan, "PENDING_ON_DEAD_NODE": _dead_node}


def _cancel_row(store: SqlStore) -> ActionRecord:
    (row,) = [a for a in store.journal.list_actions() if a.kind == ActionKind.CANCEL_EXTENSION]
    return row


@pytest.mark.parametrize("reason", sorted(PATHS))
def test_each_recovery_cancel_is_journaled_before_scancel_and_a_second_pass_does_nothing(reason: str) -> None:
    store = _store()
    snap = PATHS[reason](store)
    slurm, runner = _scancel_cli()
    seen: list[ActionRecord] = []

    def fault(step: str) -> None:  # the intent is on record before scancel runs
        assert step == "cancel:after-intent" and runner.pos == 0
        seen.append(_cancel_row(store))

    done = _pass(snap, slurm, store, Actuator(slurm, store, {}, fault=fault))
    runner.finish()  # scancel 882 ran, once
    assert [a.state for a in seen] == [ActionState.INTENT]
    row = _cancel_row(store)
    assert (row.state, row.job_id, row.gpus, row.idempotency_key) == (ActionState.APPLIED, LEADER, 0, cancel_key(EXT))
    assert row.params["reason"] == reason and row.params["recovery"] is True and row.params["extension_job"] == EXT
    assert any(f"extension {EXT}" in line and f"extension job {EXT} cancelled" in line for line in done), done
    rec = store.jobs.get_extension(EXT)
    assert rec is not None and rec.state == "CANCELLED" and rec.ended_at is not None
    assert resize_time(row) is None  # no running job changed size
    # reconcile again on the same view (the cancel not yet seen in squeue): no second scancel, no second row
    again = _pass(snap, slurm, store, Actuator(slurm, store, {}))
    runner.check()
    assert _cancel_row(store).id == row.id and store.journal.dangling(older_than=timedelta(0)) == []
    assert not any("cancelled" in line for line in again), again


@pytest.mark.parametrize("reason", sorted(PATHS))
def test_a_crash_between_a_recovery_cancels_intent_and_its_scancel_is_finished_once_by_the_next_pass(
        reason: str) -> None:
    store = _store()
    snap = PATHS[reason](store)
    slurm, runner = _scancel_cli()

    def crash(step: str) -> None:
        raise Crash(step)

    with pytest.raises(Crash):
        _pass(snap, slurm, store, Actuator(slurm, store, {}, fault=crash))
    assert runner.pos == 0  # nothing sent, the intent on record
    open_ = _cancel_row(store)
    assert open_.state == ActionState.INTENT and open_.params["reason"] == reason
    done = _pass(snap, slurm, store, Actuator(slurm, store, {}))  # the restarted controller's pass
    runner.finish()  # scancel ran once, by the resolution of the open cancel
    assert f"action {open_.id}: reconciled: extension job {EXT} cancelled" in done, done
    assert _cancel_row(store).state == ActionState.APPLIED and store.journal.dangling(older_than=timedelta(0)) == []
    if reason == "DUPLICATE_EXTENSION":  # the grow itself is settled too, on the kept job
        grow = store.journal.find_by_idempotency_key(KEY)
        assert grow is not None and grow.state == ActionState.APPLIED
        assert [e.job_id for e in store.jobs.extensions(LEADER, active_only=True)] == [KEPT]
