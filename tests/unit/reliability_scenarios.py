"""Recorded controller scenarios under faults (docs/reliability.md F4, F5, bugs 5 and 7), on a metrics source that
goes away (tests/unit/test_prometheus_source.py) and a shrink-to-admit whose job Slurm does not start
(tests/unit/test_controller_cycle.py); not a test module.

Registered in slurm_replay.SCENARIOS on import, so ``scripts/record-slurm-scenarios NAME`` records them and
:func:`slurm_replay.replay` plays them. Slurm refusing an action cannot be had on demand from a healthy cluster, so
a scenario can make one of the controller's commands meet a refusal: :class:`Refusing` stands between the adapter
and the runner in both runs and sends, in that command's place, a request the live cluster refuses the same way
(an extension asking for 99 GPUs per node, an update of a job id that does not exist, an sbatch to a controller
port nobody listens on). The recording holds that request and Slurm's real reply; the adapter classifies the reply
as it would the controller's own command's.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from slurm_elastic.controller.cycle import Controller
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.runner import CommandResult, CommandRunner, SlurmCommands
from slurm_elastic.store.records import ActionKind, ActionRecord, FencingToken
from tests.unit.slurm_replay import ADMIT_POLICY_TEXT, SCENARIOS, JobSpec, Scenario, World
from tests.unit.storehelpers import file_store
from tests.unit.test_store_failures import can_mount_tmpfs

GPU_NODES = ("n1", "n2", "n3", "n4")  # the test cluster's GPU nodes (n5, n6 are cold, powered down)
UNKNOWN_JOB = 987654321  # no job of the test cluster has this id


@dataclass(frozen=True)
class Refusal:
    """The controller's grow (the sbatch of ``job``'s extension) or shrink (``scontrol update JobId=<job>
    NodeList=``) meets ``instead``, run in its place ({job}: the job's id); ``times`` such commands (0: all)."""

    job: str
    kind: str  # "grow" | "shrink"
    instead: tuple[str, ...]
    times: int = 0
    unreachable: bool = False  # run ``instead`` against a slurm.conf whose controller port nobody listens on

    def matches(self, argv: Sequence[str], job_id: int) -> bool:
        if self.kind == "grow":
            return "sbatch" in argv and f"--job-name=elastic-ext-{job_id}" in argv
        return list(argv[:2]) == ["scontrol", "update"] and f"JobId={job_id}" in argv and any(
            a.startswith("NodeList=") for a in argv)


class Refusing:
    """A :class:`CommandRunner` in front of the recording or replaying one, applying a scenario's refusals."""

    def __init__(self, inner: CommandRunner, refusals: Sequence[Refusal], jobs: Mapping[str, int]) -> None:
        self.inner = inner
        self.refusals = refusals
        self.jobs = jobs
        self.used = [0] * len(refusals)
        self.refused: list[list[str]] = []  # the controller's commands that were refused, in order

    def __call__(self, argv: Sequence[str], *, timeout: float, input_text: str | None,
                 env: Mapping[str, str] | None) -> CommandResult:
        for i, r in enumerate(self.refusals):
            if (r.times == 0 or self.used[i] < r.times) and r.matches(argv, self.jobs[r.job]):
                self.used[i] += 1
                self.refused.append(list(argv))
                instead = [a.format(job=self.jobs[r.job]) for a in r.instead]
                if r.unreachable:
                    env = _unreachable_env(env)
                result = self.inner(instead, timeout=timeout, input_text=input_text, env=env)
                if result.returncode == 0:  # the cluster took it: a job may now exist that nobody cancels
                    raise AssertionError(f"Slurm accepted {instead}, meant to be refused: {result.stdout!r}")
                return result
        return self.inner(argv, timeout=timeout, input_text=input_text, env=env)


def _unreachable_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """``env`` with SLURM_CONF pointing at a copy of the cluster's config whose controller port is closed (only
    when recording: a replay has no such file and ignores the environment)."""
    out = dict(env or os.environ)
    conf = Path(out.get("SLURM_CONF", ""))
    if conf.is_file():
        tmp = Path(tempfile.mkdtemp(prefix="slurm-unreachable-"))
        text = re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=9", conf.read_text())
        text = re.sub(r"(?m)^MessageTimeout=.*$", "MessageTimeout=2", text)
        for other in conf.parent.glob("*.conf"):
            if other != conf:
                (tmp / other.name).write_text(other.read_text())
        (tmp / "slurm.conf").write_text(text)
        out["SLURM_CONF"] = str(tmp / "slurm.conf")
    return out


def refusing(*refusals: Refusal) -> Callable[[World], None]:
    """A scenario's ``prepare``: put :class:`Refusing` in front of the controller's runner (in both runs)."""

    def prepare(w: World) -> None:
        cmd = cast(SlurmCli, w.ctl.slurm).cmd
        cmd._runner = Refusing(cmd._runner, refusals, w.jobs)  # noqa: SLF001 - the one seam below the adapter

    return prepare


def refused(w: World) -> list[list[str]]:
    """The controller's commands that met a refusal in this run."""
    runner = cast(SlurmCli, w.ctl.slurm).cmd._runner  # noqa: SLF001
    return cast(Refusing, runner).refused


def _grow_refused(w: World) -> None:
    w.cycles(8)  # both busy jobs grow: ok's extension is submitted, refused's is refused
    w.wait("ext", "RUNNING")
    w.cycles(3)


def _grow_refused_transiently(w: World) -> None:
    w.cycles(8)  # the grow's sbatch cannot reach slurmctld
    for _ in range(12):  # reconcile finds no extension for the key; the next grow goes through once
        w.reconcile()
        w.cycles(1)


def _shrink_refused(w: World) -> None:
    w.cycles(12)  # the grace signal, then the shrink, refused; the busy job holds (no free node)


class Killed(BaseException):
    """Stands for SIGKILL at a fault-hook step (nothing in the controller catches it)."""


def _until_killed(w: World) -> None:
    """Up to 12 cycles, until a Killed ends the controller."""
    try:
        w.cycles(12)
    except Killed:
        w.check()


def _restarted(w: World) -> None:
    """The controller is restarted (a new process on the same database, no fault hook) and runs 20 cycles."""
    w.clock.advance(2.0)
    old = w.ctl
    w.ctl = Controller(old.cfg, old.policy, slurm=old.slurm, store=old.store, collector=old.collector,
                       clock=old.clock, metrics=old.metrics)
    w.cycles(20)


def _crash_at(w: World, at: str) -> None:
    """The controller is killed at the fault-hook step ``at``."""
    def crash(step: str) -> None:
        if step == at:
            raise Killed(step)

    w.ctl.actuator.fault = crash
    _until_killed(w)
    _restarted(w)


def _reply_lost_after_in_progress(w: World) -> None:
    """The shrink's "in progress" mark reaches the DB, but the controller never hears back (its link to MariaDB
    is cut right then, tests/cluster/test_controller_ha.py): it acts no more; another controller on the same
    database carries on."""
    journal = w.ctl.store.journal
    mark = journal.mark_in_progress

    def reply_lost(action_id: int, *, fencing: FencingToken | None = None) -> ActionRecord:
        done = mark(action_id, fencing=fencing)
        if done.kind == ActionKind.SHRINK:
            raise Killed("the DB's reply to the in-progress mark")
        return done

    journal.mark_in_progress = reply_lost  # type: ignore[method-assign]
    try:
        _until_killed(w)
    finally:
        del journal.mark_in_progress
    _restarted(w)


DB_DIRS: list[Path] = []  # the file databases' directories of db_locked and disk_full (release_db_dirs)


def _db_locked(w: World) -> None:
    """The controller on a SQLite file that another connection holds locked for 10 cycles and a reconcile."""
    where = Path(tempfile.mkdtemp(prefix="slurm-elastic-db-locked-"))
    DB_DIRS.append(where)
    old = w.ctl
    w.ctl = Controller(old.cfg, old.policy, slurm=old.slurm, collector=old.collector, clock=old.clock,
                       store=file_store(where / "state.db", w.clock, busy_timeout_ms=50), metrics=old.metrics)
    w.cycles(2)
    locker = sqlite3.connect(where / "state.db", timeout=0.1, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        w.cycles(10)  # must not raise
        w.reconcile()  # nor the reconcile pass
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    w.cycles(8)  # the DB answers again: the busy job grows


def _disk_full(w: World) -> None:
    """The controller on a SQLite file on a 1 MiB tmpfs that is filled to its last block for 10 cycles."""
    where = Path(tempfile.mkdtemp(prefix="slurm-elastic-disk-full-"))
    DB_DIRS.append(where)
    why = can_mount_tmpfs(where)
    if why:
        raise AssertionError(f"cannot run the full-disk scenario: {why} (scripts/test runs as root, where it works)")
    old = w.ctl
    w.ctl = Controller(old.cfg, old.policy, slurm=old.slurm, collector=old.collector, clock=old.clock,
                       store=file_store(where / "state.db", w.clock, busy_timeout_ms=50), metrics=old.metrics)
    w.cycles(2)
    ballast = where / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    try:
        w.cycles(10)  # must not raise
    finally:
        ballast.unlink()
    w.cycles(8)  # space is back: the busy job grows


def release_db_dirs() -> None:
    """Unmount (the full-disk tmpfs) and remove the scenarios' database directories."""
    while DB_DIRS:
        where = DB_DIRS.pop()
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30, check=False)
        shutil.rmtree(where, ignore_errors=True)


DEAD_REASON = "scenario-dead-node"


def _extension_on_dead_node(w: World) -> None:
    """The node a grow planned goes DOWN between the intent and the sbatch: the extension, pinned there, pends.

    The scenario sets the node DOWN and back through the controller's own runner, so both runs have the same
    commands (the recording's are real, on the live cluster, under the cluster-tests lock)."""
    cmd = cast(SlurmCli, w.ctl.slurm).cmd
    downed: list[str] = []

    def down_the_planned_node(step: str) -> None:
        if step == "grow:after-intent" and not downed:
            (intent,) = w.ctl.store.journal.open_actions(w.jobs["busy"])
            downed.append(intent.params["nodes"][0])
            cmd.run(["scontrol", "update", f"NodeName={downed[0]}", "State=DOWN", f"Reason={DEAD_REASON}"])

    w.ctl.actuator.fault = down_the_planned_node
    try:
        w.cycles(8)  # the grow: its node goes down, the extension is submitted onto it and pends
        w.ctl.actuator.fault = lambda _step: None
        w.cycles(1)
        w.reconcile()  # the extension pending on a dead node is cancelled
        w.cycles(15)  # past the cooldown: grown again, onto a live node
    finally:
        for node in downed:
            cmd.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])


def _admit_not_started(w: World) -> None:
    """Shrink-to-admit, and Slurm starts another job instead: between the shrink's intent and its grace signal a
    1-node job of root's (top priority) takes the only free node, so the freed one alone cannot start the pending
    2-node job. Submitted and cancelled through the controller's own runner: both runs have the same commands."""
    cmd = cast(SlurmCli, w.ctl.slurm).cmd
    taken: list[str] = []

    def take_the_free_node(step: str) -> None:
        if step == "shrink:after-intent" and not taken:
            (free,) = [n for n in GPU_NODES if n not in w.nodes["running"]]
            taken.append(cmd.run(["sbatch", "--parsable", "-N1", f"--nodelist={free}", "--gres=gpu:4", "--time=30",
                                  "--priority=1000000", "--job-name=scenario-backfill", "--chdir=/tmp",
                                  "--output=/dev/null", "--wrap=sleep 600"]).stdout.strip())

    w.ctl.actuator.fault = take_the_free_node
    try:
        w.cycles(10)  # the grace, then the shrink 3 -> 2 for the pending job; the free node was taken before
        w.ctl.actuator.fault = lambda _step: None
        w.cycles(40)  # 80 s: the admitted job did not start; several cooldowns, still inside the back-off
        w.cycles(30)  # past the back-off (120 s), the job still waits: one more node goes
        w.cycles(10)
    finally:
        for job in taken:
            cmd.run(["scancel", job])


def _node_state(cmd: SlurmCommands, node: str) -> str:
    text = cmd.run(["scontrol", "show", "node", node]).stdout
    return next((x.split("=", 1)[1] for x in text.split() if x.startswith("State=")), "?")


def _cold_node_boots(w: World) -> None:
    """n5 (a cold node, powered down) is powered up: the controller's cycles run while it boots (3 s here). Then,
    booted, it is switched off again and the scenario waits until it is powered down, as the power-saving cluster
    test leaves it (a node left DOWN or NOT_RESPONDING is resumed and forced down once more). The polls go
    through the runner and are recorded, so the replay goes the same way; only the recording sleeps between them
    (its runner has the cluster's environment)."""
    cmd = cast(SlurmCli, w.ctl.slurm).cmd
    recording = "SLURM_CONF" in cmd.env

    def until(done: Callable[[str], bool], what: str) -> str:
        for _ in range(120):
            state = _node_state(cmd, "n5")
            if done(state):
                return state
            if recording:
                time.sleep(0.5)  # a poll of the live cluster while recording, never in a replay
        raise AssertionError(f"n5 never {what} (State={state}); power it down by hand: scontrol update "
                             "NodeName=n5 State=RESUME, then State=POWER_DOWN_FORCE")

    cmd.run(["scontrol", "update", "NodeName=n5", "State=POWER_UP"])
    try:
        w.cycles(2)
    finally:
        until(lambda st: "POWERING_UP" not in st, "finished booting")
        cmd.run(["scontrol", "update", "NodeName=n5", "State=POWER_DOWN_FORCE"])
        state = until(lambda st: ("POWERED_DOWN" in st and "POWERING" not in st) or st.startswith("DOWN"),
                      "powered down")
        if state.startswith("DOWN") or "NOT_RESPONDING" in state:
            cmd.run(["scontrol", "update", "NodeName=n5", "State=RESUME"])
            cmd.run(["scontrol", "update", "NodeName=n5", "State=POWER_DOWN_FORCE"])
        until(lambda st: st.startswith("IDLE") and "POWERED_DOWN" in st and "POWERING" not in st
              and "NOT_RESPONDING" not in st, "powered down")


def _admit_again_once_a_holder_ended(w: World) -> None:
    """Shrink-to-admit for a pending 1-node job while bob's job holds the last node; a top-priority job pinned to
    the node the shrink frees takes it (Slurm chose otherwise: no change to the basis). Then bob's job ends and
    another pinned top-priority job takes its node at once: a holder ended, so the controller shrinks again well
    inside admit_backoff_s. The pinned jobs are submitted and cancelled through the controller's own runner."""
    cmd = cast(SlurmCli, w.ctl.slurm).cmd
    pinned: list[str] = []

    def pin(node: str, name: str) -> None:
        pinned.append(cmd.run(["sbatch", "--parsable", "-N1", f"--nodelist={node}", "--gres=gpu:4", "--time=30",
                               "--priority=1000000", f"--job-name=scenario-{name}", "--chdir=/tmp",
                               "--output=/dev/null", "--wrap=sleep 600"]).stdout.strip())

    def take_the_node_to_be_freed(step: str) -> None:
        if step == "shrink:after-intent" and not pinned:
            (intent,) = w.ctl.store.journal.open_actions(w.jobs["running"])
            pin(intent.params["released_nodes"][0], "backfill")

    w.ctl.actuator.fault = take_the_node_to_be_freed
    try:
        w.cycles(10)  # the grace, then the shrink 3 -> 2 for the pending job; the pinned job takes the freed node
        w.ctl.actuator.fault = lambda _step: None
        w.cycles(40)  # 80 s, several cooldowns: nothing changed, no further shrink
        pin(w.nodes["holder"][0], "replacement")  # pends: bob's job holds that node
        w.cancel("holder")  # bob's job ends; the replacement (top priority) takes its node at once
        w.wait("holder", "CANCELLED")
        w.cycles(10)  # a holder of the partition ended: shrinks again for the pending job
    finally:
        for job in pinned:
            cmd.run(["scancel", job])


def _shrink_grow_then_no_metrics(w: World) -> None:
    w.cycles(8)  # the idle job is signalled, the busy one grows by an extension job
    w.wait("ext", "RUNNING")
    w.cycles(6)  # the idle job shrinks 2 -> 1; samples go on
    w.agents.silent.update(GPU_NODES)  # the metrics source is gone: every node an error
    w.cycles(6)


for _s in (
    Scenario("grow_refused", "two busy 1-node jobs grow; Slurm refuses one's extension for good (Requested node "
             "configuration is not available), the other's is submitted and starts",
             (JobSpec("ok", 1, util=95.0), JobSpec("refused", 1, util=95.0)), _grow_refused,
             prepare=refusing(Refusal("refused", "grow", ("sbatch", "--parsable", "--gres=gpu:99", "-N1",
                                                          "--time=1")))),
    Scenario("grow_refused_transiently", "a busy 1-node job's first extension sbatch cannot reach slurmctld; "
             "reconcile passes and cycles follow", (JobSpec("busy", 1, util=95.0),), _grow_refused_transiently,
             prepare=refusing(Refusal("busy", "grow", ("sbatch", "--parsable", "--time=1"), times=1,
                                      unreachable=True))),
    Scenario("shrink_refused_job_gone", "an idle 3-node job's shrink is refused with Invalid job id (the job "
             "ended between decision and action); a busy 1-node job beside it holds",
             (JobSpec("idle", 3, util=5.0), JobSpec("busy", 1, util=95.0)), _shrink_refused,
             prepare=refusing(Refusal("idle", "shrink", ("scontrol", "update", f"JobId={UNKNOWN_JOB}",
                                                         "NodeList=n1")))),
    Scenario("shrink_crash_before_signal", "an idle 3-node job; the controller dies right after journaling the "
             "shrink's intent, before the grace signal; a restarted one carries on",
             (JobSpec("idle", 3, util=5.0),), lambda w: _crash_at(w, "shrink:after-intent")),
    Scenario("shrink_crash_after_signal", "an idle 3-node job; the controller dies right after the shrink's grace "
             "signal, before marking it in progress; a restarted one carries on",
             (JobSpec("idle", 3, util=5.0),), lambda w: _crash_at(w, "shrink:after-signal")),
    Scenario("shrink_reply_lost_after_in_progress", "an idle 3-node job; the DB takes the shrink's in-progress "
             "mark but its reply never reaches the controller, which acts no more; another one carries on",
             (JobSpec("idle", 3, util=5.0),), _reply_lost_after_in_progress),
    Scenario("db_locked", "a busy 1-node job; the controller's SQLite file is locked by another connection for 10 "
             "cycles, then free: the job grows", (JobSpec("busy", 1, util=95.0),), _db_locked),
    Scenario("disk_full", "a busy 1-node job; the controller's SQLite file system is full for 10 cycles, then has "
             "space again: the job grows", (JobSpec("busy", 1, util=95.0),), _disk_full),
    Scenario("extension_on_dead_node", "a busy 1-node job grows; the planned node goes DOWN before the sbatch: "
             "the pinned extension pends there, reconcile cancels it, the job grows onto a live node",
             (JobSpec("busy", 1, util=95.0),), _extension_on_dead_node),
    Scenario("admit_not_started", "a 3-node job in band shrinks to 2 for a pending 2-node job, but another job "
             "takes the only free node first: the pending job does not start; after the back-off one more node goes",
             (JobSpec("running", 3, util=60.0, priority=100),
              JobSpec("pending", 2, user="bob", elastic=False, priority=100000, pending=True)),
             _admit_not_started, policy_text=ADMIT_POLICY_TEXT),
    Scenario("cold_node_boots", "a 1-node job; the cold node n5 is powered up and boots during two cycles",
             (JobSpec("job", 1, util=50.0),), _cold_node_boots),
    Scenario("admit_again_once_a_holder_ended", "a 3-node job in band shrinks to 2 for a pending 1-node job; "
             "another job takes the freed node; later bob's job on the last node ends and another takes that at "
             "once: the 3-node job shrinks again for the pending job",
             (JobSpec("running", 3, util=60.0, priority=100), JobSpec("holder", 1, user="bob", util=60.0),
              JobSpec("pending", 1, user="bob", elastic=False, priority=100000, pending=True)),
             _admit_again_once_a_holder_ended,
             policy_text=ADMIT_POLICY_TEXT.replace("admit_backoff_s = 120", "admit_backoff_s = 1800")),
    Scenario("shrink_grow_then_no_metrics", "a busy 1-node job grows, an idle 2-node job shrinks to 1; then no "
             "node's metrics answer", (JobSpec("busy", 1, util=95.0), JobSpec("idle", 2, util=5.0)),
             _shrink_grow_then_no_metrics),
):
    SCENARIOS[_s.name] = _s
