"""Schema versions: fresh creation, explicit N -> N+1 migrations, refusal of newer schemas, table prefixes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, create_engine, inspect, text
from sqlalchemy.engine import Connection

from slurm_elastic.store import (
    CURRENT_SCHEMA_VERSION,
    JobObservation,
    MigrationError,
    SchemaError,
    SchemaMissingError,
    SchemaOutdatedError,
    SchemaTooNewError,
    SqlStore,
    StoreUrlError,
    sqlite_url,
)
from slurm_elastic.store.migrations import MIGRATIONS, op_add_column
from slurm_elastic.store.models import Models
from tests.unit.storehelpers import FakeClock


def open_file(path: Path, **kw: object) -> SqlStore:
    return SqlStore.open(sqlite_url(path), clock=FakeClock(), **kw)  # type: ignore[arg-type]


def set_version(store: SqlStore, version: int) -> None:
    sv = store.db.models.schema_version.__table__.name  # type: ignore[attr-defined]
    with store.db.engine.begin() as conn:
        conn.execute(text(f"UPDATE {sv} SET version = :v"), {"v": version})


def add_priority_column(conn: Connection, models: Models) -> None:
    op_add_column(conn, f"{models.prefix}elastic_jobs", Column("priority", Integer, nullable=True))


def test_fresh_database_is_created_at_the_current_version(tmp_path: Path) -> None:
    st = open_file(tmp_path / "s.db")
    assert st.schema_version() == CURRENT_SCHEMA_VERSION
    tables = set(inspect(st.db.engine).get_table_names())
    assert {"elastic_jobs", "extension_jobs", "samples", "decisions", "actions", "policy_versions", "pauses",
            "lease", "agents", "cycles", "schema_version"} <= tables
    st.close()
    again = open_file(tmp_path / "s.db")  # reopening changes nothing
    report = again.ensure_schema()
    assert (report.before, report.after, report.applied, report.created) == (
        CURRENT_SCHEMA_VERSION, CURRENT_SCHEMA_VERSION, (), False)
    again.close()


def test_create_false_refuses_an_empty_database(tmp_path: Path) -> None:
    with pytest.raises(SchemaMissingError, match="db upgrade"):
        open_file(tmp_path / "s.db", create=False)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    st = open_file(tmp_path / "s.db")
    set_version(st, CURRENT_SCHEMA_VERSION + 1)
    st.close()
    with pytest.raises(SchemaTooNewError, match=f"version {CURRENT_SCHEMA_VERSION + 1} but this slurm-elastic "
                                                f"supports up to version {CURRENT_SCHEMA_VERSION}"):
        open_file(tmp_path / "s.db", upgrade=True)


def test_outdated_schema_needs_an_explicit_upgrade(tmp_path: Path) -> None:
    st = open_file(tmp_path / "s.db")
    target = CURRENT_SCHEMA_VERSION + 1
    with pytest.raises(SchemaOutdatedError, match="slurm-elastic db upgrade"):
        st.ensure_schema(target=target, migrations={CURRENT_SCHEMA_VERSION: add_priority_column})
    report = st.ensure_schema(upgrade=True, target=target, migrations={CURRENT_SCHEMA_VERSION: add_priority_column})
    assert (report.before, report.after, report.applied) == (CURRENT_SCHEMA_VERSION, target, (CURRENT_SCHEMA_VERSION,))
    assert st.schema_version() == target
    cols = {c["name"] for c in inspect(st.db.engine).get_columns("elastic_jobs")}
    assert "priority" in cols
    # and now the released code (CURRENT) refuses this newer schema
    with pytest.raises(SchemaTooNewError):
        st.ensure_schema()
    st.close()


def test_steps_run_in_order_from_an_old_version(tmp_path: Path) -> None:
    st = open_file(tmp_path / "s.db")
    ran: list[int] = []

    def step(n: int) -> Callable[[Connection, Models], None]:
        return lambda conn, models: ran.append(n)

    c = CURRENT_SCHEMA_VERSION
    steps = {n: step(n) for n in range(c, c + 3)}
    report = st.ensure_schema(upgrade=True, target=c + 3, migrations=steps)
    assert ran == [c, c + 1, c + 2] and report.applied == (c, c + 1, c + 2) and st.schema_version() == c + 3
    st.close()


def test_missing_step_is_an_error(tmp_path: Path) -> None:
    st = open_file(tmp_path / "s.db")
    c = CURRENT_SCHEMA_VERSION
    with pytest.raises(MigrationError, match=f"no migration from schema version {c + 1} to {c + 2}"):
        st.ensure_schema(upgrade=True, target=c + 2, migrations={c: lambda conn, m: None})
    assert st.schema_version() == c + 1  # the step that existed is kept
    st.close()


def test_failing_step_leaves_the_previous_version_and_no_partial_change(tmp_path: Path) -> None:
    st = open_file(tmp_path / "s.db")

    def half_then_fail(conn: Connection, models: Models) -> None:
        add_priority_column(conn, models)
        raise RuntimeError("boom")

    c = CURRENT_SCHEMA_VERSION
    with pytest.raises(MigrationError, match=f"{c} to {c + 1} failed: boom; the schema is left at version {c}"):
        st.ensure_schema(upgrade=True, target=c + 1, migrations={c: half_then_fail})
    assert st.schema_version() == c
    # SQLite runs DDL inside the transaction: the column is gone with the rollback
    assert "priority" not in {c["name"] for c in inspect(st.db.engine).get_columns("elastic_jobs")}
    st.close()


def test_prefixes_isolate_stores_in_one_database(tmp_path: Path) -> None:
    a = open_file(tmp_path / "s.db", table_prefix="se_")
    b = open_file(tmp_path / "s.db", table_prefix="other_")
    a.policies.add_policy("x = 1", author="root")
    assert b.policies.current_policy() is None
    tables = set(inspect(a.db.engine).get_table_names())
    assert {"se_actions", "other_actions"} <= tables and "actions" not in tables
    b.drop_all()
    assert not any(t.startswith("other_") for t in inspect(a.db.engine).get_table_names())
    assert a.policies.current_policy() is not None
    a.close()
    b.close()


@pytest.mark.parametrize("prefix", ["Bad", "1x", "a-b", "x" * 17])
def test_bad_prefix(tmp_path: Path, prefix: str) -> None:
    with pytest.raises(StoreUrlError, match="table prefix"):
        open_file(tmp_path / "s.db", table_prefix=prefix)


def test_foreign_tables_without_version_table_are_not_adopted(tmp_path: Path) -> None:
    st = open_file(tmp_path / "s.db")
    with st.db.engine.begin() as conn:
        conn.execute(text("DROP TABLE schema_version"))
    st.close()
    with pytest.raises(SchemaError, match="not a slurm-elastic schema"):
        open_file(tmp_path / "s.db")


LEASE_PROCESS_COLUMNS = ("holder_host", "holder_pid", "holder_scope", "holder_start", "stale_after_s")


def _as_schema_2(path: Path) -> None:
    """A database as slurm-elastic with schema 2 left it: a lease row without its holder's process, one job."""
    st = open_file(path)
    st.jobs.upsert_job(JobObservation(job_id=7, user="alice", partition="gpu", current_nodes=2, min_nodes=1,
                                      max_nodes=4, state="RUNNING"))
    assert st.lease.acquire("old:1", timedelta(seconds=90)) is not None
    with st.db.engine.begin() as conn:
        for column in LEASE_PROCESS_COLUMNS:
            conn.execute(text(f"ALTER TABLE lease DROP COLUMN {column}"))
    set_version(st, 2)
    st.close()


def _as_schema_1(path: Path) -> None:
    """A database as slurm-elastic with schema 1 left it: also no elastic_jobs.time_limit_added_min."""
    _as_schema_2(path)
    engine = create_engine(sqlite_url(path))
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE elastic_jobs DROP COLUMN time_limit_added_min"))
        conn.execute(text("UPDATE schema_version SET version = 1"))
    engine.dispose()


def test_schema_1_to_2_adds_the_time_limit_column_and_keeps_the_rows(tmp_path: Path) -> None:
    """The first real migration: `slurm-elastic db upgrade` on a schema-1 database adds
    elastic_jobs.time_limit_added_min (NULL in existing rows: nothing added); the controller refuses to start
    before it."""
    _as_schema_1(tmp_path / "s.db")
    with pytest.raises(SchemaOutdatedError, match="db upgrade"):
        open_file(tmp_path / "s.db")
    st = open_file(tmp_path / "s.db", upgrade=True)
    assert st.schema_version() == CURRENT_SCHEMA_VERSION
    assert "time_limit_added_min" in {c["name"] for c in inspect(st.db.engine).get_columns("elastic_jobs")}
    rec = st.jobs.get_job(7)
    assert rec is not None and rec.user == "alice" and rec.time_limit_added_min == 0
    assert st.jobs.add_time_limit(7, 30) == 30 and st.jobs.add_time_limit(7, -45) == 0  # never below 0
    assert st.jobs.add_time_limit(8, 5) == 0  # an unknown job
    st.close()


def test_the_1_to_2_step_can_run_again(tmp_path: Path) -> None:
    """MySQL commits DDL at once: a step that failed after adding the column must succeed when rerun."""
    _as_schema_1(tmp_path / "s.db")
    st = open_file(tmp_path / "s.db", upgrade=True)
    with st.db.engine.begin() as conn:
        MIGRATIONS[1](conn, st.db.models)  # the column is there already: nothing happens
    assert st.schema_version() == CURRENT_SCHEMA_VERSION
    st.close()


def test_schema_2_to_3_records_the_lease_holder_process_and_keeps_the_old_lease(tmp_path: Path) -> None:
    """The lease of a schema-2 holder survives the upgrade without a process or heartbeat bound, so nobody
    takes it before its TTL; a new acquire records them."""
    _as_schema_2(tmp_path / "s.db")
    with pytest.raises(SchemaOutdatedError, match="version 2"):
        open_file(tmp_path / "s.db")
    st = open_file(tmp_path / "s.db", upgrade=True)
    assert st.schema_version() == CURRENT_SCHEMA_VERSION  # 2 -> 3, then 3 -> 4
    assert set(LEASE_PROCESS_COLUMNS) <= {c["name"] for c in inspect(st.db.engine).get_columns("lease")}
    old = st.lease.get()
    assert old is not None and old.holder == "old:1" and old.process is None and old.stale_after is None
    with st.db.engine.begin() as conn:
        MIGRATIONS[2](conn, st.db.models)  # runs again harmlessly (MySQL commits DDL at once)
    st.close()



def test_serving_demand_table_comes_with_the_upgrade_from_3(tmp_path: Path) -> None:
    """A version-3 database (no serving_demand table) gets it from the 3 -> 4 step, and the store can use it."""
    from datetime import UTC, datetime

    from slurm_elastic.store.records import DemandRecord

    st = open_file(tmp_path / "s.db")
    with st.db.engine.begin() as conn:
        conn.execute(text("DROP TABLE serving_demand"))
    set_version(st, 3)
    st.close()
    with pytest.raises(SchemaOutdatedError):
        open_file(tmp_path / "s.db")
    up = open_file(tmp_path / "s.db", upgrade=True)
    assert up.schema_version() == CURRENT_SCHEMA_VERSION == 5
    assert "serving_demand" in set(inspect(up.db.engine).get_table_names())
    slot = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    up.demand.add_demand(DemandRecord("alice/serve", 7, slot, 120.5, p99_ms=31.0, replicas=2))
    up.demand.add_demand(DemandRecord("alice/serve", 8, slot, 999.0))  # the same slot again: kept as it was
    assert up.demand.demand("alice/serve") == [DemandRecord("alice/serve", 7, slot, 120.5, 31.0, 2)]
    assert up.demand.demand("bob/serve") == []
    up.close()


def test_every_table_is_created_utf8mb4_on_mariadb_and_the_step_is_a_no_op_elsewhere(tmp_path: Path) -> None:
    """MariaDB's own default charset is latin1: each table says utf8mb4 itself (a non-ASCII message was refused
    with error 1366); the 4 -> 5 step that converts older MariaDB tables leaves SQLite alone."""
    from sqlalchemy.dialects import mysql
    from sqlalchemy.schema import CreateTable

    from slurm_elastic.store.models import models_for

    models = models_for("u8_")
    for table in models.metadata.tables.values():
        assert str(CreateTable(table).compile(dialect=mysql.dialect())).rstrip().endswith("CHARSET=utf8mb4"), table
    st = open_file(tmp_path / "s.db")
    set_version(st, 4)
    assert st.ensure_schema(upgrade=True).applied == (4,) and st.schema_version() == CURRENT_SCHEMA_VERSION
    st.close()
