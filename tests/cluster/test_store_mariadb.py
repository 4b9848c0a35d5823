"""The store against the test cluster's real MariaDB (the shared-DB / HA setup).

Each test gets its own random table prefix in the ``slurm_elastic`` database and drops its tables at the end,
so runs never collide. Only MariaDB is needed: the cluster is started if it is down, and no Slurm job is touched.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Column, Integer, create_engine, inspect, text

from slurm_elastic.store import (
    CURRENT_SCHEMA_VERSION,
    ActionKind,
    ActionState,
    AgentScrape,
    DecisionFilter,
    DuplicateIntentError,
    HolderProcess,
    JobObservation,
    LeaseLostError,
    LeaseRecord,
    NewDecision,
    Retention,
    SchemaOutdatedError,
    SchemaTooNewError,
    SqlStore,
    StoreUnavailableError,
)
from slurm_elastic.store.migrations import MIGRATIONS, op_add_column
from tests.cluster.harness import TestCluster
from tests.unit.storehelpers import FakeClock

pytestmark = pytest.mark.cluster

URL = "mysql+pymysql://slurm:slurm-elastic-test@127.0.0.1:13306/slurm_elastic"
TTL = timedelta(seconds=30)


@pytest.fixture(scope="module")
def mariadb() -> str:
    c = TestCluster()
    if not c.is_up():
        c.start()
    return URL


@pytest.fixture
def clock() -> FakeClock:
    c = FakeClock()
    c.advance(0.123456)  # microseconds must survive MariaDB's DATETIME(6)
    return c


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}_"


@pytest.fixture
def stores(mariadb: str, clock: FakeClock, prefix: str) -> Iterator[tuple[SqlStore, SqlStore]]:
    a = SqlStore.open(mariadb, table_prefix=prefix, clock=clock, busy_timeout_ms=1000)
    b = SqlStore.open(mariadb, table_prefix=prefix, clock=clock, busy_timeout_ms=1000)
    try:
        yield a, b
    finally:
        b.close()
        a.drop_all()
        a.close()


def race(fns: dict[str, Callable[[], object]]) -> dict[str, object]:
    barrier = threading.Barrier(len(fns))
    out: dict[str, object] = {}

    def run(tag: str, fn: Callable[[], object]) -> None:
        barrier.wait()
        try:
            out[tag] = fn()
        except BaseException as e:
            out[tag] = e

    threads = [threading.Thread(target=run, args=(t, f)) for t, f in fns.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    return out


def test_schema_is_created_under_the_prefix(stores: tuple[SqlStore, SqlStore], prefix: str) -> None:
    a, _ = stores
    tables = {t for t in inspect(a.db.engine).get_table_names() if t.startswith(prefix)}
    assert {f"{prefix}{n}" for n in ("actions", "decisions", "lease", "elastic_jobs", "schema_version")} <= tables
    assert a.schema_version() == CURRENT_SCHEMA_VERSION


def test_journal_round_trip_with_microseconds(stores: tuple[SqlStore, SqlStore], clock: FakeClock) -> None:
    a, b = stores
    aid = a.journal.record_intent(job_id=4_000_000_000, kind=ActionKind.GROW, idempotency_key="grow:1:1:1",
                                  params={"nodes": 1, "ünïcode": "✓"}, gpus=4)
    rec = b.journal.get(aid)  # seen from the other engine: committed
    assert rec.created_at == clock() and rec.created_at.microsecond == 123456
    assert rec.job_id == 4_000_000_000 and rec.params == {"nodes": 1, "ünïcode": "✓"}
    b.journal.mark_in_progress(aid)
    clock.advance(1)
    assert a.journal.mark_applied(aid, "Submitted batch job 9").state is ActionState.APPLIED
    with pytest.raises(DuplicateIntentError):
        b.journal.record_intent(job_id=1, kind=ActionKind.GROW, idempotency_key="grow:1:1:1")
    since = clock() - timedelta(hours=1)
    assert a.journal.gpu_totals(since).granted == 0  # applied, not joined yet: no GPU granted
    joined = b.journal.note_joined(aid, clock.advance(1))
    assert joined.params["joined_at"] == clock().isoformat()  # microseconds kept through MariaDB's JSON
    assert a.journal.gpu_totals(since).granted == 4


def test_lease_creation_race_has_one_winner(stores: tuple[SqlStore, SqlStore]) -> None:
    a, b = stores
    for i in range(20):
        name = f"race-{i}"
        out = race({"ctl-a": lambda n=name: a.lease.acquire("ctl-a", TTL, name=n),
                    "ctl-b": lambda n=name: b.lease.acquire("ctl-b", TTL, name=n)})
        winners = [t for t, r in out.items() if isinstance(r, LeaseRecord)]
        assert len(winners) == 1, out
        assert all(r is None for t, r in out.items() if t not in winners), out
        lease = a.lease.get(name)
        assert lease is not None and lease.holder == winners[0] and lease.epoch == 1


def test_lease_takeover_race_and_fencing(stores: tuple[SqlStore, SqlStore], clock: FakeClock) -> None:
    a, b = stores
    for i in range(20):
        name = f"takeover-{i}"
        old = a.lease.acquire("ctl-old", TTL, name=name)
        assert old is not None
        assert b.lease.acquire("ctl-b", TTL, name=name) is None  # still held
        clock.advance(TTL.total_seconds())
        out = race({"ctl-a": lambda n=name: a.lease.acquire("ctl-a", TTL, name=n),
                    "ctl-b": lambda n=name: b.lease.acquire("ctl-b", TTL, name=n)})
        winners = [r for r in out.values() if isinstance(r, LeaseRecord)]
        assert len(winners) == 1, out
        assert winners[0].epoch == old.epoch + 1
    # a stale holder cannot journal
    current = a.lease.acquire("ctl-a", TTL)
    assert current is not None
    clock.advance(TTL.total_seconds())
    newer = b.lease.acquire("ctl-b", TTL)
    assert newer is not None and newer.epoch == current.epoch + 1
    with pytest.raises(LeaseLostError):
        a.journal.record_intent(job_id=1, kind=ActionKind.SHRINK, idempotency_key="s:1", fencing=current.token())
    assert b.journal.record_intent(job_id=1, kind=ActionKind.SHRINK, idempotency_key="s:1",
                                   fencing=newer.token()) > 0


def test_idempotency_and_policy_races(stores: tuple[SqlStore, SqlStore]) -> None:
    a, b = stores
    for i in range(15):
        key = f"grow:7:{i}:1"
        out = race({n: lambda st=st, k=key: st.journal.record_intent(job_id=7, kind=ActionKind.GROW,
                                                                     idempotency_key=k)
                    for n, st in (("a", a), ("b", b))})
        assert sorted(type(r).__name__ for r in out.values()) == ["DuplicateIntentError", "int"], out
    for i in range(8):
        race({"a": lambda i=i: a.policies.add_policy(f"a = {i}", author="a"),
              "b": lambda i=i: b.policies.add_policy(f"b = {i}", author="b")})
    assert [p.version for p in a.policies.policy_history()] == list(range(16, 0, -1))


def test_row_lock_past_the_wait_timeout_is_a_typed_error(stores: tuple[SqlStore, SqlStore], mariadb: str,
                                                         prefix: str) -> None:
    a, _ = stores
    aid = a.journal.record_intent(job_id=1, kind=ActionKind.GROW, idempotency_key="g:lock")
    other = create_engine(mariadb)
    try:
        with other.begin() as conn:
            conn.execute(text(f"SELECT id FROM {prefix}actions WHERE id = :i FOR UPDATE"), {"i": aid})
            with pytest.raises(StoreUnavailableError) as err:
                a.journal.mark_in_progress(aid)
            assert err.value.reason == "locked" and "Lock wait timeout" in str(err.value)
    finally:
        other.dispose()
    assert a.journal.mark_in_progress(aid).state is ActionState.IN_PROGRESS  # recovers


def test_killed_connection_is_replaced(stores: tuple[SqlStore, SqlStore], mariadb: str) -> None:
    a, _ = stores
    aid = a.journal.record_intent(job_id=1, kind=ActionKind.GROW, idempotency_key="g:kill")
    with a.db.engine.connect() as conn:
        victim = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
    killer = create_engine(mariadb)
    try:
        with killer.connect() as conn:
            conn.exec_driver_sql(f"KILL CONNECTION {int(victim or 0)}")
    finally:
        killer.dispose()
    assert a.journal.get(aid).state is ActionState.INTENT  # pre-ping replaced the dead connection


def test_decision_queries_and_retention(stores: tuple[SqlStore, SqlStore], clock: FakeClock) -> None:
    a, b = stores
    a.jobs.upsert_job(JobObservation(job_id=1, user="alice", partition="train", state="RUNNING", current_nodes=1,
                                     min_nodes=1, max_nodes=3))
    t0 = clock()
    for i in range(3):
        cycle = a.decisions.begin_cycle(holder="ctl-a")
        a.decisions.record_decisions(cycle, [NewDecision(1, "hold", f"R{i}", "m", {"i": i}),
                                             NewDecision(2, "grow", "BUSY", "m")])
        a.decisions.finish_cycle(cycle, decisions=2, actions=0)
        clock.advance(60)
    last = b.decisions.last_decisions_per_job(2)
    assert [d.reason for d in last[1]] == ["R2", "R1"] and len(last[2]) == 2
    assert [c.count for c in b.decisions.decision_counts(t0)][0] == 3
    assert [d.job_id for d in b.decisions.list_decisions(DecisionFilter(user="alice"))] == [1, 1, 1]
    (keep,) = a.decisions.record_decisions(a.decisions.begin_cycle(), [NewDecision(3, "shrink", "IDLE", "m")])
    open_action = a.journal.record_intent(job_id=3, kind=ActionKind.SHRINK, idempotency_key="s:3",
                                          decision_id=keep)
    clock.advance(3600)
    res = a.retention.prune(Retention(samples_s=60, decisions_s=60, actions_s=60, jobs_s=60, cycles_s=60))
    assert res.decisions == 6 and res.cycles == 4
    assert [d.id for d in a.decisions.list_decisions()] == [keep]
    assert a.journal.get(open_action).decision_id == keep


def test_newer_schema_refused_and_migration_step(mariadb: str, prefix: str, clock: FakeClock) -> None:
    st = SqlStore.open(mariadb, table_prefix=prefix, clock=clock)
    try:
        c = CURRENT_SCHEMA_VERSION
        report = st.ensure_schema(upgrade=True, target=c + 1, migrations={c: lambda conn, m: op_add_column(
            conn, f"{m.prefix}elastic_jobs", Column("priority", Integer, nullable=True))})
        assert report.applied == (c,) and st.schema_version() == c + 1
        assert "priority" in {c["name"] for c in inspect(st.db.engine).get_columns(f"{prefix}elastic_jobs")}
        with pytest.raises(SchemaTooNewError):
            SqlStore.open(mariadb, table_prefix=prefix, clock=clock)
    finally:
        st.drop_all()
        st.close()


def test_schema_1_to_2_on_mariadb(mariadb: str, prefix: str, clock: FakeClock) -> None:
    """The real 1 -> 2 step (elastic_jobs.time_limit_added_min) on MariaDB, where DDL commits at once: a schema-1
    database with a job is upgraded, the row is kept, and the step runs again harmlessly."""
    st = SqlStore.open(mariadb, table_prefix=prefix, clock=clock)
    try:
        st.jobs.upsert_job(JobObservation(job_id=7, user="alice", partition="gpu", current_nodes=2, min_nodes=1,
                                          max_nodes=4, state="RUNNING"))
        with st.db.engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE {prefix}elastic_jobs DROP COLUMN time_limit_added_min"))
            conn.execute(text(f"UPDATE {prefix}schema_version SET version = 1"))
        with pytest.raises(SchemaOutdatedError):
            SqlStore.open(mariadb, table_prefix=prefix, clock=clock)
        report = st.ensure_schema(upgrade=True)
        assert report.applied[0] == 1 and st.schema_version() == CURRENT_SCHEMA_VERSION
        with st.db.engine.begin() as conn:
            MIGRATIONS[1](conn, st.db.models)  # already there: nothing happens
        rec = st.jobs.get_job(7)
        assert rec is not None and rec.user == "alice" and rec.time_limit_added_min == 0
        assert st.jobs.add_time_limit(7, 90) == 90
    finally:
        st.drop_all()
        st.close()



def test_schema_2_to_3_and_take_over_on_mariadb(stores: tuple[SqlStore, SqlStore], mariadb: str, prefix: str,
                                                clock: FakeClock) -> None:
    """The real 2 -> 3 step (the lease holder's process) on MariaDB keeps the old holder's lease; then two
    successors that both found the holder gone race to take it over: the database lets exactly one through, with
    a new epoch, and a holder that renewed in between keeps its lease."""
    a, b = stores
    old = a.lease.acquire("old:1", TTL)
    assert old is not None
    with a.db.engine.begin() as conn:
        for column in ("holder_host", "holder_pid", "holder_scope", "holder_start", "stale_after_s"):
            conn.execute(text(f"ALTER TABLE {prefix}lease DROP COLUMN {column}"))
        conn.execute(text(f"UPDATE {prefix}schema_version SET version = 2"))
    report = a.ensure_schema(upgrade=True, target=3)
    assert report.applied == (2,) and a.schema_version() == 3
    with a.db.engine.begin() as conn:
        MIGRATIONS[2](conn, a.db.models)  # already there: nothing happens
    kept = a.lease.get()
    assert kept is not None and kept.holder == "old:1" and kept.process is None and kept.stale_after is None
    gone = HolderProcess(host="h", pid=41, scope="boot ns", start=7)
    mine = HolderProcess(host="h", pid=42, scope="boot ns", start=8)
    for i in range(10):
        name = f"gone-{i}"
        dead = a.lease.acquire("dead:41", TTL, name=name, process=gone, stale_after=timedelta(seconds=6))
        assert dead is not None and dead.process == gone and dead.stale_after == timedelta(seconds=6)
        out = race({"ctl-a": lambda d=dead: a.lease.take_over("ctl-a", TTL, d, process=mine),
                    "ctl-b": lambda d=dead: b.lease.take_over("ctl-b", TTL, d, process=mine)})
        winners = [r for r in out.values() if isinstance(r, LeaseRecord)]
        assert len(winners) == 1 and winners[0].epoch == dead.epoch + 1, out
    alive = a.lease.acquire("alive:1", TTL, name="renewed")
    assert alive is not None
    clock.advance(1)
    assert a.lease.renew(alive.token(), TTL) is not None
    assert b.lease.take_over("ctl-b", TTL, alive) is None  # it renewed after ctl-b looked


def test_a_cycles_bulk_writes_on_mariadb(stores: tuple[SqlStore, SqlStore], clock: FakeClock) -> None:
    """The cycle's bulk writes on MariaDB: 2,000 decisions in one multi-row INSERT ... RETURNING give their ids in
    order; the units' rows by change (a second identical call writes nothing); the agents' scrapes in one call."""
    a, b = stores
    cycle = a.decisions.begin_cycle(holder="bulk")
    decisions = [NewDecision(job_id=4_000_000_000 + i, action="hold", reason="IN_BAND", message=f"m{i}",
                             inputs={"i": i, "mean_util": i / 7}, current_nodes=1, target_nodes=1)
                 for i in range(2000)]
    ids = a.decisions.record_decisions(cycle, decisions)
    assert len(ids) == 2000 and ids == sorted(ids) and len(set(ids)) == 2000
    stored = {d.id: d for d in b.decisions.list_decisions(DecisionFilter(limit=5000))}
    assert all(stored[i].job_id == d.job_id and stored[i].inputs == d.inputs and stored[i].message == d.message
               for i, d in zip(ids, decisions, strict=True))
    # the hold filter's call: grows and shrinks with their ids, holds without
    assert len(a.decisions.record_rows(cycle, decisions[:3], decisions[3:1500])) == 3
    assert len(b.decisions.list_decisions(DecisionFilter(limit=5000))) == 3500
    seen = [JobObservation(job_id=4_000_000_000 + i, user="alice", partition="train", state="RUNNING",
                           current_nodes=1, min_nodes=1, max_nodes=2, submit_time=clock()) for i in range(700)]
    assert a.jobs.observe_jobs(seen) == 700
    assert a.jobs.observe_jobs(seen) == 0
    assert a.jobs.observe_jobs([*seen[:699], JobObservation(**{**seen[699].__dict__, "current_nodes": 2})]) == 1
    assert b.jobs.get_job(4_000_000_699).current_nodes == 2  # type: ignore[union-attr]
    a.agents.record_scrapes([AgentScrape(f"n{i}", f"http://n{i}:9400", "0.1", 4) for i in range(600)]
                            + [AgentScrape("n0", "http://n0:9400", error="refused")])
    agents = {r.node: r for r in b.agents.list_agents()}
    assert len(agents) == 600 and agents["n0"].last_error == "refused" and agents["n1"].gpu_count == 4


def test_non_ascii_message_and_schema_4_to_5_on_mariadb(mariadb: str, prefix: str, clock: FakeClock) -> None:
    """The test MariaDB's server default is latin1 (as a site's may be): tables are created utf8mb4, so a decision
    message with a non-ASCII character is stored (it was refused, error 1366); the real 4 -> 5 step converts a
    latin1 table of an older database, keeps its rows, and runs again harmlessly."""
    st = SqlStore.open(mariadb, table_prefix=prefix, clock=clock)
    try:
        text_ = "grow 2 → 3 nodes: 95 % ≥ 90 % (Zürich)"
        cycle = st.decisions.begin_cycle(holder="utf8")
        (first,) = st.decisions.record_decisions(cycle, [NewDecision(1, "grow", "BUSY", text_, {"note": text_})])
        assert {d.id: d for d in st.decisions.list_decisions()}[first].message == text_
        with st.db.engine.begin() as conn:
            conn.execute(text(f"DELETE FROM {prefix}decisions"))  # latin1 cannot hold it: an older database's row
            conn.execute(text(f"ALTER TABLE {prefix}decisions CONVERT TO CHARACTER SET latin1"))
        (first,) = st.decisions.record_decisions(cycle, [NewDecision(1, "hold", "IN_BAND", "ascii")])
        with st.db.engine.begin() as conn:
            conn.execute(text(f"UPDATE {prefix}schema_version SET version = 4"))
        report = st.ensure_schema(upgrade=True)
        assert report.applied == (4,) and st.schema_version() == CURRENT_SCHEMA_VERSION
        with st.db.engine.begin() as conn:
            MIGRATIONS[4](conn, st.db.models)  # already utf8mb4: nothing happens
            collation = conn.execute(text(
                "SELECT TABLE_COLLATION FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
                "AND TABLE_NAME = :t"), {"t": f"{prefix}decisions"}).scalar()
        assert str(collation).startswith("utf8mb4")
        (second,) = st.decisions.record_decisions(cycle, [NewDecision(2, "grow", "BUSY", text_, {"note": text_})])
        stored = {d.id: d for d in st.decisions.list_decisions()}
        assert stored[second].message == text_ and stored[second].inputs == {"note": text_}
        assert stored[first].message == "ascii"  # the row written before the conversion is kept
    finally:
        st.drop_all()
        st.close()
