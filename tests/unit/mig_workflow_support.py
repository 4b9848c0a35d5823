"""Fakes for the MIG workflow's ports (not a test module): a node with two A100-40GB GPUs behind the real
MigService over FakeMigDevice, an in-memory Slurm that reads the GRES from the fake slurm.conf when its
daemons restart, config files in a dict, a clock that moves only when slept, and the real store's journal."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from slurm_elastic.agent.mig_service import MigService
from slurm_elastic.mig.adapters import MigStoreJournal
from slurm_elastic.mig.catalog import load_catalog
from slurm_elastic.mig.errors import WorkflowError
from slurm_elastic.mig.model import NodeLayout
from slurm_elastic.mig.ports import JobOnNode, NodeStatus, WorkflowPorts, WorkflowSettings
from slurm_elastic.mig.slurmconf import node_gres_value
from slurm_elastic.mig.wire import NodeMigReport
from slurm_elastic.mig.workflow import MigWorkflow
from slurm_elastic.store import SqlStore
from slurm_elastic.testing.mig_fake import FakeMigDevice

NODE = "n4"
SLURM_CONF = """ClusterName=elastic
GresTypes=gpu,mps
NodeName=n[1-4] NodeHostname=vm NodeAddr=127.0.0.1 Port=[17001-17004] CPUs=8 Gres=gpu:2,mps:200 State=UNKNOWN
PartitionName=train Nodes=n[1-4] Default=YES
"""
GRES_CONF = "".join(
    f"NodeName={n} Name=gpu File=/dev/{n}/gpu[0-1]\nNodeName={n} Name=mps Count=200 File=/dev/{n}/gpu[0-1]\n"
    for n in ("n1", "n2", "n3", "n4")
)
SETTINGS = WorkflowSettings(
    slurm_conf="/etc/slurm/slurm.conf", gres_conf="/etc/slurm/gres.conf", device_files="/dev/{node}/gpu{ordinal}",
    mps_per_gpu=100, wait_timeout_s=60, verify_timeout_s=30, poll_interval_s=5,
)


class Crash(BaseException):
    """The process dies here (BaseException: nothing in the workflow catches it)."""


@dataclass
class FakeClock:
    t: float = 1_000_000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.001)


@dataclass
class FakeSlurm:
    """One node's Slurm state. The live GRES changes only when slurmctld restarts with the new slurm.conf and the
    node's slurmd starts again, as measured on 22.05."""

    files: dict[str, str]
    state: str = "IDLE"
    flags: tuple[str, ...] = ()
    reason: str | None = None
    gres: str = "gpu:2,mps:200"
    jobs: list[JobOnNode] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)
    slurmd_up: bool = True
    slurmd_started_at: float = 0.0

    def node_status(self, node: str) -> NodeStatus:
        return NodeStatus(node, self.state, self.flags, self.reason, self.gres, self.slurmd_started_at)

    def jobs_on(self, node: str) -> tuple[JobOnNode, ...]:
        return tuple(self.jobs)

    def drain(self, node: str, reason: str) -> None:
        self.calls.append(f"drain {reason}")
        if "drain" in self.refuse:
            raise WorkflowError("scontrol update: refused (test)")
        self.flags = tuple(sorted({*self.flags, "DRAIN"}))
        self.reason = reason

    def resume(self, node: str) -> None:
        self.calls.append("resume")
        if "resume" in self.refuse:
            raise WorkflowError("scontrol resume: refused (test)")
        self.flags = tuple(f for f in self.flags if f != "DRAIN")
        self.reason = None

    def reconfigure(self) -> None:
        self.calls.append("reconfigure")

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags


@dataclass
class FakeDaemons:
    slurm: FakeSlurm
    files: dict[str, str]
    clock: FakeClock
    calls: list[str] = field(default_factory=list)

    def stop_slurmd(self, node: str) -> None:
        self.calls.append(f"stop slurmd {node}")
        self.slurm.slurmd_up = False
        self.slurm.flags = tuple(sorted({*self.slurm.flags, "NOT_RESPONDING"}))

    def restart_slurmctld(self) -> None:
        self.calls.append("restart slurmctld")
        self.slurm.gres = node_gres_value(self.files[SETTINGS.slurm_conf], NODE) or ""

    def start_slurmd(self, node: str) -> None:
        self.calls.append(f"start slurmd {node}")
        self.slurm.slurmd_up = True
        self.slurm.slurmd_started_at = self.clock.now()
        self.slurm.flags = tuple(f for f in self.slurm.flags if f != "NOT_RESPONDING")


@dataclass
class FakeFiles:
    files: dict[str, str]
    writes: list[str] = field(default_factory=list)

    def read(self, path: str) -> str:
        return self.files[path]

    def write(self, path: str, text: str) -> None:
        self.writes.append(path)
        self.files[path] = text


class FakeAgent:
    """The real MigService over in-memory GPUs; ``fail_apply`` makes the next applies raise."""

    def __init__(self, devices: list[FakeMigDevice]) -> None:
        self.devices = devices
        self.service = MigService(NODE, load_catalog(), devices=lambda: self.devices)
        self.fail_apply = 0

    def report(self, node: str) -> NodeMigReport:
        return self.service.report()

    def apply(self, node: str, layout: NodeLayout) -> tuple[tuple[str, ...], NodeMigReport]:
        if self.fail_apply:
            self.fail_apply -= 1
            raise WorkflowError("agent: apply failed (test)")
        answer = self.service.apply(layout)
        return answer.changes, answer.report


@dataclass
class Rig:
    store: SqlStore
    slurm: FakeSlurm
    files: FakeFiles
    daemons: FakeDaemons
    agent: FakeAgent
    clock: FakeClock
    journal: MigStoreJournal
    said: list[str] = field(default_factory=list)

    def workflow(self, fault: Callable[[str], None] = lambda p: None,
                 settings: WorkflowSettings = SETTINGS) -> MigWorkflow:
        ports = WorkflowPorts(self.journal, self.slurm, self.agent, self.files, self.daemons, self.clock,
                              fault=fault, say=self.said.append)
        return MigWorkflow(ports, settings)

    def layout(self) -> dict[int, object]:
        return {g.index: (g.state.layout().as_dict() if g.state.mig_enabled else "off")
                for g in self.agent.report(NODE).gpus}


def make_rig(store: SqlStore) -> Rig:
    gpu = load_catalog().get("A100-40GB")
    files = {SETTINGS.slurm_conf: SLURM_CONF, SETTINGS.gres_conf: GRES_CONF}
    slurm = FakeSlurm(files)
    clock = FakeClock()
    return Rig(store=store, slurm=slurm, files=FakeFiles(files), daemons=FakeDaemons(slurm, files, clock),
               agent=FakeAgent([FakeMigDevice(gpu, 0), FakeMigDevice(gpu, 1)]), clock=clock,
               journal=MigStoreJournal(store.journal))


def crash_at(point: str) -> Callable[[str], None]:
    def hook(p: str) -> None:
        if p == point:
            raise Crash(point)
    return hook


def fail_at(step: str) -> Callable[[str], None]:
    def hook(p: str) -> None:
        if p == f"before:{step}":
            raise WorkflowError(f"injected failure at {step}")
    return hook


def with_state(slurm: FakeSlurm, **kw: Any) -> FakeSlurm:
    return replace(slurm, **kw)
