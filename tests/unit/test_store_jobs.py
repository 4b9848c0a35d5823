"""Elastic jobs, extension jobs, samples and agents."""

from __future__ import annotations

from datetime import timedelta

import pytest

from slurm_elastic.store import (
    ActionKind,
    AgentScrape,
    JobObservation,
    NewSample,
    PauseScope,
    SpecSource,
    SqlStore,
    StoreInputError,
)
from tests.unit.storehelpers import T0, FakeClock, memory_store


def obs(job_id: int = 10, **kw: object) -> JobObservation:
    base: dict[str, object] = dict(job_id=job_id, user="alice", partition="train", state="RUNNING",
                                   current_nodes=2, min_nodes=1, max_nodes=3, account="ml",
                                   spec="elastic:v1 min=1 max=3", spec_source=SpecSource.ADMIN_COMMENT,
                                   submit_time=T0 - timedelta(hours=1))
    base.update(kw)
    return JobObservation(**base)  # type: ignore[arg-type]


def test_upsert_keeps_first_seen_and_updates_the_rest(store: SqlStore, clock: FakeClock) -> None:
    first = store.jobs.upsert_job(obs())
    assert (first.first_seen, first.last_seen, first.paused, first.ended_at) == (clock(), clock(), False, None)
    assert first.spec_source is SpecSource.ADMIN_COMMENT and first.account == "ml"
    clock.advance(30)
    later = store.jobs.upsert_job(obs(current_nodes=3, nodelist="n[1-3]", gpus_per_node=4))
    assert later.first_seen == first.first_seen and later.last_seen == clock()
    assert (later.current_nodes, later.nodelist, later.gpus_per_node) == (3, "n[1-3]", 4)
    assert store.jobs.get_job(10) == later


def test_invalid_directives_are_recorded_with_their_reason(store: SqlStore) -> None:
    rec = store.jobs.upsert_job(obs(11, spec=None, spec_source=SpecSource.BATCH_SCRIPT,
                                    spec_error="line 3: --max-nodes: must be >= --min-nodes (allowed: 1..4096)"))
    assert rec.spec is None and rec.spec_source is SpecSource.BATCH_SCRIPT
    assert rec.spec_error is not None and "--max-nodes" in rec.spec_error


def test_het_component_is_its_own_unit(store: SqlStore) -> None:
    store.jobs.upsert_job(obs(20, het_job_id=20, het_offset=0))
    comp = store.jobs.upsert_job(obs(21, het_job_id=20, het_offset=1))
    assert (comp.job_id, comp.het_job_id, comp.het_offset) == (21, 20, 1)


def test_reused_job_id_replaces_the_old_row(store: SqlStore, clock: FakeClock) -> None:
    store.jobs.upsert_job(obs())
    store.pauses.pause(PauseScope.JOB, 10, who="root")
    clock.advance(60)
    fresh = store.jobs.upsert_job(obs(submit_time=clock(), user="bob"))
    assert fresh.first_seen == clock() and fresh.user == "bob" and fresh.paused is False


def test_ended_jobs_leave_the_active_list(store: SqlStore, clock: FakeClock) -> None:
    store.jobs.upsert_job(obs(1))
    store.jobs.upsert_job(obs(2, user="bob"))
    assert store.jobs.mark_job_ended(1, "COMPLETED") is True
    assert store.jobs.mark_job_ended(99, "COMPLETED") is False
    assert [j.job_id for j in store.jobs.list_jobs()] == [2]
    assert [j.job_id for j in store.jobs.list_jobs(active_only=False)] == [1, 2]
    assert [j.job_id for j in store.jobs.list_jobs(user="alice", active_only=False)] == [1]
    ended = store.jobs.get_job(1)
    assert ended is not None and ended.state == "COMPLETED" and ended.ended_at == clock()


@pytest.mark.parametrize("bad", [dict(min_nodes=3, max_nodes=2), dict(current_nodes=-1), dict(user="")])
def test_bad_observations_are_refused(store: SqlStore, bad: dict[str, object]) -> None:
    with pytest.raises(StoreInputError):
        store.jobs.upsert_job(obs(10, **bad))


def test_extension_jobs_link_to_parent_and_action(store: SqlStore, clock: FakeClock) -> None:
    aid = store.journal.record_intent(job_id=10, kind=ActionKind.GROW, idempotency_key="grow:10:5:1")
    e1 = store.jobs.record_extension(job_id=31, parent_job_id=10, node_count=1, state="PENDING", action_id=aid,
                                     idempotency_key="grow:10:5:1")
    clock.advance(10)
    store.jobs.record_extension(job_id=32, parent_job_id=10, node_count=1, state="RUNNING")
    assert [e.job_id for e in store.jobs.extensions(10)] == [32, 31]  # newest first: shrink order
    found = store.jobs.find_extension_by_key("grow:10:5:1")
    assert found is not None and found.job_id == 31 and found.action_id == aid
    assert found == e1
    up = store.jobs.update_extension(31, state="RUNNING", nodelist="n3")
    assert up is not None and (up.state, up.nodelist) == ("RUNNING", "n3")
    store.jobs.update_extension(32, state="CANCELLED", ended=True)
    assert [e.job_id for e in store.jobs.extensions(10)] == [31]
    assert len(store.jobs.extensions(active_only=False)) == 2
    assert store.jobs.update_extension(99, state="RUNNING") is None
    with pytest.raises(StoreInputError, match="belongs to 10"):
        store.jobs.record_extension(job_id=31, parent_job_id=11, node_count=1, state="RUNNING")


def test_samples_round_trip_and_validation(store: SqlStore, clock: FakeClock) -> None:
    rows = [NewSample(job_id=10, time=T0 + timedelta(seconds=60 * i), util_mean=10.0 * i, util_max=20.0 * i,
                      gpus_alloc=8, gpus_in_use=8 - i, sample_count=12) for i in range(4)]
    assert store.samples.add_samples(rows) == 4
    got = store.samples.samples(10, since=T0 + timedelta(seconds=60))
    assert [s.util_mean for s in got] == [10.0, 20.0, 30.0]
    assert store.samples.samples(10, until=T0 + timedelta(seconds=60))[0].gpus_in_use == 8
    with pytest.raises(StoreInputError, match="0..100"):
        store.samples.add_samples([NewSample(10, T0, 101.0, 101.0, 1, 1, 1)])
    with pytest.raises(StoreInputError, match="timezone-aware"):
        store.samples.add_samples([NewSample(10, T0.replace(tzinfo=None), 1.0, 1.0, 1, 1, 1)])
    assert len(store.samples.samples(10)) == 4


def test_agents_seen_and_failing(store: SqlStore, clock: FakeClock) -> None:
    ok = store.agents.agent_seen("n1", url="http://n1:9400", version="0.1.0", gpu_count=4)
    assert (ok.last_seen, ok.last_error, ok.gpu_count) == (clock(), None, 4)
    clock.advance(30)
    bad = store.agents.agent_failed("n1", url="http://n1:9400", error="connection refused")
    assert bad.last_seen == ok.last_seen and bad.last_attempt == clock() and bad.last_error == "connection refused"
    store.agents.agent_failed("n2", url="http://n2:9400", error="timeout")
    agents = store.agents.list_agents()
    assert [a.node for a in agents] == ["n1", "n2"] and agents[1].last_seen is None
    again = store.agents.agent_seen("n1", url="http://n1:9400", version="0.1.1", gpu_count=4)
    assert again.last_error is None and again.version == "0.1.1"


def test_observe_jobs_writes_by_change_in_one_call(store: SqlStore, clock: FakeClock) -> None:
    """A cycle's units in one transaction: new rows inserted, changed ones updated, unchanged ones not written;
    each row as upsert_job leaves it."""
    assert store.jobs.observe_jobs([obs(1), obs(2), obs(3)]) == 3
    first = {r.job_id: r for r in store.jobs.list_jobs()}
    assert first[1].first_seen == first[1].last_seen == clock() and first[2].spec_source is SpecSource.ADMIN_COMMENT
    clock.advance(30)
    assert store.jobs.observe_jobs([obs(1), obs(2), obs(3)]) == 0  # nothing changed: nothing written
    assert {r.job_id: r for r in store.jobs.list_jobs()} == first
    clock.advance(30)
    assert store.jobs.observe_jobs([obs(1), obs(2, current_nodes=3, nodelist="n[1-3]"), obs(3), obs(4)]) == 2
    after = {r.job_id: r for r in store.jobs.list_jobs()}
    assert after[1] == first[1] and after[3] == first[3]
    assert (after[2].current_nodes, after[2].nodelist, after[2].last_seen, after[2].first_seen) == (
        3, "n[1-3]", clock(), first[2].first_seen)
    assert after[4].first_seen == clock()
    # the same observations through upsert_job give the same rows
    twin = store.jobs.upsert_job(obs(2, current_nodes=3, nodelist="n[1-3]"))
    assert twin == after[2]


def test_observe_jobs_replaces_a_reused_job_id_and_keeps_what_the_controller_added(store: SqlStore,
                                                                                     clock: FakeClock) -> None:
    store.jobs.observe_jobs([obs(10), obs(11)])
    store.pauses.pause(PauseScope.JOB, 10, who="root")
    assert store.jobs.add_time_limit(11, 15) == 15
    clock.advance(60)
    assert store.jobs.observe_jobs([obs(10, submit_time=clock(), user="bob"), obs(11, state="COMPLETING")]) == 2
    fresh, kept = store.jobs.get_job(10), store.jobs.get_job(11)
    assert fresh is not None and kept is not None
    assert (fresh.first_seen, fresh.user, fresh.paused) == (clock(), "bob", False)
    assert (kept.state, kept.time_limit_added_min) == ("COMPLETING", 15)
    assert kept.first_seen == clock() - timedelta(seconds=60)


def test_observe_jobs_checks_every_observation_before_writing(store: SqlStore) -> None:
    with pytest.raises(StoreInputError, match="job 2"):
        store.jobs.observe_jobs([obs(1), obs(2, min_nodes=4)])
    assert store.jobs.list_jobs() == []


def test_a_cycles_scrapes_in_one_call_record_what_one_call_each_records(clock: FakeClock) -> None:
    """record_scrapes (one transaction per cycle) leaves every agent row as agent_seen / agent_failed, called one
    by one in the same order, leave it: new and known nodes, success after failure and failure after success."""
    def cycles(one_by_one: bool) -> list[object]:
        st = memory_store(clock)
        n1, n2, n3 = "http://n1:9400", "http://n2:9400", "http://n3:9400"
        script = [[AgentScrape("n1", n1, "0.1.0", 4), AgentScrape("n2", n2, error="timeout")],
                  [AgentScrape("n1", n1, error="refused"), AgentScrape("n2", "http://n2:9401", "0.2", 8),
                   AgentScrape("n3", n3, "0.2", 8)],
                  [AgentScrape("n1", n1, "0.1.1", 4), AgentScrape("n3", n3, error="x" * 5000)]]
        start = clock()
        for scrapes in script:
            if one_by_one:
                for sc in scrapes:
                    if sc.error is None:
                        st.agents.agent_seen(sc.node, url=sc.url, version=sc.version, gpu_count=sc.gpu_count)
                    else:
                        st.agents.agent_failed(sc.node, url=sc.url, error=sc.error)
            else:
                st.agents.record_scrapes(scrapes)
            clock.advance(30)
        clock.advance((start - clock()).total_seconds())  # the other run starts at the same time
        try:
            return list(st.agents.list_agents())
        finally:
            st.close()

    bulk = cycles(False)
    assert bulk == cycles(True) and len(bulk) == 3
