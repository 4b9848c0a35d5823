"""Record MIG workflow scenarios (tests/unit/mig_replay.py) on node n4 of the live 22.05 test cluster.

Not part of any test run: ``scripts/record-mig-scenarios [NAME...]`` runs this under the cluster-tests lock.
For each scenario it sets n4 up (a job on it, or drained), runs the real workflow through the production Slurm
side with a runner that writes down every Slurm and daemon command and its reply, and always puts n4 back
afterwards the way tests/cluster/test_mig_cluster.py does (its restore_node: the original slurm.conf and
gres.conf, the restart sequence, Gres=gpu:4,mps:400; then resumed unless it was drained before).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slurm_elastic.mig.adapters import LocalFiles, SystemClock
from slurm_elastic.mig.ports import WorkflowSettings
from slurm_elastic.slurm.daemons import daemon_runner
from slurm_elastic.slurm.runner import CommandResult, CommandRunner, subprocess_runner
from tests.cluster.harness import TestCluster
from tests.cluster.test_mig_cluster import EXTRA_DEVICES, NODE, restore_node
from tests.unit.mig_replay import MIG_SCENARIO_DIR, MIG_SCENARIOS, RELEASE, MigRecording, MigScenario, build_world
from tests.unit.storehelpers import FakeClock as StoreClock
from tests.unit.storehelpers import memory_store

REPO = Path(__file__).resolve().parents[2]
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"}
JOBS = {"short": "#!/bin/bash\nsleep 6\n", "long": "#!/bin/bash\nsleep 300\n"}


class MigRecordingRunner:
    """Slurm's commands through the production runner, daemon commands through theirs; every call and its
    reply appended to one list, in order."""

    def __init__(self) -> None:
        self.commands: list[dict[str, Any]] = []
        self.daemon_programs: set[str] = set()

    def __call__(self, argv: Sequence[str], *, timeout: float, input_text: str | None,
                 env: Mapping[str, str] | None) -> CommandResult:
        run: CommandRunner = daemon_runner if argv[0] in self.daemon_programs else subprocess_runner
        result = run(argv, timeout=timeout, input_text=input_text, env=env)
        self.commands.append({"argv": list(argv), "stdin": input_text, "rc": result.returncode,
                              "stdout": result.stdout, "stderr": result.stderr})
        return result


class MigRecordingClock(SystemClock):
    def __init__(self) -> None:
        self.log: list[list[Any]] = []

    def now(self) -> float:
        t = super().now()
        self.log.append(["now", t])
        return t

    def sleep(self, seconds: float) -> None:
        self.log.append(["sleep", seconds])
        super().sleep(seconds)


def _node(cluster: TestCluster) -> dict[str, str]:
    out = cluster.run(["scontrol", "-o", "show", "node", NODE], check=True).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def _restore(cluster: TestCluster, slurm_conf: str, gres_conf: str, was_drained: bool) -> None:
    """restore_node, once more after a failure (a daemon command can fail once, e.g. under an edit)."""
    try:
        restore_node(cluster, slurm_conf, gres_conf, was_drained)
    except Exception as e:  # noqa: BLE001 - try again once, then let it raise
        print(f"record: restoring {NODE} failed ({e}); once more in 5 s", file=sys.stderr)
        time.sleep(5)
        restore_node(cluster, slurm_conf, gres_conf, was_drained)


def _restart_n4(cluster: TestCluster, daemon: str) -> None:
    """restore_node's restart sequence, for a node whose files and Gres= are right but whose state is not."""
    print(f"record: {NODE} is {_node(cluster)['State']}: restarting its slurmd and slurmctld", file=sys.stderr)
    for argv in ([daemon, "stop-slurmd", NODE], [daemon, "restart-slurmctld"], [daemon, "start-slurmd", NODE]):
        cluster.run(argv, check=True)
    deadline = time.monotonic() + 60
    while _invalid(_node(cluster)["State"]) and time.monotonic() < deadline:
        time.sleep(0.5)


def _invalid(state: str) -> bool:
    return "INVAL" in state or state.split("+", maxsplit=1)[0] in ("DOWN", "UNKNOWN", "FAIL")


def record(cluster: TestCluster, scenario: MigScenario) -> MigRecording:
    deadline = time.monotonic() + 120  # the lock's previous holder may still be cancelling its jobs
    while (active := [j.job_id for j in cluster.jobs() if j.state in ACTIVE]) and time.monotonic() < deadline:
        time.sleep(1)
    if active:
        raise RuntimeError(f"the cluster still runs jobs {active}; a recording wants it to itself")
    cluster.wait_nodes_idle()
    etc = cluster.root / "etc"
    slurm_conf, gres_conf = (etc / "slurm.conf").read_text(), (etc / "gres.conf").read_text()
    was_drained = "DRAIN" in _node(cluster)["State"]
    daemon = str(REPO / "docker-slurm" / "slurm-daemon.sh")
    cmds = {"slurmd_stop": [daemon, "stop-slurmd", "{node}"], "slurmd_start": [daemon, "start-slurmd", "{node}"],
            "slurmctld_restart": [daemon, "restart-slurmctld"]}
    settings = WorkflowSettings.from_obj({
        **WorkflowSettings(slurm_conf=str(etc / "slurm.conf"), gres_conf=str(etc / "gres.conf"),
                           device_files=f"{cluster.root / 'dev'}/{{node}}/gpu{{ordinal}}", mps_per_gpu=100,
                           wait_timeout_s=120, verify_timeout_s=120, poll_interval_s=1).to_obj(),
        **scenario.settings})
    made: list[Path] = []
    jobs: dict[str, int] = {}
    try:
        for i in EXTRA_DEVICES:  # one device node per MIG instance, as the MIG cluster test makes them
            dev = cluster.gpu_device(NODE, i)
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(240, 200 + i))
                dev.chmod(0o666)
                made.append(dev)
        if scenario.drained:
            cluster.run(["scontrol", "update", f"NodeName={NODE}", "State=DRAIN", f"Reason={scenario.drained}"],
                        check=True)
        if scenario.job:
            jobs["job"] = cluster.submit(JOBS[scenario.job], "--gres=gpu:1", f"--nodelist={NODE}", "-N1", "-n1",
                                         f"--job-name=mig-scenario-{scenario.name}")
            cluster.wait_state(jobs["job"], {"RUNNING"}, timeout=60)
        recorder = MigRecordingRunner()
        recorder.daemon_programs.add(daemon)
        clock = MigRecordingClock()
        store = memory_store(StoreClock())
        world = build_world(recorder, cluster.env, cmds, clock, LocalFiles(), store)
        scenario.script(world, settings)
        last = world.results[-1] if world.results else None
        if last is None or last.outcome is not scenario.outcome:  # e.g. a daemon command broke meanwhile
            raise RuntimeError(f"the workflow ended {last}, not {scenario.outcome}: not saved")
        return MigRecording(name=scenario.name, release=RELEASE,
                            recorded_at=datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%MZ"),
                            settings=settings.to_obj(), daemon_commands=cmds,
                            files={settings.slurm_conf: slurm_conf, settings.gres_conf: gres_conf}, jobs=jobs,
                            clock=clock.log, commands=recorder.commands)
    finally:
        if jobs:
            cluster.cancel(*jobs.values())
        _restore(cluster, slurm_conf, gres_conf, was_drained)
        if _invalid(_node(cluster)["State"]):  # e.g. INVAL after a reconfigure, the files already back:
            _restart_n4(cluster, daemon)  # restore_node saw nothing to do
        if not was_drained and "DRAIN" in _node(cluster)["State"]:  # restore_node returns early when the
            cluster.run(["scontrol", "update", f"NodeName={NODE}", "State=RESUME"])  # files were never changed
        for dev in made:
            dev.unlink(missing_ok=True)
        cluster.wait_nodes_idle()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("names", nargs="*", help=f"scenarios (default: all): {', '.join(MIG_SCENARIOS)}")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in MIG_SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s) {unknown}; known: {', '.join(MIG_SCENARIOS)}")
    cluster = TestCluster()
    if not cluster.is_up():
        print("record: the 22.05 test cluster is not up (docker-slurm/cluster.sh status)", file=sys.stderr)
        return 2
    failed = []
    for name in args.names or list(MIG_SCENARIOS):
        t0 = time.monotonic()
        try:
            rec = record(cluster, MIG_SCENARIOS[name])
        except Exception as e:  # noqa: BLE001 - say which scenario failed, record the others
            print(f"record: {name} FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(name)
            continue
        path = MIG_SCENARIO_DIR / f"{name}.json"
        rec.save(path)
        print(f"record: {name}: {len(rec.commands)} commands -> {path} ({time.monotonic() - t0:.0f}s)",
              file=sys.stderr)
    node = _node(cluster)
    print(f"record: {NODE} left with Gres={node.get('Gres')}, State={node.get('State')}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
