"""Typed, immutable view of Slurm state: what the rest of slurm-elastic reads instead of Slurm's JSON.

Every field that a Slurm version may omit has a neutral default, so the parsers can tolerate missing fields
without inventing data (``None`` means "Slurm did not say").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class GresCount:
    """One GRES entry such as ``gpu:a100:4`` -> name='gpu', type='a100', count=4."""

    name: str
    type: str | None
    count: int

    def __str__(self) -> str:
        return f"{self.name}:{self.type}:{self.count}" if self.type else f"{self.name}:{self.count}"


@dataclass(frozen=True)
class Job:
    """One Slurm job (or one component of a heterogeneous job) as squeue reports it."""

    job_id: int
    name: str
    user: str
    account: str | None
    partition: str
    qos: str | None
    priority: int
    state: str  # base state, upper case: PENDING, RUNNING, COMPLETING, ...
    state_reason: str | None
    nodes: tuple[str, ...]  # expanded hostnames, empty while pending
    batch_host: str | None
    node_count: int
    tres_per_node: str | None  # e.g. "gres:gpu:2" (Slurm's string, kept verbatim)
    gres_per_node: tuple[GresCount, ...]
    time_limit_min: int | None  # None = UNLIMITED / not set
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    comment: str
    admin_comment: str
    uid: int | None = None
    het_job_id: int | None = None  # leader's job id, for het components
    het_job_offset: int | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    state_flags: tuple[str, ...] = ()
    batch_flag: bool = True
    working_dir: str | None = None  # extension jobs run in the leader's working directory
    standard_output: str | None = None  # the --output pattern (extension jobs write where the leader writes)
    standard_error: str | None = None

    @property
    def is_het_component(self) -> bool:
        return self.het_job_id is not None

    @property
    def display_id(self) -> str:
        """How Slurm users write this job: ``8+1`` for het components, ``12_3`` for array tasks."""
        if self.het_job_id is not None and self.het_job_offset is not None:
            return f"{self.het_job_id}+{self.het_job_offset}"
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.job_id)

    @property
    def is_running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def is_pending(self) -> bool:
        return self.state == "PENDING"

    def gpus_per_node(self) -> int:
        return sum(g.count for g in self.gres_per_node if g.name == "gpu")

    def remaining_seconds(self, now: datetime) -> float | None:
        """Seconds of time limit left, or None when the job has no limit or has not started."""
        if self.time_limit_min is None or self.start_time is None:
            return None
        return self.time_limit_min * 60 - (now - self.start_time).total_seconds()


@dataclass(frozen=True)
class Node:
    """One Slurm node as ``scontrol show nodes --json`` (23.02+) or ``sinfo --json`` (22.05) reports it."""

    name: str
    state: str  # base state, upper case: IDLE, MIXED, ALLOCATED, DOWN, ...
    state_flags: tuple[str, ...]  # DRAIN, NOT_RESPONDING, ...
    partitions: tuple[str, ...]
    cpus: int
    alloc_cpus: int | None
    gres: tuple[GresCount, ...]
    gres_used: tuple[GresCount, ...]
    reason: str | None = None
    address: str | None = None
    port: int | None = None
    slurmd_start_time: datetime | None = None  # when the node's current slurmd started (None: not said)

    @property
    def is_drained(self) -> bool:
        return "DRAIN" in self.state_flags or self.state in {"DRAIN", "DRAINED", "DRAINING"}

    @property
    def is_available(self) -> bool:
        """Up and schedulable (not down, drained, failing or not responding)."""
        bad_states = {"DOWN", "FUTURE", "UNKNOWN", "FAIL", "FAILING", "ERROR", "INVAL"}
        bad_flags = {"DRAIN", "NOT_RESPONDING", "MAINTENANCE", "FAIL", "REBOOT_REQUESTED", "POWERED_DOWN"}
        return self.state not in bad_states and not bad_flags.intersection(self.state_flags)

    @property
    def is_idle(self) -> bool:
        return self.state == "IDLE" and self.is_available

    @property
    def is_powered_off(self) -> bool:
        """Switched off by Slurm's power saving, or still booting: no agent can answer there yet."""
        return bool({"POWERED_DOWN", "POWERING_UP"}.intersection(self.state_flags))

    def gpus(self) -> int:
        return sum(g.count for g in self.gres if g.name == "gpu")

    def gpus_used(self) -> int:
        return sum(g.count for g in self.gres_used if g.name == "gpu")


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    is_default: bool = False
    priority_tier: int | None = None
    state: str | None = None


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything the controller reads from Slurm in one cycle, stamped with when it was taken."""

    taken_at: datetime
    jobs: tuple[Job, ...]
    nodes: tuple[Node, ...]
    partitions: tuple[Partition, ...]
    slurm_version: str | None = None
    data_parser: str | None = None
    #: node -> its leaf switch (topology/tree, ``scontrol show topology``); empty: no topology read or none set
    leaf_switch: Mapping[str, str] = field(default_factory=dict, hash=False)
    _by_id: Mapping[int, Job] = field(default_factory=dict, repr=False, compare=False)
    _by_name: Mapping[str, Node] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self._by_id:
            object.__setattr__(self, "_by_id", {j.job_id: j for j in self.jobs})
        # Rebuilt by every replace(): the first node of a name wins, as the scan this replaced did.
        object.__setattr__(self, "_by_name", {n.name: n for n in reversed(self.nodes)})

    def job(self, job_id: int) -> Job | None:
        return self._by_id.get(job_id)

    def node(self, name: str) -> Node | None:
        """By name in O(1): called per node of every unit each cycle (losses, actuator)."""
        return self._by_name.get(name)

    def age_seconds(self, now: datetime) -> float:
        return (now - self.taken_at).total_seconds()
