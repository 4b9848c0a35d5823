"""The policy's input and output types: frozen values, no behaviour beyond small derived properties.

Inputs are built by the caller (the controller from Slurm + agents + store, the simulator from its state);
outputs are :class:`Decision` values that one place (the controller's actuator, or the simulator) turns into
effects. Times are ``datetime`` values compared with the ``now`` given to ``decide``; use aware datetimes
(UTC) throughout, or naive ones throughout, never a mix.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slurm_elastic.batchsize import AdaptiveState
from slurm_elastic.directives.spec import ElasticSpec
from slurm_elastic.policy.reasons import Action, Basis, Reason
from slurm_elastic.slurm.model import ClusterSnapshot, GresCount, Job

#: A value in :attr:`Decision.inputs` (what the DB stores next to the decision).
Scalar = int | float | str | bool | None


@dataclass(frozen=True)
class ExtensionJob:
    """One extension (companion) job of a unit: a separate Slurm job whose nodes join the unit's job.

    ``nodes`` are the allocated nodes while running, and the requested node list (possibly empty) while
    pending; ``batch_host`` is the extension's own first node, the one kept if it is ever shrunk in place.
    """

    job_id: int
    state: str  # Slurm base state, upper case: PENDING, RUNNING, COMPLETING, ...
    nodes: tuple[str, ...]
    node_count: int
    submit_time: datetime | None = None
    start_time: datetime | None = None
    batch_host: str | None = None

    @property
    def is_running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def is_pending(self) -> bool:
        """Not started yet: PENDING, or CONFIGURING (allocated, waiting for its nodes to boot: Slurm power
        saving resumes them first), so a unit waits for it instead of growing again meanwhile."""
        return self.state in {"PENDING", "CONFIGURING"}


@dataclass(frozen=True)
class ElasticUnit:
    """One elastic job, or one component of a heterogeneous job that carries directives.

    The unit's id is the raw Slurm job id of ``job`` (for a het component: the component's own job id, which
    is what ``scontrol update`` takes). ``spec`` is the job's ElasticSpec as parsed, *without* site defaults
    applied: the policy resolves every setting itself so that it can say where each value came from.
    ``submitted_nodes`` is the node count the job was submitted with, which is the max when no ``--max-nodes``
    directive was given (the controller keeps it; it defaults to the leader's current count).
    ``time_limit_added_s`` is what shrinks added to the job's time limit and grows have not given back yet
    (extend_time_limit_on_shrink; the controller keeps it): a grow gives back at most that much, so a job's
    limit never ends below what its user asked for.

    Progress, for tail_protection and victim_by_service (None: unknown, and the rules leave the unit alone):
    ``requested_nodes`` is the size the job started with (what it asked for), ``shrunk_s`` the seconds it has
    run below that size since it started, ``attained_gpu_s`` the GPU-seconds it has held since it started (its
    attained service). The controller derives them from its resize journal (:func:`unit_progress`), the
    simulator from its own clock.

    ``molded_request`` is the node count a *molded* job asked for (moldable start began it on fewer,
    policy/moldable.py), None for a job that started at its request: the size it grows back to first
    (MOLDED_REGROW, policy/regrow.py). Its finish-time fairness stays measured against ``requested_nodes`` (the
    size it started with): against the request it was measured and lost (docs/performance.md, "Molded jobs
    growing back"). The controller reads it from the journal's mold action, the simulator from the job it
    molded.
    """

    job: Job
    spec: ElasticSpec
    extensions: tuple[ExtensionJob, ...] = ()
    submitted_nodes: int | None = None
    time_limit_added_s: int = 0
    requested_nodes: int | None = None
    shrunk_s: float | None = None
    attained_gpu_s: float | None = None
    molded_request: int | None = None

    @property
    def unit_id(self) -> int:
        return self.job.job_id

    @property
    def leader_nodes(self) -> int:
        return len(self.job.nodes) if self.job.nodes else self.job.node_count

    @property
    def running_extensions(self) -> tuple[ExtensionJob, ...]:
        return tuple(e for e in self.extensions if e.is_running)

    @property
    def pending_extensions(self) -> tuple[ExtensionJob, ...]:
        return tuple(e for e in self.extensions if e.is_pending)

    @property
    def pending_extension_count(self) -> int:
        return sum(1 for e in self.extensions if e.is_pending)

    @property
    def current_nodes(self) -> int:
        """Leader nodes plus the nodes of running extension jobs."""
        return self.leader_nodes + sum(_ext_nodes(e) for e in self.extensions if e.is_running)

    @property
    def min_nodes(self) -> int:
        return self.spec.min_nodes

    @property
    def max_nodes(self) -> int:
        if self.spec.max_nodes is not None:
            return self.spec.max_nodes
        submitted = self.submitted_nodes if self.submitted_nodes is not None else self.leader_nodes
        return max(submitted, self.spec.min_nodes)

    @property
    def keep_host(self) -> str | None:
        """The node a shrink never takes: the batch host, or the first node of a het component without one."""
        if self.job.batch_host is not None and self.job.batch_host in self.job.nodes:
            return self.job.batch_host
        return self.job.nodes[0] if self.job.nodes else None


def _ext_nodes(ext: ExtensionJob) -> int:
    return len(ext.nodes) if ext.nodes else ext.node_count


@dataclass(frozen=True)
class ThroughputSample:
    """The job's own throughput (samples/s, or steps/s times the global batch) at a size, for goodput."""

    at: datetime
    nodes: int
    value: float


@dataclass(frozen=True)
class JobUtilization:
    """What the agents measured for one unit, aggregated by the caller over the unit's window.

    ``window_s`` is the length the samples actually cover (last minus first sample time, or the caller's
    notion of it) and ``samples`` their count; the caller aggregates over :func:`resolve_unit`'s
    ``window_s`` for the unit. Utilization is in percent (0..100); None means "not measured", never 0.
    ``restart_s`` is the job's observed restart time, when known (refines restart_cost_s).
    """

    unit_id: int
    mean_util: float | None
    max_util: float | None
    window_s: float
    samples: int
    last_sample_at: datetime | None
    gpus_allocated: int = 0
    gpus_in_use: int = 0
    throughput: tuple[ThroughputSample, ...] = ()
    restart_s: float | None = None
    # adaptive batch size: the job's opt-in, gradient statistics and step-time fit (slurm_elastic.batchsize)
    adaptive: AdaptiveState | None = None


@dataclass(frozen=True)
class ServingPoint:
    """One line a serving unit published (slurm_elastic.serving): requests/s and latency over its interval."""

    at: datetime
    requests_per_s: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    queue_depth: int | None = None
    replicas: int | None = None


@dataclass(frozen=True)
class ServingLoad:
    """What the caller read for one serving unit: its published points (oldest first, the long window's),
    the demand forecast for ``forecast_lead_s`` ahead (req/s; None: no forecast yet), the measured cold start
    of a replica, and the measured requests/s one replica carries within the SLO (None: unknown)."""

    unit_id: int
    points: tuple[ServingPoint, ...] = ()
    forecast_rps: float | None = None
    forecast_lead_s: float | None = None
    cold_start_s: float | None = None
    rps_per_replica: float | None = None


class Outcome(enum.StrEnum):
    INTENT = "intent"  # journaled, not (yet) known to be applied
    APPLIED = "applied"
    FAILED = "failed"


@dataclass(frozen=True)
class AdmitBasis:
    """What a shrink-to-admit for pending job ``job_id`` was based on, so that the policy can tell whether
    anything changed since: the job's ``request`` (nodes, GRES per node, partitions) and ``holders``, the running
    jobs (extension jobs aside) that held nodes of its partitions. Slurm not starting the job after the shrink
    means it chose otherwise; shrinking again only makes sense once one of those holders ended or the request
    changed (jobs that started since do not count: a backfilled job taking the freed nodes is the very case to
    not chase)."""

    job_id: int
    request: str
    holders: frozenset[int]

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "request": self.request, "holders": sorted(self.holders)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> AdmitBasis:
        return cls(int(raw["job_id"]), str(raw["request"]), frozenset(int(h) for h in raw["holders"]))


def admit_request(job: Job) -> str:
    """A pending job's request as compared by :class:`AdmitBasis`."""
    gres = ",".join(sorted(f"{g.name}:{g.type or ''}:{g.count}" for g in job.gres_per_node))
    return f"{job.node_count}|{gres}|{job.partition}"


@dataclass(frozen=True)
class ResizeRecord:
    """One past resize of a unit (from the store's journal). Any outcome starts the cooldown.

    ``for_job`` is the pending job a SHRINK_TO_ADMIT was made for, ``admit_basis`` what it was based on (used
    to back off when Slurm does not start the job after all, until something changes).
    """

    at: datetime
    unit_id: int
    action: Action
    from_nodes: int
    to_nodes: int
    outcome: Outcome
    reason: str = ""
    for_job: int | None = None
    admit_basis: AdmitBasis | None = None


@dataclass(frozen=True)
class ActionInProgress:
    """An action of the shell's for ``unit_id`` that is not finished yet (a shrink in its grace period, a grow
    being submitted): ``kind`` is what it does (``grow``, ``shrink``, ``cancel_extension``, ...), ``since`` when
    it was decided. The unit takes no other action meanwhile (ACTION_IN_PROGRESS)."""

    unit_id: int
    kind: str
    since: datetime


@dataclass(frozen=True)
class ExtensionEnd:
    """An extension job of ``unit_id`` that has ended: with its Slurm state and when it was submitted and ended,
    the grow back-off tells a job that died on its own from one that was cancelled or lost to Slurm."""

    unit_id: int
    job_id: int
    state: str  # Slurm base state it ended in (FAILED, CANCELLED, PREEMPTED, ...), or ENDED when unknown
    submitted_at: datetime
    ended_at: datetime
    #: A failure the controller recorded for this grow whatever Slurm's end state says (a cancelled extension
    #: often ends COMPLETED): PREWARM_FAILED, RESUME_FAILED, or GROW_REFUSED (sbatch refused it; job_id 0).
    failure: str = ""


@dataclass(frozen=True)
class PowerState:
    """What the shell knows of Slurm's power saving: ``resume_s`` per node (the measured time from a resume
    request to the node being IDLE, from the nodes' history; docs/power-saving.md), Slurm's ``ResumeTimeout``
    (bounds every estimate; None: unknown) and ``resume_failed`` (node -> when its last resume failed: not
    grown onto for power_resume_backoff_s)."""

    resume_s: Mapping[str, float] = field(default_factory=dict, hash=False)
    resume_timeout_s: float | None = None
    resume_failed: Mapping[str, datetime] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class PolicyInput:
    """Everything ``decide`` looks at besides the config and the time.

    Pending jobs, nodes and partitions come from ``snapshot``. ``utilization`` is keyed by unit id (a unit
    without an entry has NO_METRICS). ``account_shares`` are the accounts' weights for fair share (sshare's
    normalized shares or fair-share factors; only ratios matter). The controller and the simulator build it
    with :class:`~slurm_elastic.policy.inputs.PolicyInputBuilder`, from the same kinds of facts.
    """

    snapshot: ClusterSnapshot
    units: tuple[ElasticUnit, ...]
    utilization: Mapping[int, JobUtilization] = field(default_factory=dict, hash=False)
    history: tuple[ResizeRecord, ...] = ()
    account_shares: Mapping[str, float] = field(default_factory=dict, hash=False)
    #: Slurm's GPU limits by scope (``account:nlp``, ``qos:high``, ...; see policy/gpulimits.py): grows stay within
    gpu_limits: Mapping[str, int] = field(default_factory=dict, hash=False)
    #: The QOS extension jobs are submitted in (``[extension] qos``, e.g. a preemptible scavenger QOS); None:
    #: the leader's. QOS quotas and Slurm's QOS GPU limits are checked against the QOS the extension runs in.
    extension_qos: str | None = None
    #: The shell's unfinished actions: such a unit's action is held (ACTION_IN_PROGRESS, policy/holds.py).
    in_progress: tuple[ActionInProgress, ...] = ()
    #: The units' extension jobs that ended lately: grows back off after ones that died on their own
    #: (GROW_BACKOFF, policy/holds.py).
    extension_ends: tuple[ExtensionEnd, ...] = ()
    #: Serving units' published load and forecast, by unit id (policy/serving.py).
    serving: Mapping[int, ServingLoad] = field(default_factory=dict, hash=False)
    #: Slurm power saving: resume times, ResumeTimeout, failed resumes (powered-down nodes as capacity).
    power: PowerState = field(default_factory=PowerState)
    #: Waiting jobs that moldable start may start on fewer whole nodes than they asked for: job id -> the fewest
    #: (their ``#ELASTIC`` min). With the allocator such a job enters the round plan at a share (policy/plan.py).
    pending_min_nodes: Mapping[int, int] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class GrowPlan:
    """Grow = ONE extension job spanning ``nodes`` (``sbatch --nodes=len(nodes) --nodelist=...``).

    One job per decision, not one per node: its workers join the rendezvous together (one restart of the
    worker group, not one per node), it is one journal entry, and Slurm starts it all-or-nothing, which is
    what the policy counted. It runs as ``user`` with the leader's account, partition, QOS and GRES per node,
    and a time limit of at most ``time_limit_s`` (the leader's remaining time once ``time_limit_sub_s`` is
    given back; None: no limit). ``time_limit_sub_s``: seconds to take off the leader's time limit, out of what
    earlier shrinks added (extend_time_limit_on_shrink), since the remaining work now runs faster.
    """

    nodes: tuple[str, ...]
    partition: str
    gres_per_node: tuple[GresCount, ...]
    tres_per_node: str | None
    user: str
    account: str | None
    qos: str | None
    time_limit_s: int | None
    extension_jobs: int = 1
    time_limit_sub_s: int = 0
    #: the powered-down ones among ``nodes``: Slurm resumes them for the extension job (power_resume)
    resume_nodes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        # resume_nodes only when there are some: grows onto powered-on nodes keep their stored form
        extra: dict[str, Any] = {"resume_nodes": list(self.resume_nodes)} if self.resume_nodes else {}
        return {
            "nodes": list(self.nodes),
            "partition": self.partition,
            "gres_per_node": [str(g) for g in self.gres_per_node],
            "tres_per_node": self.tres_per_node,
            "user": self.user,
            "account": self.account,
            "qos": self.qos,
            "time_limit_s": self.time_limit_s,
            "extension_jobs": self.extension_jobs,
            "time_limit_sub_s": self.time_limit_sub_s,
        } | extra


@dataclass(frozen=True)
class ExtensionShrink:
    """Shrink one running extension job in place (``scontrol update JobId=.. NodeList=keep``)."""

    job_id: int
    keep_nodes: tuple[str, ...]


@dataclass(frozen=True)
class ShrinkPlan:
    """How to take nodes back, in the order the shell carries it out (after the grace period).

    1. cancel ``cancel_extensions`` (pending extension jobs first, then running ones newest first);
    2. shrink ``shrink_extension`` in place, when only part of an extension job goes;
    3. ``scontrol update JobId=<unit> NodeList=<leader_keep_nodes>`` when set (the keep host always stays).
    ``released_nodes`` lists every node given back. ``admits`` names the pending jobs a SHRINK_TO_ADMIT is for.
    ``time_limit_add_s``: seconds to add to the unit's time limit once the nodes are gone (0: leave it as is;
    extend_time_limit_on_shrink), so that its remaining work still fits at the smaller size.
    """

    cancel_extensions: tuple[int, ...]
    shrink_extension: ExtensionShrink | None
    leader_keep_nodes: tuple[str, ...] | None
    released_nodes: tuple[str, ...]
    admits: tuple[int, ...] = ()
    time_limit_add_s: int = 0
    admit_basis: tuple[AdmitBasis, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "cancel_extensions": list(self.cancel_extensions),
            "shrink_extension": None
            if self.shrink_extension is None
            else {"job_id": self.shrink_extension.job_id, "keep_nodes": list(self.shrink_extension.keep_nodes)},
            "leader_keep_nodes": None if self.leader_keep_nodes is None else list(self.leader_keep_nodes),
            "released_nodes": list(self.released_nodes),
            "admits": list(self.admits),
            "time_limit_add_s": self.time_limit_add_s,
            "admit_basis": [b.to_dict() for b in self.admit_basis],
        }


@dataclass(frozen=True)
class Decision:
    """One decision for one unit. ``decide`` returns exactly one per unit, holds included.

    ``reason`` is the stable code and ``message`` the human line with its numbers; ``inputs`` are the values
    that mattered (utilization, thresholds, and where each threshold came from, as ``<key>.source``) for the
    DB and ``explain``. ``basis`` says which signal the decision rests on. A shrink carries the ``grace_s`` and
    ``signal`` the shell must honour before taking nodes; ``profile`` is the active config profile, if any.
    """

    unit_id: int
    display_id: str
    action: Action
    current_nodes: int
    target_nodes: int
    reason: Reason
    message: str
    basis: Basis
    priority: int
    inputs: Mapping[str, Scalar] = field(default_factory=dict, hash=False)
    grow: GrowPlan | None = None
    shrink: ShrinkPlan | None = None
    grace_s: int = 0
    signal: str | None = None
    profile: str | None = None

    @property
    def is_action(self) -> bool:
        return self.action is not Action.HOLD

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit_id": self.unit_id,
            "display_id": self.display_id,
            "action": str(self.action),
            "current_nodes": self.current_nodes,
            "target_nodes": self.target_nodes,
            "reason": str(self.reason),
            "message": self.message,
            "basis": str(self.basis),
            "priority": self.priority,
            "inputs": dict(self.inputs),
            "grow": None if self.grow is None else self.grow.to_dict(),
            "shrink": None if self.shrink is None else self.shrink.to_dict(),
            "grace_s": self.grace_s,
            "signal": self.signal,
            "profile": self.profile,
        }
