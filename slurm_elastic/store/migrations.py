"""Schema versions and explicit migrations.

The schema version is one row of ``<prefix>schema_version``. A migration is a function that takes the schema from
version N to N+1 (``MIGRATIONS[N]``); :func:`ensure_schema` runs them in order, each in its own transaction
with the version bump, so an interrupted upgrade resumes at the first step not done. (SQLite and PostgreSQL run
DDL inside the transaction; MySQL/MariaDB commit each DDL statement implicitly, so a step that fails there may
be half applied: write steps that can run again.)

An empty database is created directly at :data:`CURRENT_SCHEMA_VERSION` from the models. A database whose version
is newer than this code is refused: an older controller must not write to a schema it does not know.

Adding a migration: bump CURRENT_SCHEMA_VERSION to N+1, change the models, and add ``MIGRATIONS[N]`` doing the
same change with DDL (``op_add_column`` below, or ``conn.exec_driver_sql``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import BigInteger, Column, Double, Engine, Integer, String, inspect, select, update
from sqlalchemy.engine import Connection

from slurm_elastic.store.engine import BEGIN_OPTION
from slurm_elastic.store.errors import (
    MigrationError,
    SchemaError,
    SchemaMissingError,
    SchemaOutdatedError,
    SchemaTooNewError,
    StoreError,
)
from slurm_elastic.store.models import TABLE_CHARSET, Models

CURRENT_SCHEMA_VERSION = 5

Migration = Callable[[Connection, Models], None]


def _add_time_limit_added(conn: Connection, models: Models) -> None:
    """1 -> 2: elastic_jobs.time_limit_added_min, the minutes the controller added to a job's time limit on
    shrinks and has not given back (extend_time_limit_on_shrink). Nullable: existing rows mean none. Runs again
    harmlessly (MySQL commits DDL at once, so a failed step may be half applied)."""
    table = f"{models.prefix}elastic_jobs"
    if "time_limit_added_min" not in {c["name"] for c in inspect(conn).get_columns(table)}:
        op_add_column(conn, table, Column("time_limit_added_min", Integer, nullable=True))


def _add_lease_holder_process(conn: Connection, models: Models) -> None:
    """2 -> 3: the lease says which process holds it (host, pid, boot/PID-namespace scope, start time) and after
    how long its heartbeat counts as stale, so a restarted controller takes over from a dead holder at once
    instead of after the TTL. Nullable: an old holder's row says nothing, and waits for its TTL as before.
    Adds only the columns still missing, so it runs again harmlessly."""
    table = f"{models.prefix}lease"
    have = {c["name"] for c in inspect(conn).get_columns(table)}
    wanted: list[Column[object]] = [
        Column("holder_host", String(255), nullable=True),
        Column("holder_pid", Integer, nullable=True),
        Column("holder_scope", String(255), nullable=True),
        Column("holder_start", BigInteger, nullable=True),
        Column("stale_after_s", Double, nullable=True),
    ]
    for column in wanted:
        if column.name not in have:
            op_add_column(conn, table, column)


def _add_serving_demand(conn: Connection, models: Models) -> None:
    """3 -> 4: ``serving_demand``, the demand history of serving units (docs/serving.md, the forecast). A new
    table: created only when missing, so it runs again harmlessly."""
    table = models.demand.__table__  # type: ignore[attr-defined]
    table.create(conn, checkfirst=True)


def _tables_to_utf8mb4(conn: Connection, models: Models) -> None:
    """4 -> 5: on MariaDB/MySQL, every table in utf8mb4 (the models now say so; a database created with the
    server's latin1 default refused a decision message with a non-ASCII character, error 1366). Converts only
    the tables not yet in utf8mb4, so it runs again harmlessly; other databases store Unicode already."""
    if conn.dialect.name not in ("mysql", "mariadb"):
        return
    names = [t for t in models.table_names() if inspect(conn).has_table(t)]
    for name in names:
        charset = conn.exec_driver_sql(
            "SELECT c.CHARACTER_SET_NAME FROM information_schema.TABLES t JOIN "
            "information_schema.COLLATION_CHARACTER_SET_APPLICABILITY c ON c.COLLATION_NAME = t.TABLE_COLLATION "
            "WHERE t.TABLE_SCHEMA = DATABASE() AND t.TABLE_NAME = %s", (name,)).scalar()
        if charset != TABLE_CHARSET:
            conn.exec_driver_sql(f"ALTER TABLE {name} CONVERT TO CHARACTER SET {TABLE_CHARSET}")


# N -> the function taking schema N to N+1.
MIGRATIONS: Mapping[int, Migration] = {1: _add_time_limit_added, 2: _add_lease_holder_process,
                                       3: _add_serving_demand, 4: _tables_to_utf8mb4}


@dataclass(frozen=True)
class SchemaReport:
    before: int | None  # None: the database was empty
    after: int
    applied: tuple[int, ...]  # the N of each N -> N+1 step run
    created: bool


def _write(engine: Engine) -> Engine:
    return engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})


def read_version(conn: Connection, models: Models) -> int | None:
    """The schema version, or None for a database without any of this prefix's tables."""
    insp = inspect(conn)
    vt = models.schema_version.__table__.name  # type: ignore[attr-defined]
    if not insp.has_table(vt):
        present = [t for t in models.table_names() if t != vt and insp.has_table(t)]
        if present:
            raise SchemaError(f"tables {', '.join(present)} exist but {vt} does not: not a slurm-elastic "
                              "schema, or a damaged one; use another database or table prefix")
        return None
    version = conn.execute(select(models.schema_version.version).where(models.schema_version.id == 1)).scalar()
    if version is None:
        raise SchemaError(f"{vt} is empty: damaged schema")
    return int(version)


def _stamp(conn: Connection, models: Models, version: int, now: datetime, *, insert: bool) -> None:
    sv = models.schema_version
    if insert:
        conn.execute(sv.__table__.insert().values(id=1, version=version, updated_at=now))  # type: ignore[attr-defined]
    else:
        conn.execute(update(sv).where(sv.id == 1).values(version=version, updated_at=now))


def ensure_schema(
    engine: Engine,
    models: Models,
    *,
    now: datetime,
    create: bool = True,
    upgrade: bool = False,
    target: int = CURRENT_SCHEMA_VERSION,
    migrations: Mapping[int, Migration] = MIGRATIONS,
) -> SchemaReport:
    """Make the database's schema ``target`` or explain why not.

    * empty database: created at CURRENT_SCHEMA_VERSION (then migrated to ``target`` if higher), unless
      ``create`` is False (SchemaMissingError);
    * older: migrated step by step if ``upgrade``, else SchemaOutdatedError;
    * newer: SchemaTooNewError, always.
    """
    created = False
    with _write(engine).begin() as conn:
        before = read_version(conn, models)
        if before is None:
            if not create:
                raise SchemaMissingError(f"no slurm-elastic schema (prefix {models.prefix!r}) in this database; "
                                         "run `slurm-elastic db upgrade` to create it")
            models.metadata.create_all(conn, checkfirst=True)
            _stamp(conn, models, CURRENT_SCHEMA_VERSION, now, insert=True)
            created = True
    version = CURRENT_SCHEMA_VERSION if before is None else before
    if version > target:
        raise SchemaTooNewError(f"the state DB schema is version {version} but this slurm-elastic supports up to "
                                f"version {target}: upgrade slurm-elastic (refusing to touch a newer schema)")
    if version < target and not upgrade:
        raise SchemaOutdatedError(f"the state DB schema is version {version}, this slurm-elastic needs version "
                                  f"{target}: stop the controller(s) and run `slurm-elastic db upgrade`")
    applied: list[int] = []
    for n in range(version, target):
        step = migrations.get(n)
        if step is None:
            raise MigrationError(f"no migration from schema version {n} to {n + 1}; schema left at version {n}")
        try:
            with _write(engine).begin() as conn:
                current = read_version(conn, models)
                if current != n:  # another process migrated meanwhile
                    if current is not None and current > n:
                        continue
                    raise MigrationError(f"schema version changed under us: expected {n}, found {current}")
                step(conn, models)
                _stamp(conn, models, n + 1, now, insert=False)
        except StoreError:
            raise
        except Exception as e:
            raise MigrationError(f"migration from schema version {n} to {n + 1} failed: {e}; the schema is left "
                                 f"at version {n} (on MySQL/MariaDB the step may be partly applied)") from e
        applied.append(n)
    return SchemaReport(before=before, after=max(version, target), applied=tuple(applied), created=created)


def op_add_column(conn: Connection, table_name: str, column: Column[object]) -> None:
    """``ALTER TABLE ... ADD COLUMN`` rendered for the connection's dialect (helper for migration steps)."""
    col_spec = column.compile(dialect=conn.dialect)  # the name
    type_spec = column.type.compile(dialect=conn.dialect)
    null = "" if column.nullable else " NOT NULL"
    conn.exec_driver_sql(f"ALTER TABLE {table_name} ADD COLUMN {col_spec} {type_spec}{null}")

