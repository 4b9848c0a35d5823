"""Controller scenarios on Slurm replies recorded from the live test cluster (not a test module).

A scenario is a short script of controller calls (cycles, a reconcile) with the jobs it needs. Recording
(``scripts/record-slurm-scenarios``, tests/cluster/scenario_recorder.py) submits those jobs to the live 22.05
cluster and runs the real :class:`Controller` over the real :class:`SlurmCli`, with a runner that writes every
Slurm command the controller spawns and its reply (argv, stdin, rc, stdout, stderr, in order) to
``tests/fixtures/slurm/<release>/scenarios/<name>.json``. Unit tests play the same script with
:class:`ReplayRunner` under the same :class:`SlurmCli`: it serves the recorded replies in order and fails the
test on any command the recording does not have at that point (the adapter changed: the recording is stale).

Only GPUs are simulated, as in the cluster tests: utilization comes from an in-process agents stand-in, the
clock is a fake one that both runs advance by the same steps, so the controller decides the same way twice.
The jobs' working directory is /tmp, which is root's: the controller writes no resize notice and reads no job
file there for alice's or bob's jobs, in either run (controller/notices.py, goodput.py refuse it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from slurm_elastic.controller.config import ControllerConfig
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.controller.metrics import ControllerMetrics
from slurm_elastic.controller.ports import AgentCollector
from slurm_elastic.policy import parse_config
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.runner import CommandResult, CommandRunner, RetryPolicy, SlurmCommands
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import ActionKind
from tests.policy_text import UNIT, policy_text
from tests.unit.storehelpers import FakeClock, memory_store

REPO = Path(__file__).resolve().parents[2]
RELEASE = "22.05"
SCENARIO_DIR = REPO / "tests" / "fixtures" / "slurm" / RELEASE / "scenarios"
RERECORD = ("if the adapter's commands changed on purpose, re-record with scripts/record-slurm-scenarios {name} "
            "(the live 22.05 test cluster, under its lock; docs/slurm-adapter.md)")
STEP_S = 2.0  # the fake clock's step per cycle, = the controller's interval_s
# The leader's batch script: directives for the controller, a shell that survives the grace signal (USR1 kills
# bash by default) and sleeps until the scenario cancels it.
SCRIPT = """#!/bin/bash
#ELASTIC --min-nodes 1 --max-nodes 3
trap 'echo "grace $(date +%s)"' USR1 USR2
while :; do sleep 5 & wait $!; done
"""
# An extension of this job fails on its own at once (its own exit status, not a cancel).
FAILING_EXT_SCRIPT = SCRIPT.replace("trap ", '[ "${SLURM_ELASTIC_ROLE:-}" = extension ] && exit 3\ntrap ', 1)
# A het job whose GPU component (offset 1) is elastic; component 0 is the batch host.
HET_SCRIPT = SCRIPT.replace("#ELASTIC --min-nodes 1 --max-nodes 3",
                            "#ELASTIC --het-group 1 --min-nodes 1 --max-nodes 2")
# The unit tests' policy, but moldable start as packaged: a scenario replays with the policy it was recorded with.
POLICY_TEXT = policy_text(UNIT, moldable_start=None)
ADMIT_POLICY_TEXT = policy_text(UNIT, moldable_start=None, cooldown_s=10, grace_s=4, shrink_to_admit=True,
                                admit_backoff_s=120)


class UtilAgents(Protocol):
    """The agents stand-in of the unit tests (tests/unit/test_controller_cycle.py: Agents)."""

    util: dict[tuple[str, int], float]
    silent: set[str]

    def __call__(self, agents: Mapping[str, str]) -> Any: ...


@dataclass(frozen=True)
class JobSpec:
    """A job the recording submits: ``name`` is how the scenario refers to it (its id differs per recording)."""

    name: str
    nodes: int
    user: str = "alice"
    util: float | None = None  # the GPUs' utilization on each of its nodes (None: no agent reports it)
    priority: int | None = None  # set by root after submission (scontrol update Priority=)
    elastic: bool = True  # the #ELASTIC script; else a plain sleep
    pending: bool = False  # submitted when it cannot start; the recording waits for PENDING, not RUNNING
    script: str = SCRIPT  # when elastic
    het: tuple[str, ...] = ()  # sbatch args of a second het component (offset 1): the scenario's unit is that
    # component (its raw id under ``name``, the het leader under ``name + "_leader"``)
    tag_key: str | None = None  # an extension tag in its comment: this key ({leader}: the first job's id)
    own_dir: bool = False  # runs in a fresh directory of its user's (not /tmp), for the files a job publishes


@dataclass
class World:
    """What a scenario's script drives, the same in recording and replay."""

    ctl: Controller
    clock: FakeClock
    agents: UtilAgents
    jobs: dict[str, int]  # scenario name -> Slurm job id
    nodes: dict[str, list[str]]  # scenario name -> the nodes it runs on (at the start)
    wait: Callable[[str, str], None]  # (job name, state): in recording, wait until Slurm shows it; no-op in replay
    check: Callable[[], None] = lambda: None  # after each controller call (replay: stale recording?)
    cancel: Callable[[str], None] = lambda _name: None  # in recording, scancel the job as its user would
    # (what, argument): in recording, a cluster-side event the scenario needs (stop a slurmd, set a node DOWN,
    # wait for a node state or a purge; tests/cluster/scenario_recorder.py: Faults); a no-op in replay
    fault: Callable[[str, str], None] = lambda _what, _arg: None
    reconciled: list[list[str]] = field(default_factory=list)  # what each reconcile() said it did

    def cycles(self, n: int) -> None:
        for _ in range(n):
            self.ctl.run_cycle()
            self.check()
            self.clock.advance(STEP_S)

    def reconcile(self) -> None:
        self.reconciled.append(self.ctl.reconcile())
        self.check()


@dataclass(frozen=True)
class Scenario:
    name: str
    doc: str
    jobs: tuple[JobSpec, ...]
    script: Callable[[World], None]
    policy_text: str = POLICY_TEXT
    dry_run: bool = False
    silent_nodes: tuple[int, ...] = ()  # indexes into the first job's nodes whose agent never answers
    prepare: Callable[[World], None] | None = None  # before the script, in both runs (e.g. journal entries)

    def play(self, world: World) -> None:
        if self.prepare is not None:
            self.prepare(world)
        self.script(world)


def _shrink(w: World) -> None:
    w.cycles(10)  # window filled, shrink decided and signalled on cycle 7, grace (5 s) over, shrunk


def _grow(w: World) -> None:
    w.cycles(8)  # window filled, grow decided: the extension job is submitted
    w.wait("ext", "RUNNING")  # Slurm starts it on the free node
    w.cycles(3)


def _admit(w: World) -> None:
    w.cycles(10)  # grace, then the shrink 3 -> 2 for the pending job
    w.wait("pending", "RUNNING")  # Slurm starts it on the freed node and the free one
    w.cycles(10)


def _watch(w: World) -> None:
    w.cycles(10)


def _grow_fails(w: World) -> None:
    w.cycles(8)  # the grow: an extension job that fails at once
    w.wait("ext", "FAILED")
    w.reconcile()
    w.cycles(15)  # past the cooldown (20 s), inside the grow back-off (60 s)


def _dangling_grows(w: World) -> None:
    """A controller crashed after journaling two grows of the leader; Slurm has an extension for one key."""
    leader = w.jobs["leader"]
    for n in (1, 2):
        w.ctl.store.journal.record_intent(job_id=leader, kind=ActionKind.GROW, idempotency_key=f"grow:{leader}:{n}",
                                          nodes=1)


def _reconcile(w: World) -> None:
    w.reconcile()  # key 1 is found in Slurm: applied; key 2 is not: aborted
    w.cycles(1)  # the controller sees the leader (an elastic job of alice's)
    w.cancel("leader")
    w.wait("leader", "CANCELLED")
    w.reconcile()  # the leader ended: its extension is an orphan and is cancelled, not bob's copy of the tag


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("shrink_with_grace", "an idle 3-node job: the grace signal, then a shrink to 2 after grace_s",
             (JobSpec("idle", 3, util=5.0),), _shrink),
    Scenario("grow_by_extension", "a busy 1-node job grows by an extension job on a free node, which starts",
             (JobSpec("busy", 1, util=95.0),), _grow),
    Scenario("admit_by_shrink", "a 3-node job in band; a higher-priority 2-node job pends on Resources: the "
             "3-node job shrinks to 2 and Slurm starts the pending job",
             (JobSpec("running", 3, util=60.0, priority=100),
              JobSpec("pending", 2, user="bob", elastic=False, priority=100000, pending=True)),
             _admit, policy_text=ADMIT_POLICY_TEXT),
    Scenario("dry_run_idle", "an idle 2-node job under --dry-run: shrinks decided, no Slurm write",
             (JobSpec("idle", 2, util=5.0),), _watch, dry_run=True),
    Scenario("grow_extension_fails", "a busy 1-node job grows; its extension job fails on its own at once: the "
             "controller backs off further grows", (JobSpec("busy", 1, util=95.0, script=FAILING_EXT_SCRIPT),),
             _grow_fails),
    Scenario("het_component_shrink", "an idle het job's GPU component (2 nodes) shrinks to 1 after the grace "
             "signal, by its raw job id; component 0 untouched",
             (JobSpec("het", 1, util=5.0, script=HET_SCRIPT, het=("-N2", "--gres=gpu:2", "--time=30")),),
             _shrink),
    Scenario("reconcile_dangling_grows", "a crashed controller's two grow intents, one with an extension job in "
             "Slurm; bob's job carries a copy of the tag; the leader is then cancelled",
             (JobSpec("leader", 1), JobSpec("ext", 1, elastic=False, tag_key="grow:{leader}:1"),
              JobSpec("forged", 1, user="bob", elastic=False, tag_key="grow:{leader}:1")),
             _reconcile, prepare=_dangling_grows),
    Scenario("silent_agent", "an idle 2-node job whose second node's agent never answers: no samples, no action",
             (JobSpec("idle", 2, util=5.0),), _watch, silent_nodes=(1,)),
)}


# --- the recording file ---------------------------------------------------------------------------------------
def write_recording(path: Path, header: Mapping[str, Any], commands: Sequence[Mapping[str, Any]]) -> None:
    """Write a recording atomically: ``header`` plus the commands as steps, each distinct reply (rc, stdout,
    stderr) stored once (a scenario reads the same reply many times)."""
    replies: list[list[Any]] = []
    index: dict[tuple[int, str, str], int] = {}
    steps = []
    for c in commands:
        key = (c["rc"], c["stdout"], c["stderr"])
        if key not in index:
            index[key] = len(replies)
            replies.append(list(key))
        steps.append({"argv": c["argv"], "stdin": c["stdin"], "reply": index[key]})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**header, "steps": steps, "replies": replies}, indent=1) + "\n")
    os.replace(tmp, path)


def read_recording(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A recording's document and its commands in order (argv, stdin, rc, stdout, stderr)."""
    doc = json.loads(path.read_text())
    replies = doc["replies"]
    commands = [{"argv": s["argv"], "stdin": s["stdin"], "rc": replies[s["reply"]][0],
                 "stdout": replies[s["reply"]][1], "stderr": replies[s["reply"]][2]} for s in doc["steps"]]
    return doc, commands


@dataclass
class Recording:
    """One scenario as recorded: the jobs' ids and nodes, the clock's start, the commands in order."""

    name: str
    release: str
    recorded_at: str
    clock_start: datetime
    extension_env: dict[str, str]
    jobs: dict[str, int]
    nodes: dict[str, list[str]]
    commands: list[dict[str, Any]] = field(default_factory=list)  # argv, stdin, rc, stdout, stderr

    def save(self, path: Path) -> None:
        """Replies are stored once each (a scenario reads the same squeue reply many times)."""
        write_recording(path, {"scenario": self.name, "release": self.release, "recorded_at": self.recorded_at,
                               "clock_start": self.clock_start.isoformat(), "extension_env": self.extension_env,
                               "jobs": self.jobs, "nodes": self.nodes}, self.commands)

    @classmethod
    def load(cls, path: Path) -> Recording:
        doc, commands = read_recording(path)
        return cls(name=doc["scenario"], release=doc["release"], recorded_at=doc["recorded_at"],
                   clock_start=datetime.fromisoformat(doc["clock_start"]), extension_env=doc["extension_env"],
                   jobs=doc["jobs"], nodes=doc["nodes"], commands=commands)


def command_key(argv: Sequence[str]) -> list[str]:
    """What must match between a recorded and a replayed command: the argv, the program by its name only
    (``runuser`` is resolved to an absolute path)."""
    return [os.path.basename(argv[0]), *argv[1:]] if argv else []


class StaleRecordingError(AssertionError):
    pass


class RecordedCommands(Protocol):
    """What a replay runner reads of a recording: its name and its commands in order."""

    name: str
    commands: list[dict[str, Any]]


RecordingT = TypeVar("RecordingT", bound=RecordedCommands)


class CommandReplay(Generic[RecordingT]):
    """A :class:`CommandRunner` that serves a recording's replies in order; any other command fails the test.
    Subclasses name who runs the commands and how to re-record: :class:`ReplayRunner` (the controller's) and
    mig_replay.py's MigReplayRunner (the MIG workflow's)."""

    actor = "the controller"  # who runs the commands, for the stale message
    label = "recording"
    rerecord = RERECORD

    def __init__(self, rec: RecordingT) -> None:
        self.rec = rec
        self.pos = 0
        self.error: StaleRecordingError | None = None
        self.calls: list[list[str]] = []  # the commands served, as :func:`command_key` gives them

    def __call__(self, argv: Sequence[str], *, timeout: float, input_text: str | None,
                 env: Mapping[str, str] | None) -> CommandResult:
        got = command_key(argv)
        if self.error is None:
            if self.pos >= len(self.rec.commands):
                self._stale(f"{self.actor} ran {got} after the recording's last command")
            else:
                want = self.rec.commands[self.pos]
                if command_key(want["argv"]) != got:
                    self._stale(f"command {self.pos + 1}: {self.actor} ran {got} where the recording has "
                                f"{command_key(want['argv'])}")
                elif want["stdin"] != input_text:
                    self._stale(f"command {self.pos + 1} {got}: its stdin differs from the recording's")
        if self.error is not None:
            raise self.error  # the caller may catch errors (the workflow journals them): check() raises it again
        want = self.rec.commands[self.pos]
        self.pos += 1
        self.calls.append(got)
        return CommandResult(tuple(argv), int(want["rc"]), want["stdout"], want["stderr"])

    def stale_error(self, message: str) -> StaleRecordingError:
        return StaleRecordingError(message)

    def _stale(self, what: str) -> None:
        self.error = self.stale_error(f"{self.label} {self.rec.name} is stale: {what}; "
                                      + self.rerecord.format(name=self.rec.name))

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def finish(self) -> None:
        """Every recorded command was asked for (else the caller now does less than it did)."""
        self.check()
        if self.pos != len(self.rec.commands):
            left = command_key(self.rec.commands[self.pos]["argv"])
            self._stale(f"{self.actor} stopped after {self.pos} of {len(self.rec.commands)} commands; "
                        f"the next recorded one is {left}")
            self.check()

    def ran(self, program: str, *args: str) -> list[list[str]]:
        """The served commands of ``program`` whose argv starts with ``args`` after the program name."""
        return [c for c in self.calls if c[0] == program and c[1:1 + len(args)] == list(args)]


class ReplayRunner(CommandReplay[Recording]):
    """The controller's scenarios' :class:`CommandReplay`."""


def build_world(scenario: Scenario, commands: SlurmCommands, clock: FakeClock, agents: UtilAgents,
                jobs: dict[str, int], nodes: dict[str, list[str]], extension_env: Mapping[str, str],
                wait: Callable[[str, str], None]) -> tuple[World, SqlStore]:
    """The controller as both runs build it: a memory store on the fake clock, the scenario's policy."""
    store = memory_store(clock)
    # A snapshot is stamped with the host's time, the cycle with the fake one: never call it stale here.
    cfg = ControllerConfig(interval_s=STEP_S, holder="test", dry_run=scenario.dry_run, max_snapshot_age_s=86400,
                           extension_env=dict(extension_env))
    collector: AgentCollector = agents
    ctl = Controller(cfg, parse_config(scenario.policy_text), slurm=SlurmCli(commands), store=store,
                     collector=collector, clock=clock, metrics=ControllerMetrics())
    for spec in scenario.jobs:
        if spec.util is not None:
            for node in nodes[spec.name]:
                agents.util[(node, jobs[spec.name])] = spec.util
    first = scenario.jobs[0].name
    agents.silent.update(nodes[first][i] for i in scenario.silent_nodes)
    return World(ctl=ctl, clock=clock, agents=agents, jobs=jobs, nodes=nodes, wait=wait), store


@dataclass
class Replayed:
    world: World
    store: SqlStore
    runner: ReplayRunner
    rec: Recording


def load_recording(name: str) -> Recording:
    """Scenario ``name``'s recording; a missing one fails as stale, with how to record it."""
    path = SCENARIO_DIR / f"{name}.json"
    if not path.exists():
        raise StaleRecordingError(f"no recording {path}; " + RERECORD.format(name=name))
    return Recording.load(path)


def play(name: str, rec: Recording, runner: ReplayRunner,
         agents_factory: Callable[[FakeClock], UtilAgents]) -> Replayed:
    """Play scenario ``name`` on ``rec`` served by ``runner``; fails if the controller's commands differ from it."""
    scenario = SCENARIOS[name]
    runner_: CommandRunner = runner
    commands = SlurmCommands(env={}, runner=runner_, retry=RetryPolicy(), sleep=lambda _s: None)
    clock = FakeClock(rec.clock_start)
    world, store = build_world(scenario, commands, clock, agents_factory(clock), rec.jobs, rec.nodes,
                               rec.extension_env, wait=lambda _job, _state: None)
    world.check = runner.check
    scenario.play(world)
    runner.finish()
    return Replayed(world, store, runner, rec)


def replay(name: str, agents_factory: Callable[[FakeClock], UtilAgents],
           runner_type: Callable[[Recording], ReplayRunner] = ReplayRunner) -> Replayed:
    """Play scenario ``name`` on its recording; fails if the controller's commands differ from it. ``runner_type``:
    a :class:`ReplayRunner` that answers some checked command otherwise (a reply recorded elsewhere)."""
    rec = load_recording(name)
    return play(name, rec, runner_type(rec), agents_factory)


def recorded_cli(name: str) -> tuple[SlurmCli, ReplayRunner]:
    """The real :class:`SlurmCli` serving scenario ``name``'s recorded replies in order, for a test that needs some
    real Slurm (a snapshot, a cycle) but not a scenario's script; ``runner.check()`` says if it went off the record."""
    path = SCENARIO_DIR / f"{name}.json"
    if not path.exists():
        raise StaleRecordingError(f"no recording {path}; " + RERECORD.format(name=name))
    runner = ReplayRunner(Recording.load(path))
    runner_: CommandRunner = runner
    return SlurmCli(SlurmCommands(env={}, runner=runner_, retry=RetryPolicy(), sleep=lambda _s: None)), runner
