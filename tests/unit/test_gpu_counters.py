"""GPUs granted and reclaimed from the journal's applied actions only: granted = GPUs whose
extension joined the job (controller/grants.py), reclaimed = GPUs released by applied shrinks (journaled with
their GPU count) and cancelled extensions; as ``status`` shows them (gpus_*_today) and as the Prometheus counters
count them. Real controller runs over Slurm replies recorded on the live cluster (tests/unit/slurm_replay.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from slurm_elastic.api.authz import Caller
from slurm_elastic.api.service import Service, ServiceSettings
from slurm_elastic.controller.cycle import CycleSummary
from slurm_elastic.controller.cycle_stats import observe_cycle
from slurm_elastic.controller.grants import Joins
from slurm_elastic.controller.metrics import ControllerMetrics
from slurm_elastic.store.records import ActionKind, ActionState, JobObservation, NewDecision
from tests.unit.policy_builders import NOW, job, node, snapshot, unit
from tests.unit.slurm_replay import Replayed, replay
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import Agents
from tests.unit.test_controller_metrics import samples

ROOT = Caller(0, "root")


def _status(r: Replayed) -> dict[str, object]:
    now = r.world.clock()
    return Service(r.store, ServiceSettings(), clock=lambda: now).handle(ROOT, "status", {})


def _applied(r: Replayed, job_id: int, kind: ActionKind) -> list[int]:
    return [a.gpus for a in r.store.journal.list_actions(job_id=job_id) if a.kind == kind
            and a.state == ActionState.APPLIED]


def test_a_grow_that_joined_and_a_shrink_count_what_they_moved() -> None:
    """A busy 1-node job grows by one extension that runs; an idle 2-node job shrinks to 1 (4 GPUs per node)."""
    r = replay("shrink_grow_then_no_metrics", Agents)
    busy, idle = r.rec.jobs["busy"], r.rec.jobs["idle"]
    (grow,) = [a for a in r.store.journal.list_actions(job_id=busy) if a.kind == ActionKind.GROW]
    assert grow.state == ActionState.APPLIED and "joined_at" in grow.params and grow.gpus == 4
    assert _applied(r, idle, ActionKind.SHRINK) == [4]  # journaled with the GPUs of the node it released
    s = _status(r)
    assert (s["gpus_granted_today"], s["gpus_reclaimed_today"]) == (4, 4)
    m = ControllerMetrics()
    r.world.ctl.metrics = m
    observe_cycle(r.world.ctl, lambda: CycleSummary(cycle_id=None, skipped="test"), r.world.clock()
                  - timedelta(hours=1))
    got = samples(m)
    assert got["slurm_elastic_controller_gpus_reclaimed_total"][0][1] == 4.0
    assert got["slurm_elastic_controller_gpus_granted_total"][0][1] == 4.0


def test_a_grow_whose_extension_never_joined_grants_nothing() -> None:
    """The recorded extension job exits 3 at once (its script fails in the extension role): the grow is applied
    (submitted), its GPUs never joined."""
    r = replay("grow_extension_fails", Agents)
    busy = r.rec.jobs["busy"]
    assert _applied(r, busy, ActionKind.GROW) == [4]
    assert _status(r)["gpus_granted_today"] == 0


def test_a_prewarm_grow_joins_at_its_cold_start_not_before_and_never_after_a_failure() -> None:
    clock = FakeClock(NOW)
    store = memory_store(clock)
    store.jobs.upsert_job(JobObservation(job_id=100, user="root", account="acct", partition="gpu", state="RUNNING",
                                         current_nodes=1, min_nodes=1, max_nodes=4))
    u = unit(job(100, nodes=("n1",)), prewarm="stage")
    actions = {}
    for ext in (501, 502):
        a = store.journal.record_intent(job_id=100, kind=ActionKind.GROW, idempotency_key=f"grow:100:{ext}", gpus=4)
        store.journal.mark_in_progress(a)
        store.journal.mark_applied(a, f"extension job {ext}")
        store.jobs.record_extension(job_id=ext, parent_job_id=100, node_count=1, state="RUNNING", action_id=a,
                                    nodelist="n5" if ext == 501 else "n6")
        actions[ext] = a
    running = [replace(job(e, nodes=(n,)), node_count=1) for e, n in ((501, "n5"), (502, "n6"))]
    snap = snapshot([u.job, *running], [node("n1", used=4), node("n5", used=4), node("n6", used=4)])
    joins = Joins(store)
    assert joins.note({100: u}, snap, NOW) == []  # running, prewarm not done: not joined
    cycle = store.decisions.begin_cycle()
    store.decisions.record_decisions(cycle, [
        NewDecision(job_id=100, action="hold", reason="PREWARM_FAILED", message="x", inputs={"extension_job": 501},
                    current_nodes=1, target_nodes=1),
        NewDecision(job_id=100, action="hold", reason="COLD_START", message="x", inputs={"extension_job": 502},
                    current_nodes=1, target_nodes=1)])
    assert joins.note({100: u}, snap, NOW + timedelta(seconds=5)) == [actions[502]]
    assert joins.note({100: u}, snap, NOW + timedelta(seconds=10)) == []  # once
    assert store.journal.gpu_totals(NOW).granted == 4
    # a restarted controller does not note it again
    assert Joins(store).note({100: u}, snap, NOW + timedelta(seconds=15)) == []
