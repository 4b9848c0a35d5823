"""MIG workflow scenarios on Slurm replies recorded from the live test cluster (not a test module).

Recording (``scripts/record-mig-scenarios``, tests/cluster/mig_scenario_recorder.py) runs the real
:class:`MigWorkflow` on node n4 of the live 22.05 cluster through the production Slurm side: :class:`CliSlurm`
over the real :class:`SlurmCli`, and :class:`CommandDaemons` with the test cluster's daemon commands
(docker-slurm/slurm-daemon.sh), both over one runner that writes down every command and its reply in order;
the real slurm.conf and gres.conf are rewritten (and restored afterwards). The clock is the system's, and each
``now()`` and ``sleep()`` is written down too, so that the replay polls, times out and compares slurmd start
times exactly as the recorded run did. Only the GPUs are simulated: the agent is the real MigService over
in-memory GPUs, in both runs.

Replay plays the same script with :class:`MigReplayRunner` under the same adapters: it serves the recorded
replies in order and fails the test on any command the recording does not have at that point (the workflow or
an adapter changed: re-record). The config files are the recorded texts in a dict.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_elastic.mig.adapters import CliSlurm, CommandDaemons, MigStoreJournal
from slurm_elastic.mig.config import Commands
from slurm_elastic.mig.model import Layout, NodeLayout
from slurm_elastic.mig.ports import ClockPort, FilesPort, NodeStatus, WorkflowPorts, WorkflowResult, WorkflowSettings
from slurm_elastic.mig.steps import MigStepOutcome
from slurm_elastic.mig.workflow import MigWorkflow
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.runner import CommandRunner, RetryPolicy, SlurmCommands
from slurm_elastic.store import SqlStore
from tests.unit.mig_workflow_support import Crash, FakeAgent, FakeFiles, crash_at, fake_agent
from tests.unit.slurm_replay import CommandReplay, StaleRecordingError, read_recording, write_recording
from tests.unit.storehelpers import FakeClock as StoreClock
from tests.unit.storehelpers import memory_store

REPO = Path(__file__).resolve().parents[2]
RELEASE = "22.05"
MIG_SCENARIO_DIR = REPO / "tests" / "fixtures" / "slurm" / RELEASE / "mig-scenarios"
RERECORD = ("if the workflow's or an adapter's commands changed on purpose, re-record with "
            "scripts/record-mig-scenarios {name} (the live 22.05 test cluster, under its lock; docs/mig.md)")
NODE = "n4"
GPUS = 4  # n4 of the test cluster: gpu:4,mps:400
APPLIED, ABORTED = MigStepOutcome.APPLIED, MigStepOutcome.ABORTED
TARGET = NodeLayout.of({0: Layout.of({"3g.20gb": 2}), 1: Layout.of({"1g.5gb": 7})})


class StaleMigRecordingError(StaleRecordingError):
    pass


@dataclass
class MigWorld:
    """What a scenario's script drives, the same in recording and replay."""

    journal: MigStoreJournal
    slurm: CliSlurm
    agent: FakeAgent
    files: FilesPort
    daemons: CommandDaemons
    clock: ClockPort
    check: Callable[[], None] = lambda: None  # after each workflow call (replay: stale recording?)
    results: list[WorkflowResult] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    looked: list[NodeStatus] = field(default_factory=list)
    said: list[str] = field(default_factory=list)

    def workflow(self, settings: WorkflowSettings, fault: Callable[[str], None] = lambda p: None) -> MigWorkflow:
        ports = WorkflowPorts(self.journal, self.slurm, self.agent, self.files, self.daemons, self.clock,
                              fault=fault, say=self.said.append)
        return MigWorkflow(ports, settings)

    def apply(self, settings: WorkflowSettings, crash: str | None = None) -> None:
        """``mig apply n4 TARGET``; ``crash``: the process dies at that point (the workflow stays open)."""
        try:
            self.results.append(self.workflow(settings, crash_at(crash) if crash else lambda p: None)
                                .start(NODE, TARGET))
        except Crash as c:
            self.crashes.append(str(c))
        self.check()

    def look(self) -> None:
        """How Slurm shows n4 now (after the workflow)."""
        self.looked.append(self.slurm.node_status(NODE))
        self.check()

    def resume(self, settings: WorkflowSettings, *, rollback: bool = False) -> None:
        """``mig resume-workflows [--rollback]`` in a new process (a new workflow object, the same journal)."""
        self.results.extend(self.workflow(settings).resume_open(rollback=rollback))
        self.check()


@dataclass(frozen=True)
class MigScenario:
    name: str
    doc: str
    script: Callable[[MigWorld, WorkflowSettings], None]
    outcome: MigStepOutcome  # of the last workflow run: a recording that ends otherwise is not saved
    job: str | None = None  # a job on n4 when the workflow starts: "short" (ends by itself) or "long"
    drained: str | None = None  # n4 drained with this reason before the workflow starts
    settings: Mapping[str, Any] = field(default_factory=dict)  # overrides of the recorder's settings


def _apply(w: MigWorld, s: WorkflowSettings) -> None:
    w.apply(s)


def _apply_then_look(w: MigWorld, s: WorkflowSettings) -> None:
    w.apply(s)
    w.look()


def _crash_then_resume(w: MigWorld, s: WorkflowSettings) -> None:
    w.apply(s, crash="after:apply_layout")
    w.resume(s)


def _crash_then_rollback(w: MigWorld, s: WorkflowSettings) -> None:
    w.apply(s, crash="after:write_gres")
    w.resume(s, rollback=True)
    w.look()


MIG_SCENARIOS: dict[str, MigScenario] = {s.name: s for s in (
    MigScenario("apply_idle", "an apply on idle n4: drain, apply, GRES files, restart, verify, resume; then "
                "how Slurm shows n4", _apply_then_look,
                APPLIED),
    MigScenario("apply_waits_for_job", "a 6 s job runs on n4: the workflow drains, polls until it ends, applies",
                _apply, APPLIED, job="short"),
    MigScenario("jobs_outlast_the_wait", "a long job on n4 outlasts a 3 s wait timeout: aborted, n4 resumed, "
                "nothing changed", _apply, ABORTED, job="long", settings={"wait_timeout_s": 3.0}),
    MigScenario("drained_node_stays_drained", "n4 was drained by an operator: applied, and left drained with "
                "the operator's reason", _apply, APPLIED, drained="bad fan"),
    MigScenario("verify_fails_after_reconfigure", "apply_mode reconfigure, which 22.05 does not honour for a "
                "changed Gres= (docs/mig.md section 8): verify times out (5 s), everything is undone, n4 held "
                "drained naming verify; then how Slurm shows n4", _apply_then_look, MigStepOutcome.FAILED,
                settings={"apply_mode": "reconfigure", "verify_timeout_s": 5.0}),
    MigScenario("crash_then_resume", "the process dies after the GPUs changed, before the GRES files; "
                "resume-workflows finishes the workflow", _crash_then_resume, APPLIED),
    MigScenario("crash_then_rollback", "the process dies after the GRES files were written; resume-workflows "
                "--rollback undoes it all and resumes n4; then how Slurm shows n4", _crash_then_rollback, ABORTED),
)}


# --- the recording file ---------------------------------------------------------------------------------------
@dataclass
class MigRecording:
    name: str
    release: str
    recorded_at: str
    settings: dict[str, Any]
    daemon_commands: dict[str, list[str]]
    files: dict[str, str]  # slurm.conf and gres.conf as they were before the scenario
    jobs: dict[str, int]
    clock: list[list[Any]]  # ["now", t] / ["sleep", seconds], in order
    commands: list[dict[str, Any]] = field(default_factory=list)  # argv, stdin, rc, stdout, stderr

    def save(self, path: Path) -> None:
        """Replies are stored once each (the workflow reads the same sinfo reply many times)."""
        write_recording(path, {"scenario": self.name, "release": self.release, "recorded_at": self.recorded_at,
                               "settings": self.settings, "daemon_commands": self.daemon_commands,
                               "files": self.files, "jobs": self.jobs, "clock": self.clock}, self.commands)

    @classmethod
    def load(cls, path: Path) -> MigRecording:
        doc, commands = read_recording(path)
        return cls(name=doc["scenario"], release=doc["release"], recorded_at=doc["recorded_at"],
                   settings=doc["settings"], daemon_commands=doc["daemon_commands"], files=doc["files"],
                   jobs=doc["jobs"], clock=doc["clock"], commands=commands)


class MigReplayRunner(CommandReplay["MigRecording"]):
    """A :class:`CommandRunner` (for Slurm's commands and the daemon commands alike) that serves a recording's
    replies in order; any other command fails the test."""

    actor = "the workflow"
    label = "MIG recording"
    rerecord = RERECORD

    def stale_error(self, message: str) -> StaleMigRecordingError:
        return StaleMigRecordingError(message)


class MigReplayClock:
    """The recorded clock: each ``now()`` returns the recorded time, each ``sleep()`` must be the recorded one."""

    def __init__(self, rec: MigRecording, runner: MigReplayRunner) -> None:
        self.rec = rec
        self.runner = runner
        self.pos = 0

    def _next(self, kind: str, value: float | None = None) -> float:
        if self.runner.error is None:
            if self.pos >= len(self.rec.clock):
                self.runner._stale(f"the workflow read the clock ({kind}) more often than the recorded run")
            elif self.rec.clock[self.pos][0] != kind or (
                    value is not None and abs(float(self.rec.clock[self.pos][1]) - value) > 1e-6):
                self.runner._stale(f"clock call {self.pos + 1}: {kind} {value if value is not None else ''} where "
                                   f"the recording has {self.rec.clock[self.pos]}")
        if self.runner.error is not None:
            return float("inf")  # ends every wait at once; the test fails on the stale recording
        self.pos += 1
        return float(self.rec.clock[self.pos - 1][1])

    def now(self) -> float:
        return self._next("now")

    def sleep(self, seconds: float) -> None:
        self._next("sleep", seconds)

    def finish(self) -> None:
        if self.pos != len(self.rec.clock):
            self.runner._stale(f"the workflow read the clock {self.pos} times, the recorded run "
                               f"{len(self.rec.clock)} times")
        self.runner.check()


def daemon_commands(cmds: Mapping[str, Sequence[str]]) -> Commands:
    return Commands(slurmd_stop=tuple(cmds["slurmd_stop"]), slurmd_start=tuple(cmds["slurmd_start"]),
                    slurmctld_restart=tuple(cmds["slurmctld_restart"]))


def build_world(runner: CommandRunner, env: Mapping[str, str], cmds: Mapping[str, Sequence[str]],  # noqa: PLR0917
                clock: ClockPort, files: FilesPort, store: SqlStore,
                sleep: Callable[[float], None] = time.sleep) -> MigWorld:
    """The workflow's production Slurm side over ``runner``, as both runs build it."""
    commands = SlurmCommands(env=env, runner=runner, retry=RetryPolicy(), sleep=sleep)
    return MigWorld(journal=MigStoreJournal(store.journal), slurm=CliSlurm(SlurmCli(commands)),
                    agent=fake_agent(GPUS), files=files,
                    daemons=CommandDaemons(daemon_commands(cmds), env=env, runner=runner), clock=clock)


@dataclass
class MigReplayed:
    world: MigWorld
    store: SqlStore
    runner: MigReplayRunner
    rec: MigRecording
    files: FakeFiles
    settings: WorkflowSettings


def replay(name: str) -> MigReplayed:
    """Play MIG scenario ``name`` on its recording; fails if the workflow's commands differ from it."""
    scenario = MIG_SCENARIOS[name]
    path = MIG_SCENARIO_DIR / f"{name}.json"
    if not path.exists():
        raise StaleMigRecordingError(f"no recording {path}; " + RERECORD.format(name=name))
    rec = MigRecording.load(path)
    runner = MigReplayRunner(rec)
    clock = MigReplayClock(rec, runner)
    files = FakeFiles(dict(rec.files))
    store = memory_store(StoreClock())
    world = build_world(runner, {}, rec.daemon_commands, clock, files, store, sleep=lambda _s: None)
    world.check = runner.check
    settings = WorkflowSettings.from_obj(rec.settings)
    scenario.script(world, settings)
    runner.finish()
    clock.finish()
    return MigReplayed(world, store, runner, rec, files, settings)
