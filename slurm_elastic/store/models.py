"""SQLAlchemy 2.x models of the state DB (typed ``DeclarativeBase`` / ``Mapped``), for any table prefix.

The columns live on plain mixin classes (``*Columns``), which is also the static type the store code sees.
:func:`models_for` maps them onto tables named ``<prefix><table>``, one declarative registry per prefix, so that
several stores can share one database (the MariaDB tests use a random prefix each; a site may use ``se_`` to
share a database with other tools). Index and constraint names carry the table name, hence the prefix too.

Foreign keys: actions.decision_id and extension_jobs.action_id use ON DELETE SET NULL, so retention may drop
old decisions and terminal actions without breaking the rows that point at them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column

from slurm_elastic.store.coltypes import BigId, JobId, JsonText, LongText, UtcDateTime
from slurm_elastic.store.errors import StoreUrlError

PREFIX_RE = re.compile(r"^(?:[a-z][a-z0-9_]{0,15})?$")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s",
    "pk": "pk_%(table_name)s",
}

NAME = 255  # user, account, partition, node names, idempotency keys (utf8mb4 index limit allows 255 chars)
CODE = 64  # states, kinds, reason codes
TABLE_CHARSET = "utf8mb4"  # MariaDB/MySQL tables; see models_for


class _Row:
    """Lets mypy see the keyword constructor that DeclarativeBase gives the mapped classes."""

    __table_prefix__: ClassVar[str]

    if TYPE_CHECKING:
        def __init__(self, **kw: Any) -> None: ...


class SchemaVersionColumns(_Row):
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)  # always 1
    version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class ElasticJobColumns(_Row):
    job_id: Mapped[int] = mapped_column(JobId, primary_key=True, autoincrement=False)
    het_job_id: Mapped[int | None] = mapped_column(JobId, index=True)
    het_offset: Mapped[int | None] = mapped_column(Integer)
    user: Mapped[str] = mapped_column(String(NAME), index=True)
    account: Mapped[str | None] = mapped_column(String(NAME))
    partition: Mapped[str] = mapped_column(String(NAME))
    qos: Mapped[str | None] = mapped_column(String(NAME))
    name: Mapped[str | None] = mapped_column(String(NAME))
    spec: Mapped[str | None] = mapped_column(Text)
    spec_source: Mapped[str] = mapped_column(String(CODE))
    spec_error: Mapped[str | None] = mapped_column(Text)
    current_nodes: Mapped[int] = mapped_column(Integer)
    min_nodes: Mapped[int] = mapped_column(Integer)
    max_nodes: Mapped[int] = mapped_column(Integer)
    nodelist: Mapped[str | None] = mapped_column(Text)
    gpus_per_node: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(CODE), index=True)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    submit_time: Mapped[datetime | None] = mapped_column(UtcDateTime)
    first_seen: Mapped[datetime] = mapped_column(UtcDateTime)
    last_seen: Mapped[datetime] = mapped_column(UtcDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime, index=True)
    # Minutes the controller added to the job's time limit on shrinks and has not given back on grows
    # (schema 2; NULL in rows written before: none).
    time_limit_added_min: Mapped[int | None] = mapped_column(Integer)


class CycleColumns(_Row):
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    holder: Mapped[str | None] = mapped_column(String(NAME))
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    decisions: Mapped[int] = mapped_column(Integer, default=0)
    actions: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)


class DecisionColumns(_Row):
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    time: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    cycle_id: Mapped[int] = mapped_column(BigId, index=True)
    job_id: Mapped[int] = mapped_column(JobId)
    action: Mapped[str] = mapped_column(String(CODE))
    reason: Mapped[str] = mapped_column(String(CODE))
    message: Mapped[str] = mapped_column(Text)
    inputs: Mapped[dict[str, Any]] = mapped_column(JsonText)
    current_nodes: Mapped[int | None] = mapped_column(Integer)
    target_nodes: Mapped[int | None] = mapped_column(Integer)
    signal: Mapped[str | None] = mapped_column(String(CODE))
    profile: Mapped[str | None] = mapped_column(String(NAME))
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        return (Index(None, "job_id", "time"),)


class ActionColumns(_Row):
    """The journal."""

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(JobId, index=True)
    kind: Mapped[str] = mapped_column(String(CODE))
    idempotency_key: Mapped[str] = mapped_column(String(NAME), unique=True)
    params: Mapped[dict[str, Any]] = mapped_column(JsonText)
    state: Mapped[str] = mapped_column(String(CODE), index=True)
    message: Mapped[str] = mapped_column(Text, default="")
    transient: Mapped[bool] = mapped_column(Boolean, default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    nodes: Mapped[int] = mapped_column(Integer, default=0)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    cycle_id: Mapped[int | None] = mapped_column(BigId)
    fencing_epoch: Mapped[int | None] = mapped_column(BigId)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime, index=True)

    @declared_attr
    def decision_id(cls) -> Mapped[int | None]:
        return mapped_column(BigId, ForeignKey(f"{cls.__table_prefix__}decisions.id", ondelete="SET NULL"),
                             index=True)


class ExtensionJobColumns(_Row):
    job_id: Mapped[int] = mapped_column(JobId, primary_key=True, autoincrement=False)
    parent_job_id: Mapped[int] = mapped_column(JobId, index=True)
    node_count: Mapped[int] = mapped_column(Integer)
    nodelist: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(CODE), index=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(NAME), index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    @declared_attr
    def action_id(cls) -> Mapped[int | None]:
        return mapped_column(BigId, ForeignKey(f"{cls.__table_prefix__}actions.id", ondelete="SET NULL"),
                             index=True)


class SampleColumns(_Row):
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(JobId)
    time: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    util_mean: Mapped[float] = mapped_column(Double)
    util_max: Mapped[float] = mapped_column(Double)
    gpus_alloc: Mapped[int] = mapped_column(Integer)
    gpus_in_use: Mapped[int] = mapped_column(Integer)
    sample_count: Mapped[int] = mapped_column(Integer)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        return (Index(None, "job_id", "time"),)


class DemandColumns(_Row):
    """A serving unit's demand per slot (the peak requests/s it published in the slot), kept per service (user and
    job name) so that a resubmitted service keeps its history; the seasonal forecast learns from it."""

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    service: Mapped[str] = mapped_column(String(NAME))
    job_id: Mapped[int] = mapped_column(JobId)
    slot: Mapped[datetime] = mapped_column(UtcDateTime)
    requests_per_s: Mapped[float] = mapped_column(Double)
    p99_ms: Mapped[float | None] = mapped_column(Double, nullable=True)
    replicas: Mapped[int | None] = mapped_column(Integer, nullable=True)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        return (Index(None, "service", "slot"),)


class PolicyVersionColumns(_Row):
    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    toml_text: Mapped[str] = mapped_column(LongText)
    author: Mapped[str] = mapped_column(String(NAME))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    comment: Mapped[str] = mapped_column(Text, default="")
    rollback_of: Mapped[int | None] = mapped_column(Integer)


class PauseColumns(_Row):
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    scope: Mapped[str] = mapped_column(String(CODE))
    target: Mapped[str] = mapped_column(String(NAME))
    who: Mapped[str] = mapped_column(String(NAME))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    reason: Mapped[str] = mapped_column(Text, default="")

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        return (UniqueConstraint("scope", "target"),)


class LeaseColumns(_Row):
    name: Mapped[str] = mapped_column(String(CODE), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(NAME))
    epoch: Mapped[int] = mapped_column(BigId)
    acquired_at: Mapped[datetime] = mapped_column(UtcDateTime)
    renewed_at: Mapped[datetime] = mapped_column(UtcDateTime)  # the holder's heartbeat: every cycle
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)
    # Who holds it, so that a successor can tell a dead holder from a live one (schema 3; NULL: unknown).
    holder_host: Mapped[str | None] = mapped_column(String(NAME))
    holder_pid: Mapped[int | None] = mapped_column(Integer)
    holder_scope: Mapped[str | None] = mapped_column(String(NAME))  # boot id + PID namespace: where pids compare
    holder_start: Mapped[int | None] = mapped_column(BigInteger)  # the process's start time (ticks after boot)
    stale_after_s: Mapped[float | None] = mapped_column(Double)  # heartbeat age past which the holder is stale


class AgentColumns(_Row):
    node: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    url: Mapped[str] = mapped_column(String(1024))
    last_seen: Mapped[datetime | None] = mapped_column(UtcDateTime)
    last_attempt: Mapped[datetime | None] = mapped_column(UtcDateTime)
    version: Mapped[str | None] = mapped_column(String(CODE))
    gpu_count: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    last_error_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


@dataclass(frozen=True)
class Models:
    """The mapped classes of one table prefix."""

    prefix: str
    metadata: MetaData
    schema_version: type[SchemaVersionColumns]
    elastic_job: type[ElasticJobColumns]
    cycle: type[CycleColumns]
    decision: type[DecisionColumns]
    action: type[ActionColumns]
    extension_job: type[ExtensionJobColumns]
    sample: type[SampleColumns]
    policy_version: type[PolicyVersionColumns]
    pause: type[PauseColumns]
    lease: type[LeaseColumns]
    agent: type[AgentColumns]
    demand: type[DemandColumns]

    def table_names(self) -> list[str]:
        return sorted(self.metadata.tables)


def check_prefix(prefix: str) -> str:
    if not PREFIX_RE.match(prefix):
        raise StoreUrlError(f"table prefix {prefix!r}: use up to 16 lower-case letters, digits or '_', "
                            "starting with a letter (or '' for none)")
    return prefix


@functools.cache
def models_for(prefix: str = "") -> Models:
    """The models for tables named ``<prefix><name>`` (cached: one registry per prefix per process)."""
    p = check_prefix(prefix)

    class Base(DeclarativeBase):
        metadata = MetaData(naming_convention=NAMING)

    class SchemaVersion(SchemaVersionColumns, Base):
        __tablename__ = f"{p}schema_version"
        __table_prefix__ = p

    class ElasticJob(ElasticJobColumns, Base):
        __tablename__ = f"{p}elastic_jobs"
        __table_prefix__ = p

    class Cycle(CycleColumns, Base):
        __tablename__ = f"{p}cycles"
        __table_prefix__ = p

    class Decision(DecisionColumns, Base):
        __tablename__ = f"{p}decisions"
        __table_prefix__ = p

    class Action(ActionColumns, Base):
        __tablename__ = f"{p}actions"
        __table_prefix__ = p

    class ExtensionJob(ExtensionJobColumns, Base):
        __tablename__ = f"{p}extension_jobs"
        __table_prefix__ = p

    class Sample(SampleColumns, Base):
        __tablename__ = f"{p}samples"
        __table_prefix__ = p

    class PolicyVersion(PolicyVersionColumns, Base):
        __tablename__ = f"{p}policy_versions"
        __table_prefix__ = p

    class Pause(PauseColumns, Base):
        __tablename__ = f"{p}pauses"
        __table_prefix__ = p

    class Lease(LeaseColumns, Base):
        __tablename__ = f"{p}lease"
        __table_prefix__ = p

    class Agent(AgentColumns, Base):
        __tablename__ = f"{p}agents"
        __table_prefix__ = p

    class Demand(DemandColumns, Base):
        __tablename__ = f"{p}serving_demand"
        __table_prefix__ = p

    for table in Base.metadata.tables.values():
        # MariaDB/MySQL: utf8mb4 whatever the server's or database's default (MariaDB's own is latin1), so a
        # message with a non-ASCII character is stored, not refused (error 1366). Other dialects ignore it.
        table.dialect_options["mysql"]["charset"] = TABLE_CHARSET
    return Models(
        prefix=p,
        metadata=Base.metadata,
        schema_version=SchemaVersion,
        elastic_job=ElasticJob,
        cycle=Cycle,
        decision=Decision,
        action=Action,
        extension_job=ExtensionJob,
        sample=Sample,
        policy_version=PolicyVersion,
        pause=Pause,
        lease=Lease,
        agent=Agent,
        demand=Demand,
    )
