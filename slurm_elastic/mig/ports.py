"""The MIG workflow's ports: the settings it runs with, the values it exchanges, and the Protocols through which
every side effect goes (journal, Slurm, agent, config files, daemons, clock, node lock). The adapters that
satisfy them live in :mod:`slurm_elastic.mig.adapters`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from slurm_elastic.mig.model import NodeLayout
from slurm_elastic.mig.steps import MigStepOutcome, Record
from slurm_elastic.mig.wire import NodeMigReport


@dataclass(frozen=True)
class WorkflowSettings:
    """What a workflow needs from the site's configuration; stored with the workflow so a resume uses the same."""

    slurm_conf: str
    gres_conf: str
    device_files: str = "nvidia-caps"  # or a template such as /var/tmp/cl/dev/{node}/gpu{ordinal}
    mps_per_gpu: int = 0  # gres/mps count per whole GPU (0: no mps lines)
    autodetect_off: bool = False
    whole_gpu_type: str | None = None  # Slurm type of whole GPUs when the model has none
    wait_timeout_s: float = 3600.0
    verify_timeout_s: float = 120.0
    poll_interval_s: float = 5.0
    apply_mode: str = "restart"  # "restart" (measured on 22.05) or "reconfigure"
    reconfigure_after_restart: bool = True
    reason_prefix: str = "slurm-elastic mig"

    def to_obj(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> WorkflowSettings:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in obj.items() if k in known})


@dataclass(frozen=True)
class NodeStatus:
    name: str
    state: str  # base state, upper case (IDLE, MIXED, ...)
    flags: tuple[str, ...]
    reason: str | None
    gres: str  # Slurm's view, e.g. "gpu:4,mps:400"
    slurmd_started_at: float | None = None  # when the node's current slurmd started (Unix seconds, node clock)

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in {"DRAIN", "DRAINED", "DRAINING"}

    @property
    def registered(self) -> bool:
        """slurmd registered with a valid configuration (not INVAL, not down, responding)."""
        bad_states = {"DOWN", "UNKNOWN", "INVAL", "FAIL", "FUTURE"}
        bad_flags = {"NOT_RESPONDING", "INVALID_REG", "INVAL", "FAIL"}
        return self.state not in bad_states and not bad_flags.intersection(self.flags)


@dataclass(frozen=True)
class JobOnNode:
    job_id: int
    user: str
    state: str


class WorkflowJournal(Protocol):
    def create(self, key: str, kind: str, params: Mapping[str, object], gpus: int) -> Record: ...
    def get(self, record_id: int) -> Record: ...
    def find(self, key: str) -> Record | None: ...
    def start(self, record_id: int) -> Record: ...
    def finish(self, record_id: int, message: str) -> Record: ...
    def fail(self, record_id: int, message: str) -> Record: ...
    def abort(self, record_id: int, message: str) -> Record: ...
    def open_workflows(self) -> list[Record]: ...


class SlurmPort(Protocol):
    def node_status(self, node: str) -> NodeStatus: ...
    def jobs_on(self, node: str) -> tuple[JobOnNode, ...]: ...
    def drain(self, node: str, reason: str) -> None: ...
    def resume(self, node: str) -> None: ...
    def reconfigure(self) -> None: ...


class AgentPort(Protocol):
    def report(self, node: str) -> NodeMigReport: ...
    def apply(self, node: str, layout: NodeLayout) -> tuple[tuple[str, ...], NodeMigReport]: ...


class FilesPort(Protocol):
    def read(self, path: str) -> str: ...
    def write(self, path: str, text: str) -> None: ...


class DaemonsPort(Protocol):
    def stop_slurmd(self, node: str) -> None: ...
    def start_slurmd(self, node: str) -> None: ...
    def restart_slurmctld(self) -> None: ...


class ClockPort(Protocol):
    def now(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class NodeLockPort(Protocol):
    """One workflow process per node at a time: ``hold`` raises :class:`WorkflowBusyError` when another live
    process holds the node (the lock must die with its process, so that a crash never blocks a resume)."""

    def hold(self, node: str) -> AbstractContextManager[None]: ...


class NoLock:
    def hold(self, node: str) -> AbstractContextManager[None]:
        return nullcontext()


@dataclass
class WorkflowPorts:
    journal: WorkflowJournal
    slurm: SlurmPort
    agent: AgentPort
    files: FilesPort
    daemons: DaemonsPort
    clock: ClockPort
    fault: Callable[[str], None] = field(default=lambda point: None)
    say: Callable[[str], None] = field(default=lambda line: None)
    lock: NodeLockPort = field(default_factory=NoLock)


@dataclass(frozen=True)
class WorkflowResult:
    workflow_id: int
    node: str
    outcome: MigStepOutcome
    message: str
    steps: tuple[tuple[str, str, str], ...]  # (step, state, message), in journal order
