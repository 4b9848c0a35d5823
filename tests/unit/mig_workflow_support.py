"""Port fakes for the MIG workflow's recovery tests (not a test module): n4's four A100-40GB GPUs behind the real
MigService over FakeMigDevice, config files in a dict, a clock that moves only when slept, and the real store's
journal.

Slurm is not imitated here. :class:`RecordedSlurm` answers ``node_status`` with a NodeStatus that the real
CliSlurm parsed from a reply of the live 22.05 cluster (the ``apply_idle`` recording, tests/unit/mig_replay.py),
and a restart of slurmctld makes it serve the reply the live cluster gave after a restart with the same
``Gres=`` for n4 in slurm.conf (a Gres= never recorded stops the test). ``drain``, ``resume`` and
``reconfigure`` are only written down. What Slurm does with the workflow's commands is tested on the replays
(tests/unit/test_mig_workflow_replay.py); the tests on these fakes test the journal's recovery logic.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_elastic.agent.mig_service import MigService
from slurm_elastic.mig.adapters import CliSlurm, MigStoreJournal
from slurm_elastic.mig.catalog import Catalog, load_catalog
from slurm_elastic.mig.errors import WorkflowError
from slurm_elastic.mig.fake import FakeMigDevice
from slurm_elastic.mig.model import NodeLayout
from slurm_elastic.mig.ports import JobOnNode, NodeStatus, WorkflowPorts, WorkflowSettings
from slurm_elastic.mig.slurmconf import gres_summary, node_gres_value
from slurm_elastic.mig.wire import NodeMigReport
from slurm_elastic.mig.workflow import MigWorkflow
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.runner import CommandResult, SlurmCommands
from slurm_elastic.store import SqlStore

NODE = "n4"
# Config texts for the pure plan/suggest tests (test_mig_plan_suggest.py): a 2-GPU node.
SLURM_CONF = """ClusterName=elastic
GresTypes=gpu,mps
NodeName=n[1-4] NodeHostname=vm NodeAddr=127.0.0.1 Port=[17001-17004] CPUs=8 Gres=gpu:2,mps:200 State=UNKNOWN
PartitionName=train Nodes=n[1-4] Default=YES
"""
GRES_CONF = "".join(
    f"NodeName={n} Name=gpu File=/dev/{n}/gpu[0-1]\nNodeName={n} Name=mps Count=200 File=/dev/{n}/gpu[0-1]\n"
    for n in ("n1", "n2", "n3", "n4")
)
RECORDING = "apply_idle"  # whose replies RecordedSlurm serves


@functools.cache
def _catalog() -> Catalog:
    return load_catalog()  # parsed once: the YAML costs ~0.4 s, and every test builds a rig


class Crash(BaseException):
    """The process dies here (BaseException: nothing in the workflow catches it)."""


class NotRecorded(BaseException):
    """The test asked Slurm for an answer no recording has (BaseException: the workflow must not journal it)."""


@dataclass
class FakeClock:
    t: float = 1_000_000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.001)


def _gres_key(gres: str) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(gres_summary(gres).items()))


def recorded_statuses(commands: Sequence[Mapping[str, Any]]) -> list[NodeStatus]:
    """n4's NodeStatus in each recorded ``sinfo --json`` reply, as the real CliSlurm parses it (22.05 first
    answers the ``scontrol show nodes --json`` probe with an error, which is served too)."""
    probe = next(c for c in commands if c["argv"][:4] == ["scontrol", "show", "nodes", "--json"])
    out = []
    for c in commands:
        if c["argv"][:1] != ["sinfo"]:
            continue

        def serve(argv: Sequence[str], *, timeout: float, input_text: str | None, env: Mapping[str, str] | None,
                  reply: Mapping[str, Any] = c) -> CommandResult:
            r = reply if list(argv[:1]) == ["sinfo"] else probe
            return CommandResult(tuple(argv), int(r["rc"]), r["stdout"], r["stderr"])

        out.append(CliSlurm(SlurmCli(SlurmCommands(env={}, runner=serve))).node_status(NODE))
    return out


@dataclass
class RecordedSlurm:
    """Serves recorded NodeStatus values; writes down the workflow's commands (``refuse``: those that fail)."""

    served: NodeStatus  # what node_status answers now: n4 before the workflow, as recorded
    after_restart: Mapping[tuple[tuple[str, int], ...], NodeStatus]  # by n4's Gres= in slurm.conf
    calls: list[str] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)

    def node_status(self, node: str) -> NodeStatus:
        return self.served

    def jobs_on(self, node: str) -> tuple[JobOnNode, ...]:
        return ()  # n4 ran no job in the recording (waiting for jobs is replayed: apply_waits_for_job)

    def drain(self, node: str, reason: str) -> None:
        self.calls.append(f"drain {reason}")
        if "drain" in self.refuse:
            raise WorkflowError("scontrol update: refused (test)")

    def resume(self, node: str) -> None:
        self.calls.append("resume")
        if "resume" in self.refuse:
            raise WorkflowError("scontrol resume: refused (test)")

    def reconfigure(self) -> None:
        self.calls.append("reconfigure")

    def restarted(self, conf_gres: str) -> None:
        """slurmctld restarted with ``conf_gres`` for n4: serve what the live cluster then answered."""
        status = self.after_restart.get(_gres_key(conf_gres))
        if status is None:
            raise NotRecorded(f"no recorded Slurm reply after a restart with Gres={conf_gres} for {NODE}; "
                              f"recorded: {sorted(self.after_restart)}")
        self.served = status

    def _last_state_call(self) -> str | None:
        return next((c for c in reversed(self.calls) if c == "resume" or c.startswith("drain ")), None)

    @property
    def drained(self) -> bool:
        """The workflow's last word to Slurm on the node was a drain (a refused one included)."""
        last = self._last_state_call()
        return last is not None and last.startswith("drain ")

    @property
    def reason(self) -> str | None:
        last = self._last_state_call()
        return last.removeprefix("drain ") if last is not None and last.startswith("drain ") else None


@dataclass
class SpyDaemons:
    """Writes down the daemon commands; the slurmctld restart makes Slurm serve its recorded answer."""

    slurm: RecordedSlurm
    files: dict[str, str]
    settings: WorkflowSettings
    calls: list[str] = field(default_factory=list)

    def stop_slurmd(self, node: str) -> None:
        self.calls.append(f"stop slurmd {node}")

    def restart_slurmctld(self) -> None:
        self.calls.append("restart slurmctld")
        self.slurm.restarted(node_gres_value(self.files[self.settings.slurm_conf], NODE) or "")

    def start_slurmd(self, node: str) -> None:
        self.calls.append(f"start slurmd {node}")


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
        self.service = MigService(NODE, _catalog(), devices=lambda: self.devices)
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
    slurm: RecordedSlurm
    files: FakeFiles
    daemons: SpyDaemons
    agent: FakeAgent
    clock: FakeClock
    journal: MigStoreJournal
    settings: WorkflowSettings
    original_files: dict[str, str]
    after_apply: NodeStatus  # n4 as the recording looked at it after the workflow (resumed)
    said: list[str] = field(default_factory=list)

    def workflow(self, fault: Callable[[str], None] = lambda p: None) -> MigWorkflow:
        ports = WorkflowPorts(self.journal, self.slurm, self.agent, self.files, self.daemons, self.clock,
                              fault=fault, say=self.said.append)
        return MigWorkflow(ports, self.settings)

    def layout(self) -> dict[int, object]:
        return {g.index: (g.state.layout().as_dict() if g.state.mig_enabled else "off")
                for g in self.agent.report(NODE).gpus}


def fake_agent(gpus: int) -> FakeAgent:
    """n4's agent over ``gpus`` in-memory A100-40GB GPUs with MIG off."""
    gpu = _catalog().get("A100-40GB")
    return FakeAgent([FakeMigDevice(gpu, i) for i in range(gpus)])


@functools.cache
def _recorded() -> tuple[tuple[NodeStatus, ...], Mapping[str, Any], Mapping[str, str]]:
    """The recording's n4 statuses, settings and files, read once per process."""
    from tests.unit.mig_replay import MIG_SCENARIO_DIR, MigRecording  # it imports this module

    rec = MigRecording.load(MIG_SCENARIO_DIR / f"{RECORDING}.json")
    return tuple(recorded_statuses(rec.commands)), rec.settings, rec.files


def make_rig(store: SqlStore) -> Rig:
    """n4 as the ``apply_idle`` recording found it: its slurm.conf and gres.conf, Slurm's replies, the settings
    (shorter waits: the clock is a fake one)."""
    statuses, rec_settings, rec_files = _recorded()
    # per Gres, the last reply of a registered n4: for the new Gres, the one verify accepted
    after = {_gres_key(s.gres): s for s in statuses if s.registered}
    settings = WorkflowSettings.from_obj({**rec_settings, "wait_timeout_s": 60, "verify_timeout_s": 30,
                                          "poll_interval_s": 5})
    files = dict(rec_files)
    slurm = RecordedSlurm(statuses[0], after)
    clock = FakeClock()
    return Rig(store=store, slurm=slurm, files=FakeFiles(files), daemons=SpyDaemons(slurm, files, settings),
               agent=fake_agent(4), clock=clock, journal=MigStoreJournal(store.journal), settings=settings,
               original_files=dict(files), after_apply=statuses[-1])


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
