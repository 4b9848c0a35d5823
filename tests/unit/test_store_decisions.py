"""Cycles and decisions: one transaction per cycle, the `decisions list` filters, last N per job, counts."""

from __future__ import annotations

import pytest

from slurm_elastic.store import (
    DecisionFilter,
    JobObservation,
    NewDecision,
    SqlStore,
    StoreInputError,
)
from tests.unit.storehelpers import FakeClock


def d(job: int, action: str = "hold", reason: str = "WITHIN_BAND", **kw: object) -> NewDecision:
    return NewDecision(job_id=job, action=action, reason=reason, message=f"{action} {job}", **kw)  # type: ignore[arg-type]


def test_cycle_ids_are_unique_and_cycles_record_their_duration(store: SqlStore, clock: FakeClock) -> None:
    c1 = store.decisions.begin_cycle(holder="ctl-a")
    c2 = store.decisions.begin_cycle(holder="ctl-a", dry_run=True)
    assert c2 > c1
    assert store.decisions.last_cycle() is None  # none finished yet
    clock.advance(2.5)
    store.decisions.finish_cycle(c1, decisions=3, actions=1)
    last = store.decisions.last_cycle()
    assert last is not None and (last.id, last.duration_s, last.decisions, last.actions) == (c1, 2.5, 3, 1)
    running = store.decisions.last_cycle(finished=False)
    assert running is not None and running.id == c2 and running.dry_run and running.duration_s is None


def test_cycles_after_a_point_are_the_ones_begun_since_oldest_first(store: SqlStore) -> None:
    before = store.decisions.begin_cycle(holder="ctl-a")
    point = store.decisions.last_cycle(finished=False)
    assert point is not None and point.id == before
    store.decisions.finish_cycle(before, decisions=0, actions=0)
    c1 = store.decisions.begin_cycle(holder="ctl-a")
    store.decisions.finish_cycle(c1, decisions=2, actions=0, error="Slurm unavailable")
    c2 = store.decisions.begin_cycle(holder="ctl-b")
    after = store.decisions.cycles_after(point.id)
    assert [(c.id, c.holder, c.error, c.finished_at is None) for c in after] == [
        (c1, "ctl-a", "Slurm unavailable", False), (c2, "ctl-b", None, True)]
    assert store.decisions.cycles_after(c2) == []
    assert [c.id for c in store.decisions.cycles_after(0)] == [before, c1, c2]


def test_record_decisions_keeps_everything(store: SqlStore, clock: FakeClock) -> None:
    cycle = store.decisions.begin_cycle()
    ids = store.decisions.record_decisions(cycle, [
        d(1, "shrink", "UNDERUTILIZED", inputs={"mean_util": 12.5, "window_s": 600}, current_nodes=3,
          target_nodes=2, signal="USR1", profile="default"),
        d(2, "hold", "PAUSED", paused=True, dry_run=True),
    ])
    assert len(ids) == 2 and ids[0] < ids[1]
    rec = store.decisions.last_decisions(1, 1)[0]
    assert (rec.id, rec.cycle_id, rec.time, rec.action, rec.reason) == (ids[0], cycle, clock(), "shrink",
                                                                         "UNDERUTILIZED")
    assert rec.inputs == {"mean_util": 12.5, "window_s": 600}
    assert (rec.current_nodes, rec.target_nodes, rec.signal, rec.profile) == (3, 2, "USR1", "default")
    held = store.decisions.last_decisions(2, 1)[0]
    assert held.paused and held.dry_run
    assert store.decisions.record_decisions(cycle, []) == []


def test_a_cycle_is_all_or_nothing(store: SqlStore) -> None:
    cycle = store.decisions.begin_cycle()
    with pytest.raises(StoreInputError, match="job 2: inputs are not JSON"):
        store.decisions.record_decisions(cycle, [d(1), d(2, inputs={"bad": {1, 2}})])
    with pytest.raises(StoreInputError, match="reason"):
        store.decisions.record_decisions(cycle, [d(1), d(3, reason="")])
    assert store.decisions.list_decisions() == []


def test_rows_with_and_without_ids_in_one_transaction(store: SqlStore) -> None:
    """Holds go in without their ids (nothing refers to them by id); the actions' ids come back in order; a bad
    row in either group writes nothing."""
    cycle = store.decisions.begin_cycle()
    actions = [d(i, "grow", "OVERUTILIZED", target_nodes=i) for i in (7, 3, 5)]
    holds = [d(i, inputs={"i": i}) for i in range(100, 400)]
    ids = store.decisions.record_rows(cycle, actions, holds)
    stored = {r.id: r for r in store.decisions.list_decisions()}
    assert len(stored) == 303 and [(stored[i].job_id, stored[i].target_nodes) for i in ids] == [(7, 7), (3, 3),
                                                                                                   (5, 5)]
    assert sorted((r.job_id, r.inputs["i"]) for r in stored.values() if r.action == "hold") == [
        (i, i) for i in range(100, 400)]
    assert store.decisions.record_rows(cycle, [], holds[:2]) == []
    with pytest.raises(StoreInputError, match="job 9"):
        store.decisions.record_rows(cycle, actions, [d(8), d(9, reason="")])
    assert len(store.decisions.list_decisions()) == 305


def test_list_filters(store: SqlStore, clock: FakeClock) -> None:
    store.jobs.upsert_job(JobObservation(job_id=1, user="alice", partition="train", state="RUNNING",
                                         current_nodes=2, min_nodes=1, max_nodes=3))
    store.jobs.upsert_job(JobObservation(job_id=2, user="bob", partition="train", state="RUNNING",
                                         current_nodes=1, min_nodes=1, max_nodes=3))
    t0 = clock()
    store.decisions.record_decisions(store.decisions.begin_cycle(), [d(1, "hold", "COOLDOWN"), d(2, "grow", "BUSY")])
    t1 = clock.advance(60)
    store.decisions.record_decisions(store.decisions.begin_cycle(),
                                     [d(1, "shrink", "UNDERUTILIZED"), d(2, "hold", "NO_FREE_NODES")])
    ls = store.decisions.list_decisions
    assert [(x.job_id, x.action) for x in ls()] == [(2, "hold"), (1, "shrink"), (2, "grow"), (1, "hold")]
    assert [x.action for x in ls(DecisionFilter(job_id=1))] == ["shrink", "hold"]
    assert [x.job_id for x in ls(DecisionFilter(since=t1))] == [2, 1]
    assert [x.job_id for x in ls(DecisionFilter(until=t1))] == [2, 1]
    assert [x.reason for x in ls(DecisionFilter(action="hold"))] == ["NO_FREE_NODES", "COOLDOWN"]
    assert [x.job_id for x in ls(DecisionFilter(reason="BUSY"))] == [2]
    assert [x.job_id for x in ls(DecisionFilter(user="alice"))] == [1, 1]
    assert ls(DecisionFilter(user="carol")) == []
    assert len(ls(DecisionFilter(limit=3))) == 3
    assert [x.action for x in ls(DecisionFilter(job_id=2, since=t0, action="grow"))] == ["grow"]


def test_last_n_per_job_and_counts(store: SqlStore, clock: FakeClock) -> None:
    t0 = clock()
    for i in range(4):
        store.decisions.record_decisions(store.decisions.begin_cycle(),
                                         [d(1, "hold", f"R{i}"), d(2, "grow" if i % 2 else "hold", "BUSY")])
        clock.advance(10)
    store.decisions.record_decisions(store.decisions.begin_cycle(), [d(3, "shrink", "UNDERUTILIZED")])
    last = store.decisions.last_decisions_per_job(2)
    assert sorted(last) == [1, 2, 3]
    assert [x.reason for x in last[1]] == ["R3", "R2"]
    assert [x.action for x in last[2]] == ["grow", "hold"]
    assert len(last[3]) == 1
    only = store.decisions.last_decisions_per_job(1, job_ids=[2])
    assert list(only) == [2] and only[2][0].action == "grow"
    counts = store.decisions.decision_counts(t0)
    assert [(c.action, c.reason, c.count) for c in counts][:2] == [("grow", "BUSY", 2), ("hold", "BUSY", 2)]
    assert sum(c.count for c in counts) == 9
    assert sum(c.count for c in store.decisions.decision_counts(t0, until=t0)) == 0
    with pytest.raises(StoreInputError):
        store.decisions.last_decisions_per_job(0)


def test_counts_are_sorted_deterministically(store: SqlStore, clock: FakeClock) -> None:
    store.decisions.record_decisions(store.decisions.begin_cycle(),
                                     [d(1, "hold", "B"), d(2, "hold", "A"), d(3, "grow", "Z"), d(4, "grow", "Z")])
    counts = store.decisions.decision_counts(clock())
    assert [(c.action, c.reason, c.count) for c in counts] == [("grow", "Z", 2), ("hold", "A", 1), ("hold", "B", 1)]
