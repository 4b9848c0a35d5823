"""SqlStore: every store port over one SQLAlchemy engine, and the way to open it.

    store = SqlStore.open("sqlite:////var/lib/slurm-elastic/state.db")
    aid = store.journal.record_intent(job_id=42, kind=ActionKind.GROW, idempotency_key="grow:42:7:1", ...)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine

from slurm_elastic.store.agents_sql import SqlAgents
from slurm_elastic.store.database import Clock, Database, utc_now
from slurm_elastic.store.decisions_sql import SqlDecisions
from slurm_elastic.store.demand_sql import SqlDemand
from slurm_elastic.store.engine import (
    DEFAULT_BUSY_TIMEOUT_MS,
    DEFAULT_DB_URL,
    MYSQL_SOCKET_TIMEOUT_S,
    make_engine,
    parse_url,
)
from slurm_elastic.store.jobs_sql import SqlJobs
from slurm_elastic.store.journal_sql import DEFAULT_MAX_ATTEMPTS, SqlJournal
from slurm_elastic.store.lease_sql import SqlLease
from slurm_elastic.store.migrations import (
    CURRENT_SCHEMA_VERSION,
    MIGRATIONS,
    Migration,
    SchemaReport,
    ensure_schema,
    read_version,
)
from slurm_elastic.store.models import Models, check_prefix, models_for
from slurm_elastic.store.pauses_sql import SqlPauses
from slurm_elastic.store.policy_sql import SqlPolicies
from slurm_elastic.store.protocols import (
    AgentStore,
    DecisionStore,
    JobStore,
    Journal,
    LeaseStore,
    PauseStore,
    PolicyStore,
    RetentionStore,
    SampleStore,
)
from slurm_elastic.store.retention_sql import SqlRetention
from slurm_elastic.store.samples_sql import SqlSamples


@dataclass(frozen=True)
class StoreSettings:
    """How to reach the state DB. ``table_prefix`` lets several stores share one database."""

    url: str = DEFAULT_DB_URL
    table_prefix: str = ""
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS  # journal: tries of one action before a transient failure is final


class SqlStore:
    def __init__(self, engine: Engine, models: Models, *, clock: Clock = utc_now,
                 busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> None:
        self.db = Database(engine, models, clock=clock, busy_timeout_ms=busy_timeout_ms)
        self.journal = SqlJournal(self.db, max_attempts=max_attempts)
        self.decisions = SqlDecisions(self.db)
        self.jobs = SqlJobs(self.db)
        self.samples = SqlSamples(self.db)
        self.policies = SqlPolicies(self.db)
        self.pauses = SqlPauses(self.db)
        self.lease = SqlLease(self.db)
        self.agents = SqlAgents(self.db)
        self.retention = SqlRetention(self.db)
        self.demand = SqlDemand(self.db)

    @classmethod
    def open(
        cls,
        url: str = DEFAULT_DB_URL,
        *,
        table_prefix: str = "",
        clock: Clock = utc_now,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        create: bool = True,
        upgrade: bool = False,
        timeout_s: float = MYSQL_SOCKET_TIMEOUT_S,
    ) -> SqlStore:
        """Connect and check the schema: an empty database is created (``create``), an older schema is
        migrated only with ``upgrade`` (else SchemaOutdatedError), a newer one is refused (SchemaTooNewError).
        ``timeout_s``: a server database's network timeout (store/engine.py)."""
        models = models_for(check_prefix(table_prefix))
        engine = make_engine(url, busy_timeout_ms=busy_timeout_ms, timeout_s=timeout_s)
        store = cls(engine, models, clock=clock, busy_timeout_ms=busy_timeout_ms, max_attempts=max_attempts)
        try:
            store.ensure_schema(create=create, upgrade=upgrade)
        except BaseException:
            engine.dispose()
            raise
        return store

    @classmethod
    def from_settings(cls, settings: StoreSettings, *, clock: Clock = utc_now, create: bool = True,
                      upgrade: bool = False) -> SqlStore:
        return cls.open(settings.url, table_prefix=settings.table_prefix, clock=clock,
                        busy_timeout_ms=settings.busy_timeout_ms, max_attempts=settings.max_attempts,
                        create=create, upgrade=upgrade)

    def ensure_schema(self, *, create: bool = True, upgrade: bool = False, target: int = CURRENT_SCHEMA_VERSION,
                      migrations: dict[int, Migration] | None = None) -> SchemaReport:
        with self.db.translated("check the schema"):
            return ensure_schema(self.db.engine, self.db.models, now=self.db.now(), create=create, upgrade=upgrade,
                                 target=target, migrations=MIGRATIONS if migrations is None else migrations)

    def schema_version(self) -> int | None:
        with self.db.translated("read the schema version"), self.db.engine.connect() as conn:
            return read_version(conn, self.db.models)

    def now(self) -> datetime:
        return self.db.now()

    def drop_all(self) -> None:
        """Drop this prefix's tables (tests, and `db` tooling). Irreversible."""
        with self.db.translated("drop tables"), self.db.engine.begin() as conn:
            self.db.models.metadata.drop_all(conn)

    def close(self) -> None:
        self.db.engine.dispose()


def sqlite_url(path: str | Path) -> str:
    """``sqlite:////abs/path`` for a file path."""
    return f"sqlite:///{Path(path).resolve()}"


def url_backend(url: str) -> str:
    return parse_url(url).get_backend_name()


def _conforms(s: SqlStore) -> tuple[Journal, DecisionStore, JobStore, SampleStore, PolicyStore, PauseStore,
                                   LeaseStore, AgentStore, RetentionStore]:
    """Never called: makes mypy prove that each part implements its Protocol."""
    return (s.journal, s.decisions, s.jobs, s.samples, s.policies, s.pauses, s.lease, s.agents, s.retention)
