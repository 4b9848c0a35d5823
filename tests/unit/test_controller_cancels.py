"""The cancel of a failed grow's extension job: journaled before scancel runs, finished by reconcile after a crash
(controller/cancels.py). Slurm's reply is scancel's, recorded from the live test cluster (the scenario
reconcile_dangling_grows, tests/fixtures/slurm/22.05/scenarios/)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from slurm_elastic.api.usage import resize_time
from slurm_elastic.controller.actuator import Actuator
from slurm_elastic.controller.cancels import cancel_key
from slurm_elastic.controller.reconcile import FinalStates, reconcile_pass
from slurm_elastic.controller.rulings import CancelExtension, CycleContext
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.runner import CommandRunner, RetryPolicy, SlurmCommands
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import ActionKind, ActionState
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
    done = reconcile_pass(snap, slurm=slurm, store=store, older_than=timedelta(0), final_states=FinalStates())
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
