"""What goes into the store and what comes out of it: frozen values, no ORM objects, no I/O.

Callers (controller, CLI) build the ``New*`` / ``*Observation`` values and receive the ``*Record`` values; the
SQLAlchemy models stay inside :mod:`slurm_elastic.store`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any


class ActionKind(StrEnum):
    """What an action does to Slurm."""

    SHRINK = "shrink"  # scontrol update NodeList= on the elastic unit
    GROW = "grow"  # sbatch of an extension job
    CANCEL_EXTENSION = "cancel_extension"  # scancel of an extension job
    SIGNAL = "signal"  # grace signal before a shrink
    MOLD = "mold"  # scontrol update NumNodes=min-max of a waiting elastic job (moldable start)
    MIG_WORKFLOW = "mig_workflow"  # one `mig apply` on a node (job_id 0); see slurm_elastic.mig.workflow
    MIG_STEP = "mig_step"  # one step of a MIG workflow (its key is "<workflow key>:<step>")


class ActionState(StrEnum):
    """Journal states. ``intent`` and ``in_progress`` are open; the other three are terminal."""

    INTENT = "intent"
    IN_PROGRESS = "in_progress"
    APPLIED = "applied"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({ActionState.APPLIED, ActionState.FAILED, ActionState.ABORTED})
OPEN_STATES = frozenset({ActionState.INTENT, ActionState.IN_PROGRESS})


class PauseScope(StrEnum):
    JOB = "job"
    PARTITION = "partition"
    GLOBAL = "global"


class SpecSource(StrEnum):
    """Where a job's elastic spec came from."""

    ADMIN_COMMENT = "admin_comment"  # normalized by plugins/job_submit.lua at submit time
    BATCH_SCRIPT = "batch_script"  # read once by the controller (no plugin)
    NONE = "none"  # no directives found


@dataclass(frozen=True)
class FencingToken:
    """Proof of holding a lease: a write guarded by it is refused once the lease moved on (new epoch)."""

    lease: str
    holder: str
    epoch: int


@dataclass(frozen=True)
class HolderProcess:
    """The process holding a lease. ``pid`` and ``start`` only mean something to a reader in the same ``scope``
    (the same boot of the same kernel and the same PID namespace); ``start`` tells a reused pid apart."""

    host: str
    pid: int
    scope: str | None = None  # None: not known on this platform, so only the heartbeat says whether it lives
    start: int | None = None


@dataclass(frozen=True)
class LeaseRecord:
    name: str
    holder: str | None  # None once released
    epoch: int  # fencing token: grows by one each time the lease changes hands (or is re-acquired)
    acquired_at: datetime
    renewed_at: datetime  # the holder's heartbeat
    expires_at: datetime
    process: HolderProcess | None = None  # None: a holder that did not say (schema 2, or released)
    stale_after: timedelta | None = None  # the holder's own bound: a heartbeat older than this is stale

    def is_held(self, now: datetime) -> bool:
        return self.holder is not None and self.expires_at > now

    def heartbeat_age(self, now: datetime) -> timedelta:
        return now - self.renewed_at

    def is_stale(self, now: datetime) -> bool:
        """Held, but its heartbeat is older than the holder's own bound (it is probably gone)."""
        return (self.is_held(now) and self.stale_after is not None
                and self.heartbeat_age(now) > self.stale_after)

    def token(self) -> FencingToken:
        if self.holder is None:
            raise ValueError(f"lease {self.name!r} is released: no fencing token")
        return FencingToken(self.name, self.holder, self.epoch)


@dataclass(frozen=True)
class ActionRecord:
    """One row of the journal."""

    id: int
    job_id: int
    kind: ActionKind
    idempotency_key: str
    params: dict[str, Any]
    state: ActionState
    message: str  # Slurm's message for the last outcome ("" until there is one)
    transient: bool  # the last failure was transient (only meaningful after mark_failed)
    attempts: int  # how many times Slurm was (or may have been) asked: +1 per mark_in_progress
    nodes: int  # nodes this action adds (grow) or takes back (shrink, cancel_extension)
    gpus: int  # GPUs this action adds or takes back
    decision_id: int | None
    cycle_id: int | None
    fencing_epoch: int | None  # lease epoch of the controller that journaled it
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None  # when it reached a terminal state


@dataclass(frozen=True)
class NewDecision:
    """One decision of a cycle, as the controller hands it to :meth:`DecisionStore.record_decisions`.

    ``action`` and ``reason`` are the policy's stable codes (``grow``/``shrink``/``hold``, ``UNDERUTILIZED``);
    ``inputs`` the numbers behind them (JSON-serializable). ``paused`` means the decision was held because of a
    pause; ``dry_run`` that the controller ran in dry-run mode and did not act.
    """

    job_id: int
    action: str
    reason: str
    message: str
    inputs: Mapping[str, object] = field(default_factory=dict)
    current_nodes: int | None = None
    target_nodes: int | None = None
    signal: str | None = None
    profile: str | None = None
    paused: bool = False
    dry_run: bool = False


# A stored hold's input: since when it has been unchanged (controller/hold_filter.py writes it, views read it)
UNCHANGED_SINCE = "unchanged_since"


@dataclass(frozen=True)
class DecisionRecord:
    id: int
    time: datetime
    cycle_id: int
    job_id: int
    action: str
    reason: str
    message: str
    inputs: dict[str, Any]
    current_nodes: int | None
    target_nodes: int | None
    signal: str | None
    profile: str | None
    paused: bool
    dry_run: bool


@dataclass(frozen=True)
class DecisionFilter:
    """``decisions list`` filters; every field narrows, None means "any". ``user`` keeps decisions about jobs of
    that user (as recorded in elastic_jobs), for users who may only see their own jobs."""

    job_id: int | None = None
    since: datetime | None = None
    until: datetime | None = None
    action: str | None = None
    reason: str | None = None
    user: str | None = None
    limit: int | None = None


@dataclass(frozen=True)
class DecisionCount:
    action: str
    reason: str
    count: int


@dataclass(frozen=True)
class GpuTotals:
    """GPUs that joined jobs (applied grows whose extension joined) and GPUs taken back (applied shrinks and
    extension cancels) in a period."""

    granted: int
    reclaimed: int


@dataclass(frozen=True)
class JobObservation:
    """What the controller saw of one elastic unit (a job, or one het component) this cycle."""

    job_id: int  # raw job id of the unit (for a het component: its own raw id, which is what scontrol accepts)
    user: str
    partition: str
    state: str  # Slurm's base state: RUNNING, PENDING, COMPLETED, ...
    current_nodes: int
    min_nodes: int
    max_nodes: int
    het_job_id: int | None = None  # leader's raw job id for a het component
    het_offset: int | None = None
    account: str | None = None
    qos: str | None = None
    name: str | None = None
    spec: str | None = None  # normalized spec text, e.g. "elastic:v1 min=1 max=3"
    spec_source: SpecSource = SpecSource.NONE
    spec_error: str | None = None  # why the directives were ignored, when they were invalid
    nodelist: str | None = None
    gpus_per_node: int | None = None
    submit_time: datetime | None = None


@dataclass(frozen=True)
class ElasticJobRecord:
    job_id: int
    het_job_id: int | None
    het_offset: int | None
    user: str
    account: str | None
    partition: str
    qos: str | None
    name: str | None
    spec: str | None
    spec_source: SpecSource
    spec_error: str | None
    current_nodes: int
    min_nodes: int
    max_nodes: int
    nodelist: str | None
    gpus_per_node: int | None
    state: str
    paused: bool
    submit_time: datetime | None
    first_seen: datetime
    last_seen: datetime
    ended_at: datetime | None
    time_limit_added_min: int = 0  # added on shrinks, not yet given back on grows (extend_time_limit_on_shrink)


@dataclass(frozen=True)
class ExtensionRecord:
    job_id: int  # the extension job's raw id
    parent_job_id: int
    node_count: int
    nodelist: str | None
    state: str
    action_id: int | None  # the grow action that created it
    idempotency_key: str | None  # also in the extension job's comment, for reconcile after a crash
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True)
class NewSample:
    """Downsampled utilization of one job over one interval (the controller aggregates agents' samples)."""

    job_id: int
    time: datetime
    util_mean: float  # percent, 0..100
    util_max: float
    gpus_alloc: int
    gpus_in_use: int
    sample_count: int


@dataclass(frozen=True)
class SampleRecord:
    id: int
    job_id: int
    time: datetime
    util_mean: float
    util_max: float
    gpus_alloc: int
    gpus_in_use: int
    sample_count: int


@dataclass(frozen=True)
class DemandRecord:
    """One slot of a serving unit's demand history (``service``: ``user/job name``)."""

    service: str
    job_id: int
    slot: datetime
    requests_per_s: float
    p99_ms: float | None = None
    replicas: int | None = None


@dataclass(frozen=True)
class PolicyVersionRecord:
    version: int
    toml_text: str
    author: str
    created_at: datetime
    comment: str
    rollback_of: int | None  # the version whose text this one restores, for a rollback


@dataclass(frozen=True)
class PauseRecord:
    scope: PauseScope
    target: str  # job id as text, partition name, or "" for global
    who: str
    created_at: datetime
    reason: str


@dataclass(frozen=True)
class AgentRecord:
    node: str
    url: str
    last_seen: datetime | None  # last successful scrape
    last_attempt: datetime | None
    version: str | None
    gpu_count: int | None
    last_error: str | None  # None after a successful scrape
    last_error_at: datetime | None


@dataclass(frozen=True)
class AgentScrape:
    """One scrape of a node's agent in a cycle: a success (``error`` None) or why it failed."""

    node: str
    url: str
    version: str | None = None
    gpu_count: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class CycleRecord:
    id: int
    started_at: datetime
    finished_at: datetime | None
    holder: str | None
    dry_run: bool
    decisions: int
    actions: int
    error: str | None

    @property
    def duration_s(self) -> float | None:
        return None if self.finished_at is None else (self.finished_at - self.started_at).total_seconds()


@dataclass(frozen=True)
class Retention:
    """How long to keep rows; None keeps forever. Journal rows in an open state are always kept, and so are the
    decisions they point to."""

    samples_s: int | None = 7 * 86400
    decisions_s: int | None = 90 * 86400
    actions_s: int | None = 365 * 86400  # terminal journal rows only
    jobs_s: int | None = 90 * 86400  # ended elastic jobs and extension jobs
    cycles_s: int | None = 30 * 86400
    demand_s: int | None = 42 * 86400  # serving demand slots; the forecast reads the last 5 weeks


@dataclass(frozen=True)
class PruneResult:
    samples: int = 0
    decisions: int = 0
    actions: int = 0
    jobs: int = 0
    extensions: int = 0
    cycles: int = 0
    demand: int = 0


def stored_nodes(nodelist: str | None) -> tuple[str, ...]:
    """The node names of a stored ``nodelist`` (comma-separated, as the store writes it; None or empty: none)."""
    return tuple(n for n in (nodelist or "").split(",") if n)
