"""More recorded controller scenarios (tests/unit/slurm_replay.py) and a steady-cluster reader (not a test module).

The scenarios here are registered in slurm_replay.SCENARIOS on import, so ``scripts/record-slurm-scenarios
NAME`` records them and :func:`slurm_replay.replay` plays them like the others. :func:`steady_cli` serves one
recording as a cluster that no longer changes, for tests of features that need a real snapshot every cycle but
no Slurm behaviour (holds, pauses, explain): any Slurm write, or a command the recording lacks, fails the test.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path

from slurm_elastic import goodput
from slurm_elastic.controller.cycle_stats import observe_cycle
from slurm_elastic.slurm import hostlist
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.decode import parse_squeue
from slurm_elastic.slurm.runner import CommandResult, CommandRunner, RetryPolicy, SlurmCommands
from slurm_elastic.store.records import PauseScope
from tests.unit.slurm_replay import (
    POLICY_TEXT,
    RERECORD,
    SCENARIO_DIR,
    SCENARIOS,
    SCRIPT,
    STEP_S,
    JobSpec,
    Recording,
    Replayed,
    ReplayRunner,
    Scenario,
    StaleRecordingError,
    UtilAgents,
    World,
    command_key,
    play,
)
from tests.unit.storehelpers import FakeClock

GPU_NODES = ("n1", "n2", "n3", "n4")  # the test cluster's GPU nodes (n5, n6 are cold, powered down)


def _watch(w: World) -> None:
    w.cycles(3)


def _in_band_then_idle(w: World) -> None:
    w.cycles(8)  # in band at its max: holds
    w.agents.util.update({(n, w.jobs["job"]): 5.0 for n in w.nodes["job"]})
    w.cycles(12)  # idle: the grace signal, the shrink 3 -> 2 after grace_s (5 s), then the cooldown


def _pauses(w: World) -> None:
    """Job "paused" is paused on its own, and everything is paused globally."""
    w.ctl.store.pauses.pause(PauseScope.JOB, w.jobs["paused"], who="root")
    w.ctl.store.pauses.pause(PauseScope.GLOBAL, None, who="root")


def _resume_after_8(w: World) -> None:
    w.cycles(8)  # a full window under the global pause
    w.ctl.store.pauses.resume(PauseScope.GLOBAL, None)
    w.cycles(8)


def _observed_grow(w: World) -> None:
    """Cycles as the daemon runs them (cycle_stats.observe_cycle) with a free node's agent silent; then another
    holder takes the expired lease."""
    started = w.clock()
    w.agents.silent.add(max(set(GPU_NODES) - set(w.nodes["busy"])))
    for _ in range(10):
        observe_cycle(w.ctl, w.ctl.run_cycle, started)
        w.check()
        w.clock.advance(STEP_S)
    w.clock.advance(1000)
    w.ctl.store.lease.acquire("other", timedelta(seconds=600))
    observe_cycle(w.ctl, w.ctl.run_cycle, started)
    w.check()


def _jobs_end(w: World) -> None:
    w.cycles(2)  # the elastic job is seen running (and stored as elastic)
    for name in ("elastic", "rigid", "waiting"):
        w.cancel(name)
    for name in ("elastic", "rigid", "waiting"):
        w.wait(name, "CANCELLED")
    w.cycles(3)  # the ended jobs are listed for several cycles


def _goodput(per_node: float, scaling: str, cycles: int) -> Callable[[World], None]:
    """The leader, 95% busy on every node of its unit, publishes ``per_node`` samples/s per node (``linear``) or
    in all (``flat``), one unlabelled report per cycle, in its own directory: the controller attributes them to
    sizes. A grow's extension job is waited for until Slurm runs it."""

    def script(w: World) -> None:
        leader = w.jobs["leader"]
        slurm = w.ctl.slurm
        assert isinstance(slurm, SlurmCli)
        job = slurm.job(leader)  # its working directory as Slurm says (replay: moved to the test's)
        w.check()
        assert job is not None and job.working_dir
        path = Path(job.working_dir) / ".slurm-elastic" / f"goodput-{leader}.jsonl"
        path.parent.mkdir(exist_ok=True)
        pw = pwd.getpwnam(job.user)
        grown = 0
        for _ in range(cycles):
            exts = [e for e in w.ctl.store.jobs.extensions(leader) if e.ended_at is None]
            util = {(n, leader): 95.0 for n in w.nodes["leader"]}
            util.update({(n, e.job_id): 95.0 for e in exts for n in hostlist.expand(e.nodelist)})
            w.agents.util = util
            size = len(w.nodes["leader"]) + sum(e.node_count for e in exts)
            value = per_node * size if scaling == "linear" else per_node
            assert goodput.publish(samples_per_s=value, at=w.clock().timestamp(), path=str(path))
            for f in (path.parent, path):
                os.chown(f, pw.pw_uid, pw.pw_gid)  # published by the job's user
            w.cycles(1)
            for e in w.ctl.store.jobs.extensions(leader)[grown:]:
                grown += 1
                w.jobs[f"ext{grown}"] = e.job_id
                w.wait(f"ext{grown}", "RUNNING")

    return script


GOODPUT_POLICY_TEXT = POLICY_TEXT + "\ngoodput = true\nmin_throughput_samples = 3\n"
# A serving job (controller/serving.py reads what it publishes in its working directory).
SERVING_SCRIPT = SCRIPT.replace("#ELASTIC --min-nodes 1 --max-nodes 3",
                                "#ELASTIC --serving --slo-p99 50ms --min-nodes 1 --max-nodes 3")

MORE: tuple[Scenario, ...] = (
    Scenario("steady_at_max", "a 3-node job at its max (3), 50% busy: holds; read as a steady cluster by "
             "steady_cli", (JobSpec("steady", 3, util=50.0),), _watch),
    Scenario("in_band_then_idle", "a 3-node job at its max holds in band, then goes idle: the grace signal and "
             "a shrink to 2", (JobSpec("job", 3, util=50.0),), _in_band_then_idle),
    Scenario("pause_then_resume", "two busy 1-node jobs under a global pause, one of them also paused on its "
             "own; the global pause is lifted: only the other one grows",
             (JobSpec("paused", 1, util=95.0), JobSpec("free", 1, util=95.0)), _resume_after_8, prepare=_pauses),
    Scenario("observed_grow", "a busy 1-node job grows, its cycles observed as the daemon does, a free node's "
             "agent silent; then another holder takes the lease", (JobSpec("busy", 1, util=95.0),),
             _observed_grow),
    Scenario("jobs_end", "an elastic job and a rigid one run, a rigid 3-node one waits; all three are cancelled "
             "and listed as ended for a few cycles",
             (JobSpec("elastic", 1, util=60.0), JobSpec("rigid", 1, user="bob", elastic=False),
              JobSpec("waiting", 3, user="bob", elastic=False, pending=True)), _jobs_end),
    Scenario("goodput_linear", "a busy 1-node job publishing throughput that scales linearly grows to 2, then "
             "to 3 on the measured throughput", (JobSpec("leader", 1, own_dir=True),), _goodput(100.0, "linear", 40),
             policy_text=GOODPUT_POLICY_TEXT),
    Scenario("goodput_flat", "a busy 1-node job whose throughput stays flat grows to 2 (utilization), is shrunk "
             "back to 1 on the measured throughput and not grown again", (JobSpec("leader", 1, own_dir=True),),
             _goodput(500.0, "flat", 70), policy_text=GOODPUT_POLICY_TEXT),
    Scenario("serving_steady", "a 1-node serving job (SLO p99 50 ms), read as a steady cluster by steady_cli",
             (JobSpec("serving", 1, script=SERVING_SCRIPT),), _watch),
)
for _s in MORE:
    SCENARIOS.setdefault(_s.name, _s)


class SteadyRunner:
    """A :class:`CommandRunner` over a recording taken as a cluster that stopped changing: each command gets its
    recorded replies in order, then the last one again. A command the recording never ran (a Slurm write, an
    adapter change) fails the test as stale."""

    def __init__(self, rec: Recording, working_dir: str | None = None) -> None:
        self.rec = rec
        self.replies: dict[tuple[str, ...], list[CommandResult]] = {}
        self.served: dict[tuple[str, ...], int] = {}
        self.error: StaleRecordingError | None = None
        for c in rec.commands:
            key = (*command_key(c["argv"]), "\0", c["stdin"] or "")
            out = c["stdout"]
            if working_dir is not None and c["argv"][:3] == ["squeue", "--all", "--json"]:
                out = _relocated(out, working_dir)
            self.replies.setdefault(key, []).append(CommandResult(tuple(c["argv"]), int(c["rc"]), out, c["stderr"]))

    def __call__(self, argv: Sequence[str], *, timeout: float, input_text: str | None,
                 env: Mapping[str, str] | None) -> CommandResult:
        key = (*command_key(argv), "\0", input_text or "")
        replies = self.replies.get(key)
        if replies is None:
            self.error = StaleRecordingError(
                f"recording {self.rec.name} (read as a steady cluster) never ran {command_key(argv)}; "
                + RERECORD.format(name=self.rec.name))
            raise self.error
        n = self.served.get(key, 0)
        self.served[key] = n + 1
        return replies[min(n, len(replies) - 1)]

    def check(self) -> None:
        """Raise what was refused even where the controller caught it."""
        if self.error is not None:
            raise self.error


def _relocated(squeue_json: str, working_dir: str, recorded: str | None = "/tmp") -> str:
    """The reply with the jobs' recorded working directory (/tmp: slurm_replay says why) moved to
    ``working_dir``, as Slurm (22.05) writes it: slashes escaped."""
    def field(d: str | None) -> str:
        return '"current_working_directory": ' + json.dumps(d).replace("/", "\\/")

    if field(recorded) not in squeue_json:
        raise StaleRecordingError(f"no job with the working directory {recorded} in the recording")
    return squeue_json.replace(field(recorded), field(working_dir))


def steady_cli(name: str, working_dir: str | None = None) -> tuple[SlurmCli, SteadyRunner]:
    """The real :class:`SlurmCli` over scenario ``name``'s recording read as a steady cluster; with
    ``working_dir``, the recorded jobs' working directory is that one (for a job's published files)."""
    path = SCENARIO_DIR / f"{name}.json"
    if not path.exists():
        raise StaleRecordingError(f"no recording {path}; " + RERECORD.format(name=name))
    runner = SteadyRunner(Recording.load(path), working_dir)
    runner_: CommandRunner = runner
    return SlurmCli(SlurmCommands(env={}, runner=runner_, retry=RetryPolicy(), sleep=lambda _s: None)), runner


def replay_in(name: str, agents_factory: Callable[[FakeClock], UtilAgents], working_dir: Path) -> Replayed:
    """:func:`slurm_replay.replay` with the recorded leader's own working directory moved to ``working_dir``
    (a scenario whose job publishes files there: JobSpec.own_dir)."""
    path = SCENARIO_DIR / f"{name}.json"
    if not path.exists():
        raise StaleRecordingError(f"no recording {path}; " + RERECORD.format(name=name))
    rec = Recording.load(path)
    leader = rec.jobs[SCENARIOS[name].jobs[0].name]
    squeue = [c for c in rec.commands if c["argv"][:3] == ["squeue", "--all", "--json"]]
    recorded = next(j.working_dir for c in squeue for j in parse_squeue(json.loads(c["stdout"]))[1]
                    if j.job_id == leader)
    for c in squeue:
        c["stdout"] = _relocated(c["stdout"], str(working_dir), recorded)
    for c in rec.commands:  # an extension job runs where its leader does
        c["argv"] = [f"--chdir={working_dir}" if a == f"--chdir={recorded}" else a for a in c["argv"]]
    return play(name, rec, ReplayRunner(rec), agents_factory)
