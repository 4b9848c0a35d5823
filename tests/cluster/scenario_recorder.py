"""Record controller scenarios (tests/unit/slurm_replay.py) on the live 22.05 test cluster.

Not part of any test run: ``scripts/record-slurm-scenarios [NAME...]`` runs this under the cluster-tests lock.
For each scenario it submits the scenario's jobs, runs the real controller over the real SlurmCli with a runner
that writes down every command and its reply, then cancels the jobs and saves the recording.
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slurm_elastic.controller.extension import ExtensionTag
from slurm_elastic.slurm.runner import CommandResult, RetryPolicy, SlurmCommands, subprocess_runner
from tests.cluster.harness import TestCluster
from tests.unit import (
    controller_scenarios,  # noqa: F401 - registers its scenarios in SCENARIOS
    loss_scenarios,  # noqa: F401 - registers its scenarios in SCENARIOS
    reliability_scenarios,  # noqa: F401 - registers its scenarios in SCENARIOS
    resize_scenarios,  # noqa: F401 - registers its scenarios in SCENARIOS
)
from tests.unit.slurm_replay import (
    RELEASE,
    SCENARIO_DIR,
    SCENARIOS,
    Recording,
    Scenario,
    build_world,
)
from tests.unit.test_controller_cycle import Agents

ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"}
PLAIN = "#!/bin/bash\nwhile :; do sleep 5 & wait $!; done\n"


class RecordingRunner:
    """The production runner, with every call and its reply appended to ``commands`` in order."""

    def __init__(self) -> None:
        self.commands: list[dict[str, Any]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float, input_text: str | None,
                 env: Mapping[str, str] | None) -> CommandResult:
        result = subprocess_runner(argv, timeout=timeout, input_text=input_text, env=env)
        self.commands.append({"argv": list(argv), "stdin": input_text, "rc": result.returncode,
                              "stdout": result.stdout, "stderr": result.stderr})
        return result


def _wait_state(cluster: TestCluster, job_id: int, state: str, timeout: float = 60) -> None:
    cluster.wait_state(job_id, {state}, timeout=timeout)


def _wait_reason(cluster: TestCluster, job_id: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (job := cluster.job(job_id)) is not None and job.state_reason in (None, "None"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still has no pending reason after {timeout:.0f}s")
        time.sleep(0.5)


def _own_dir(cluster: TestCluster, scenario: str, user: str) -> Path:
    d = cluster.jobs_dir / f"scenario-{scenario}-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    pw = pwd.getpwnam(user)
    os.chown(d, pw.pw_uid, pw.pw_gid)
    return d


DAEMON_SH = Path(__file__).resolve().parents[2] / "docker-slurm" / "slurm-daemon.sh"
FAULT_WAIT_S = 240  # SlurmdTimeout=60 marks a silent node DOWN within ~95 s; MinJobAge=120 purges a job


def _node_states(cluster: TestCluster, node: str) -> set[str]:
    """The node's base state and flags from ``scontrol show node`` (``DOWN+NOT_RESPONDING``)."""
    cp = cluster.run(["scontrol", "show", "node", node], check=True)
    match = re.search(r"\bState=(\S+)", cp.stdout)
    return set(match.group(1).split("+")) if match else set()


def _poll(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + FAULT_WAIT_S
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {FAULT_WAIT_S}s")
        time.sleep(1)


class Faults:
    """The cluster-side events of a scenario (World.fault), and their undoing: every slurmd stopped is started
    again and every node touched is resumed, until n1-n4 are idle."""

    def __init__(self, cluster: TestCluster, jobs: dict[str, int]) -> None:
        self.cluster, self.jobs = cluster, jobs
        self.stopped: set[str] = set()
        self.touched: set[str] = set()

    def __call__(self, what: str, arg: str) -> None:
        c = self.cluster
        if what == "stop-slurmd":  # the node's slurmd dies: Slurm notices by itself (SlurmdTimeout)
            self.stopped.add(arg)
            self.touched.add(arg)
            c.run([str(DAEMON_SH), "stop-slurmd", arg], check=True)
        elif what == "down":  # an admin sets the node DOWN
            self.touched.add(arg)
            c.run(["scontrol", "update", f"NodeName={arg}", "State=DOWN", "Reason=scenario-recording"], check=True)
        elif what == "wait-node":  # NODE:STATE, a base state or a flag
            node, state = arg.split(":")
            _poll(f"{node} {state}", lambda: state in _node_states(c, node))
        elif what == "wait-job-nodes":  # JOB:N, the job runs on N nodes
            name, count = arg.split(":")
            _poll(f"{name} on {count} node(s)",
                  lambda: (j := c.job(self.jobs[name])) is not None and j.node_count == int(count))
        elif what == "wait-purged":  # JOB, gone from squeue --all (MinJobAge after its end)
            _poll(f"{arg} purged", lambda: c.job_record(self.jobs[arg]) is None)
        else:
            raise ValueError(f"unknown fault {what!r}")

    def restore(self) -> None:
        c = self.cluster
        for node in sorted(self.stopped):
            c.run([str(DAEMON_SH), "start-slurmd", node], check=True)
        for node in sorted(self.touched):
            states = _node_states(c, node)
            if states & {"DOWN", "DRAIN", "FAIL"}:
                c.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        if self.touched:
            c.wait_nodes_idle(timeout=FAULT_WAIT_S)


def record(cluster: TestCluster, scenario: Scenario) -> Recording:
    deadline = time.monotonic() + 120  # the lock's previous holder may still be cancelling its jobs
    while (active := [j.job_id for j in cluster.jobs() if j.state in ACTIVE]) and time.monotonic() < deadline:
        time.sleep(1)
    if active:
        raise RuntimeError(f"the cluster still runs jobs {active}; a recording wants it to itself")
    cluster.wait_nodes_idle()
    jobs: dict[str, int] = {}
    nodes: dict[str, list[str]] = {}
    faults = Faults(cluster, jobs)
    try:
        for spec in scenario.jobs:
            first = jobs[scenario.jobs[0].name] if jobs else 0
            tag = ([f"--comment={ExtensionTag(first, spec.tag_key.format(leader=first)).render()}"]
                   if spec.tag_key else [])
            if spec.own_dir:  # the harness's --chdir=/tmp comes first: the last one counts
                tag.append(f"--chdir={_own_dir(cluster, scenario.name, spec.user)}")
            shape = [f"-N{spec.nodes}", "--time=30", *(("--gres=gpu:4",) if not spec.het else ()), *tag,
                     f"--job-name=scenario-{spec.name}", *((":", *spec.het) if spec.het else ())]
            jobs[spec.name] = cluster.submit(spec.script if spec.elastic else PLAIN, *shape, user=spec.user)
            if spec.priority is not None:
                cluster.run(["scontrol", "update", f"JobId={jobs[spec.name]}", f"Priority={spec.priority}"],
                            check=True)
            _wait_state(cluster, jobs[spec.name], "PENDING" if spec.pending else "RUNNING")
            if spec.pending:  # until the scheduler has looked at it (Reason=None: not yet; policy/moldable.py)
                _wait_reason(cluster, jobs[spec.name])
            if spec.het:  # the unit is component 1, addressed by its raw id
                jobs[f"{spec.name}_leader"] = jobs[spec.name]
                jobs[spec.name] = next(j.job_id for j in cluster.jobs()
                                       if j.het_job_id == jobs[spec.name] and j.het_job_offset == 1)
            job = cluster.job(jobs[spec.name])
            nodes[spec.name] = list(job.nodes) if job is not None else []
        start = datetime.now(tz=UTC).replace(microsecond=0)
        recorder = RecordingRunner()
        commands = SlurmCommands(env=cluster.env, runner=recorder, retry=RetryPolicy())
        ext_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "SLURM_CONF": cluster.env["SLURM_CONF"]}
        from tests.unit.storehelpers import FakeClock

        clock = FakeClock(start)
        leader = scenario.jobs[0].name

        def wait(name: str, state: str) -> None:
            if name not in jobs:  # the extension job the controller submitted for the leader
                (ext,) = world.ctl.store.jobs.extensions(jobs[leader])
                jobs[name] = ext.job_id
            _wait_state(cluster, jobs[name], state)

        world, store = build_world(scenario, commands, clock, Agents(clock), jobs, nodes, ext_env, wait)
        users = {spec.name: spec.user for spec in scenario.jobs}

        def cancel(name: str) -> None:
            cluster.run(["scancel", str(jobs[name])], user=users[name], check=True)

        world.cancel = cancel
        world.fault = faults
        scenario.play(world)
        return Recording(name=scenario.name, release=RELEASE,
                         recorded_at=datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%MZ"), clock_start=start,
                         extension_env=ext_env, jobs=dict(jobs), nodes=nodes, commands=recorder.commands)
    finally:
        cluster.cancel(*jobs.values())
        for spec in scenario.jobs:  # extensions the controller submitted are alice's or bob's
            cluster.run(["scancel", "-u", spec.user, "--name", f"elastic-ext-{jobs.get(spec.name, 0)}"])
        faults.restore()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("names", nargs="*", help=f"scenarios (default: all): {', '.join(SCENARIOS)}")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    cluster = TestCluster()
    if not cluster.is_up():
        print("record: the 22.05 test cluster is not up (docker-slurm/cluster.sh status)", file=sys.stderr)
        return 2
    failed = []
    for name in args.names or list(SCENARIOS):
        t0 = time.monotonic()
        try:
            rec = record(cluster, SCENARIOS[name])
        except Exception as e:  # noqa: BLE001 - say which scenario failed, record the others
            print(f"record: {name} FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(name)
            continue
        finally:
            reliability_scenarios.release_db_dirs()  # its file databases (a tmpfs among them)
        path = SCENARIO_DIR / f"{name}.json"
        rec.save(path)
        print(f"record: {name}: {len(rec.commands)} commands -> {path} ({time.monotonic() - t0:.0f}s)",
              file=sys.stderr)
        cluster.wait_nodes_idle()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
