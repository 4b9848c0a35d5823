"""Retention: old samples, decisions, terminal actions, ended jobs, cycles and serving demand slots go; open
actions stay."""

from __future__ import annotations

from slurm_elastic.store import (
    ActionKind,
    ActionState,
    JobObservation,
    NewDecision,
    NewSample,
    Retention,
    SqlStore,
)
from slurm_elastic.store.records import DemandRecord
from tests.unit.storehelpers import FakeClock

DAY = 86400


def test_prune_by_age_keeping_open_journal_rows(store: SqlStore, clock: FakeClock) -> None:
    old = clock()
    cycle = store.decisions.begin_cycle()
    dec_done, dec_open, dec_plain = store.decisions.record_decisions(
        cycle, [NewDecision(1, "grow", "BUSY", "m"), NewDecision(2, "shrink", "IDLE", "m"),
                NewDecision(3, "hold", "OK", "m")])
    store.decisions.finish_cycle(cycle, decisions=3, actions=2)
    done = store.journal.record_intent(job_id=1, kind=ActionKind.GROW, idempotency_key="grow:1:1:1",
                                       decision_id=dec_done)
    store.journal.mark_in_progress(done)
    store.journal.mark_applied(done, "ok")
    stuck = store.journal.record_intent(job_id=2, kind=ActionKind.SHRINK, idempotency_key="shrink:2:1:1",
                                        decision_id=dec_open)
    store.journal.mark_in_progress(stuck)
    store.jobs.record_extension(job_id=50, parent_job_id=1, node_count=1, state="RUNNING", action_id=done)
    store.jobs.update_extension(50, state="CANCELLED", ended=True)
    store.jobs.upsert_job(JobObservation(job_id=1, user="a", partition="p", state="RUNNING", current_nodes=1,
                                         min_nodes=1, max_nodes=2))
    store.jobs.mark_job_ended(1, "COMPLETED")
    store.jobs.upsert_job(JobObservation(job_id=4, user="a", partition="p", state="RUNNING", current_nodes=1,
                                         min_nodes=1, max_nodes=2))
    store.samples.add_samples([NewSample(1, old, 50.0, 60.0, 4, 4, 10)])
    store.demand.add_demand(DemandRecord("alice/llm", 7, old, 120.0))

    clock.advance(2 * DAY)
    store.samples.add_samples([NewSample(1, clock(), 50.0, 60.0, 4, 4, 10)])
    store.demand.add_demand(DemandRecord("alice/llm", 7, clock(), 80.0))
    store.decisions.record_decisions(store.decisions.begin_cycle(), [NewDecision(4, "hold", "OK", "new")])

    keep_all = store.retention.prune(Retention(samples_s=None, decisions_s=None, actions_s=None, jobs_s=None,
                                               cycles_s=None, demand_s=None))
    assert keep_all == type(keep_all)()
    res = store.retention.prune(Retention(samples_s=DAY, decisions_s=DAY, actions_s=DAY, jobs_s=DAY,
                                          cycles_s=DAY, demand_s=DAY))
    assert (res.samples, res.decisions, res.actions, res.jobs, res.extensions, res.cycles, res.demand) == (
        1, 2, 1, 1, 1, 1, 1)
    assert [d.requests_per_s for d in store.demand.demand("alice/llm")] == [80.0]

    assert [s.time for s in store.samples.samples(1)] == [clock()]
    remaining = {x.id for x in store.decisions.list_decisions()}
    assert dec_open in remaining and dec_done not in remaining and dec_plain not in remaining
    assert [a.id for a in store.journal.list_actions()] == [stuck]  # open: kept however old
    assert store.journal.get(stuck).state is ActionState.IN_PROGRESS
    assert store.jobs.get_extension(50) is None
    assert store.jobs.get_job(1) is None and store.jobs.get_job(4) is not None  # running jobs are kept


def test_decision_referenced_by_a_pruned_action_is_detached_not_broken(store: SqlStore, clock: FakeClock) -> None:
    (dec,) = store.decisions.record_decisions(store.decisions.begin_cycle(), [NewDecision(1, "grow", "B", "m")])
    aid = store.journal.record_intent(job_id=1, kind=ActionKind.GROW, idempotency_key="g:1", decision_id=dec)
    store.journal.mark_in_progress(aid)
    store.journal.mark_applied(aid, "ok")
    clock.advance(2 * DAY)
    res = store.retention.prune(Retention(samples_s=None, decisions_s=DAY, actions_s=None, jobs_s=None,
                                          cycles_s=None))
    assert res.decisions == 1
    assert store.journal.get(aid).decision_id is None  # ON DELETE SET NULL
