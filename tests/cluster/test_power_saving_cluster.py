"""Node-level elasticity through Slurm's power saving on the real cluster (docs/power-saving.md).

The test cluster's n5, n6 are CLOUD nodes of the hidden partition ``cold``: powered down until a job names
them; then Slurm runs the ResumeProgram (which starts that node's slurmd after a boot delay), shows the node
POWERING_UP and the job CONFIGURING, and starts the job once the node registered. After SuspendTime idle the
SuspendProgram stops the slurmd again and the node is POWERED_DOWN.

Agents run on n5 and n6 too (an agent answers whether its node is on): a resumed node's slurmd runs in a time
namespace booted at the resume (docker-slurm/power-resume.sh), and the agent outside it still reports its jobs'
real utilization.

a. A busy elastic job (95% GPU load) on the resumed n5 grows by utilization (OVERUTILIZED) onto the powered-down
   n6: n5's agent reports the leader's 95%, the decision names n6 as a node Slurm resumes, Slurm resumes it, the
   extension runs there and n6's agent reports the extension's 95%; once the extension is gone n6 powers down
   again. The job has ``#ELASTIC --prewarm``: the extension runs it on n6 before joining, the leader gets its grow
   notice only after n6 is ready, and the controller records the grow's cold start in phases (COLD_START) as the
   unit's restart cost.
b. n6 never boots (listed in etc/power-fail-nodes): after ResumeTimeout the controller records RESUME_FAILED,
   the extension job is cancelled, the unit stays at one node, and n6 is not grown onto again (backoff).
c. The job's ``--prewarm`` exits 2 on n6: PREWARM_FAILED (no timeout named), the extension cancelled (it ends
   COMPLETED), and the grow backs off (GROW_BACKOFF) until the time the record names: one attempt per back-off
   period, with n6 powered down in between.
d. A busy job submitted with ``-p train,cold`` starts in train on n1 while n2-n4 are taken: the job_submit plugin
   kept both partitions in its admin_comment (Slurm shows the running job only train), and it grows into cold:
   the extension job is submitted to cold, Slurm resumes n5 for it, and n5's agent reports it at 95%.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slurm_elastic.agent.payload import JobReport
from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.slurm.model import Job
from slurm_elastic.store.records import DecisionRecord
from tests.cluster.agents_harness import JOB_PYTHON, Agents, running_agents, wait_for
from tests.cluster.controller_harness import controller_config, running_controller, wait_until
from tests.cluster.harness import RELEASE, REPO, TestCluster
from tests.cluster.test_job_submit_lua import install_plugin

# Only the 22.05 cluster (docker-slurm/cluster.sh) has the power-saved nodes n5, n6.
pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(RELEASE != "22.05", reason="power-saved nodes are on the 22.05 cluster only")]

SCRIPT = """#!/bin/bash
#ELASTIC --min-nodes 2 --max-nodes 2
sleep 600
"""

# Through the launcher: the extension runs the prewarm (2 s, as if loading a model) before joining; the leader's
# worker acknowledges the grow notice (the launcher forwards it as SIGUSR1) so the extension joins at once.
WORKER = ("import signal, time; from slurm_elastic import resize; "
          "signal.signal(signal.SIGUSR1, lambda *a: resize.acknowledge()); time.sleep(600)")
PREWARM_SCRIPT = f"""#!/bin/bash
#ELASTIC --min-nodes 2 --max-nodes 2 --prewarm '{JOB_PYTHON} -c "import time; time.sleep(2)"' --prewarm-timeout 60
export PYTHONPATH={REPO}
srun --kill-on-bad-exit=0 --ntasks-per-node=1 {JOB_PYTHON} -m slurm_elastic.launch exec {JOB_PYTHON} -c '{WORKER}'
"""
FAILING_PREWARM_SCRIPT = PREWARM_SCRIPT.replace('time.sleep(2)', 'raise SystemExit(2)')
# The same job between 1 and 2 nodes, whose workers also run the virtual-GPU workload at 95% (above the test
# policy's scale_up_above 80): it grows by utilization, and each node's agent sees the load.
BUSY_WORKER = WORKER.replace("time.sleep(600)", "subprocess.Popen([sys.executable, \"-m\", "
                             "\"slurm_elastic.testing.vgpu.workload\", \"--util\", \"95\", \"--mem-mib\", \"1000\"]); "
                             "time.sleep(600)").replace("import signal, time;", "import signal, subprocess, sys, time;")
BUSY_PREWARM_SCRIPT = (PREWARM_SCRIPT.replace("--min-nodes 2", "--min-nodes 1").replace(WORKER, BUSY_WORKER)
                       .replace("export PYTHONPATH=", "export SLURM_ELASTIC_VGPU_DIR={VGPU} PYTHONPATH="))
POWER_NODES = ("n5", "n6")


@pytest.fixture(scope="module")
def agents(cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    """An agent for every node, the power-saved n5 and n6 included (conftest's are on n1-n4 only)."""
    with running_agents(cluster, tmp_path_factory.mktemp("power-agents"), interval_s=1.0, window_s=4,
                        nodes=(*cluster.nodes, *POWER_NODES)) as a:
        yield a


def _busy(agents: Agents, node: str, job: int) -> JobReport | None:
    """``job`` as ``node``'s agent reports it once the agent sees it at the workload's 95% (None before)."""
    j = next((j for j in agents.report(node).jobs if j.job_id == job), None)
    return j if j is not None and j.util_last_percent is not None and abs(j.util_last_percent - 95) <= 5 else None


def _node(cluster: TestCluster, name: str) -> tuple[str, str]:
    """(State=..., Reason=...) of a node as scontrol shows it."""
    text = cluster.run(["scontrol", "show", "node", name], check=True).stdout
    state = next((w.split("=", 1)[1] for w in text.split() if w.startswith("State=")), "?")
    reason = next((line.split("Reason=", 1)[1].strip() for line in text.splitlines() if "Reason=" in line), "")
    return state, reason


def _powered_down(cluster: TestCluster, name: str) -> bool:
    state = _node(cluster, name)[0]
    return (state.startswith("IDLE") and "POWERED_DOWN" in state and "POWERING" not in state
            and "NOT_RESPONDING" not in state)


def _extensions(cluster: TestCluster, leader: int) -> list[Job]:
    out = []
    for j in cluster.jobs():
        tag = parse_tag(j.comment)
        if tag is not None and tag.parent == leader:
            out.append(j)
    return out


@contextlib.contextmanager
def _fail_boot(cluster: TestCluster, node: str) -> Iterator[None]:
    """``node`` never boots while inside; afterwards it is made usable again (powered down, not DOWN)."""
    path = cluster.root / "etc" / "power-fail-nodes"
    path.write_text(f"{node}\n")
    try:
        yield
    finally:
        path.write_text("")
        state, _ = _node(cluster, node)
        if state.startswith("DOWN") or "NOT_RESPONDING" in state:
            # Slurm refuses a node a failed resume left NOT_RESPONDING until it is powered down again
            cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
            cluster.run(["scontrol", "update", f"NodeName={node}", "State=POWER_DOWN_FORCE"])
        wait_until(f"{node} powered down again", lambda: _powered_down(cluster, node), 60)


def _leader_on_n5(cluster: TestCluster, script: str = SCRIPT) -> int:
    assert _powered_down(cluster, "n5") or _node(cluster, "n5")[0].startswith("IDLE"), _node(cluster, "n5")
    job = cluster.submit(script, "-p", "cold", "-w", "n5", "-N1", "--gres=gpu:2", "--time=10")
    cluster.wait_state(job, {"RUNNING"}, timeout=90)  # n5 resumed first if it was off
    return job


def test_grow_onto_a_powered_down_node_and_it_suspends_again(agents: Agents, clean_cluster: TestCluster,
                                                            tmp_path: Path) -> None:
    cluster = clean_cluster
    wait_until("n6 powered down", lambda: _powered_down(cluster, "n6"), 90)
    t0 = time.monotonic()
    job = _leader_on_n5(cluster, BUSY_PREWARM_SCRIPT.replace("{VGPU}", str(cluster.root / "vgpu")))
    # n5 was resumed for the leader: its agent reports the job's real load (not 0% across the time namespace)
    leader = wait_for("n5's agent reporting the leader at 95%", lambda: _busy(agents, "n5", job), 60)
    assert leader.gpus_in_use == 2, leader
    with running_controller(cluster, controller_config(tmp_path, agents)) as ctl:
        wait_until("a grow decision that resumes n6", lambda: any(
            d.action == "grow" and d.inputs.get("resume_nodes") == "n6" for d in ctl.decisions(job)), 90, ctl)
        grow = next(d for d in ctl.decisions(job) if d.action == "grow")
        assert grow.reason == "OVERUTILIZED" and "powered-down node(s) for Slurm to resume: n6" in grow.message, (
            grow.reason, grow.message)
        assert grow.current_nodes == 1 and grow.target_nodes == 2
        seen: set[str] = set()

        def ext_running() -> bool:
            seen.add(_node(cluster, "n6")[0])
            return any(e.is_running and "n6" in e.nodes for e in _extensions(cluster, job))
        wait_until("the extension running on the resumed n6", ext_running, 90, ctl)
        assert any("POWERING_UP" in s for s in seen), seen  # Slurm resumed it for the extension
        resumed_s = time.monotonic() - t0
        ext = next(e.job_id for e in _extensions(cluster, job) if "n6" in e.nodes)
        # The extension's workers on the resumed n6 run at 95%, and n6's agent says so
        on_n6 = wait_for("n6's agent reporting the extension at 95%", lambda: _busy(agents, "n6", ext), 120)
        assert on_n6.gpus_in_use == 2, on_n6
        wait_until("the grow's cold start on record", lambda: any(
            d.reason == "COLD_START" for d in ctl.decisions(job)), 60, ctl)
        cold = next(d for d in ctl.decisions(job) if d.reason == "COLD_START")
        phases = {p: float(cold.inputs[f"{p}_s"]) for p in ("resume", "start", "prewarm", "join")}
        assert phases["resume"] > 0 and phases["prewarm"] >= 2.0, phases  # n6 booted; the prewarm sleeps 2 s
        assert cold.inputs["restart_cost_s"] == round(phases["start"] + phases["prewarm"] + phases["join"], 1)
        assert not any(d.reason == "PREWARM_FAILED" for d in ctl.decisions(job))
        # The leader was told only once n6 was ready: its grow notice is the extension's, written after "ready".
        work = Path("/tmp/.slurm-elastic")
        events = [json.loads(line) for line in (work / f"prewarm-{job}.jsonl").read_text().splitlines()]
        ready = next(e["time"] for e in events if e["event"] == "ready" and e["node"] == "n6")
        notice = json.loads((work / f"resize-{job}.json").read_text())
        assert notice["id"].endswith(":prewarm") and notice["time"] >= ready, (notice, events)
        cold_s = time.monotonic() - t0
    # The job ends (the controller is gone, so nothing regrows): n6 idles and Slurm powers it down after
    # SuspendTime (20 s) and SuspendTimeout (10 s).
    cluster.cancel_all()
    wait_until("n5 and n6 powered down again after SuspendTime",
               lambda: _powered_down(cluster, "n6") and _powered_down(cluster, "n5"), 90)
    print(f"\nleader on n5 + grow by utilization onto n6 running after {resumed_s:.1f}s (agents: leader "
          f"{leader.util_last_percent}% on n5, extension {on_n6.util_last_percent}% on n6), cold start recorded after "
          f"{cold_s:.1f}s ({cold.message}); whole test {time.monotonic() - t0:.1f}s")


def test_resume_failure_keeps_the_unit_and_backs_the_node_off(agents: Agents, clean_cluster: TestCluster,
                                                             tmp_path: Path) -> None:
    cluster = clean_cluster
    wait_until("n6 powered down", lambda: _powered_down(cluster, "n6"), 90)
    t0 = time.monotonic()
    with _fail_boot(cluster, "n6"):
        job = _leader_on_n5(cluster)
        with running_controller(cluster, controller_config(tmp_path, agents)) as ctl:
            wait_until("RESUME_FAILED on record", lambda: any(
                d.reason == "RESUME_FAILED" for d in ctl.decisions(job)), 120, ctl)
            failed = next(d for d in ctl.decisions(job) if d.reason == "RESUME_FAILED")
            assert failed.action == "hold" and failed.current_nodes == failed.target_nodes == 1
            assert failed.inputs["lost_nodes"] == ["n6"] and "ResumeTimeout 30s" in failed.message
            ext = int(str(failed.inputs["extension_job"]))
            wait_until("the extension job gone", lambda: cluster.job_state(ext) not in {
                "PENDING", "RUNNING", "CONFIGURING"}, 30, ctl)
            mark = ctl.cycle_mark()
            ctl.wait_cycles(3)
            later = [d for d in ctl.decisions(job) if d.time > failed.time]
            assert not any(d.action == "grow" for d in later), [(d.action, d.reason, d.message) for d in later]
            assert ctl.full_cycles_since(mark) >= 3
        cluster.cancel(job)
    # Leave the cluster as the next test expects it: the cold nodes switched off, not idling until SuspendTime.
    cluster.wait_state(job, {"CANCELLED", "COMPLETED"}, timeout=60)
    cluster.run(["scontrol", "update", "NodeName=n5", "State=POWER_DOWN_FORCE"])
    wait_until("n5 powered down again", lambda: _powered_down(cluster, "n5"), 60)
    print(f"\nresume failure recorded and cleaned up in {time.monotonic() - t0:.1f}s")


def test_a_failing_prewarm_backs_off_and_the_node_powers_down_in_between(agents: Agents, clean_cluster: TestCluster,
                                                                         tmp_path: Path) -> None:
    cluster = clean_cluster
    wait_until("n6 powered down", lambda: _powered_down(cluster, "n6"), 90)
    t0 = time.monotonic()
    job = _leader_on_n5(cluster, FAILING_PREWARM_SCRIPT)
    with running_controller(cluster, controller_config(tmp_path, agents)) as ctl:
        def failed() -> list[DecisionRecord]:
            return sorted((d for d in ctl.decisions(job) if d.reason == "PREWARM_FAILED"), key=lambda d: d.time)
        wait_until("the first PREWARM_FAILED", lambda: len(failed()) >= 1, 120, ctl)
        first = failed()[0]
        assert "prewarm on n6 exited with status 2" in first.message and "--prewarm-timeout" not in first.message
        until = datetime.fromisoformat(str(first.inputs["grow_backoff_until"]))
        assert first.inputs["failed_grows"] == 1 and first.inputs["grow_backoff_s"] == 60.0
        ext = int(str(first.inputs["extension_job"]))
        off_between: list[float] = []

        def second() -> bool:
            if _powered_down(cluster, "n6") and datetime.now(tz=UTC) < until:
                off_between.append(time.monotonic() - t0)
            return len(failed()) >= 2
        wait_until("the second PREWARM_FAILED, after the back-off", second, 180, ctl)
        grows = sorted((d for d in ctl.decisions(job) if d.action == "grow"), key=lambda d: d.time)
        # One attempt per back-off period: the second grow waited for the first failure's back-off to end
        assert len(grows) == 2 and grows[1].time >= until - timedelta(seconds=1), (
            [(d.time, d.message) for d in grows], until)
        held = [d for d in ctl.decisions(job) if d.reason == "GROW_BACKOFF"]
        assert held and held[0].inputs["backoff_until"] == until.isoformat() and "PREWARM_FAILED" in held[0].message
        assert off_between, "n6 did not power down within the back-off"
        second_failure = failed()[1]
        assert second_failure.inputs["failed_grows"] == 2 and second_failure.inputs["grow_backoff_s"] == 120.0
        print(f"\nfirst prewarm failure {first.time}, back-off until {until}, second grow {grows[1].time}; "
              f"extension {ext} ended {cluster.job_state(ext)}; n6 powered down "
              f"{off_between[0]:.0f}s into the test")
    # Leave the cold nodes switched off for the next test, without idling until SuspendTime.
    cluster.cancel_all()
    cluster.wait_state(job, {"CANCELLED", "COMPLETED"}, timeout=60)
    cluster.run(["scontrol", "update", "NodeName=n5,n6", "State=POWER_DOWN_FORCE"])
    wait_until("n5 and n6 powered down again", lambda: _powered_down(cluster, "n6") and _powered_down(cluster, "n5"),
               60)
    print(f"whole test {time.monotonic() - t0:.1f}s")


def test_a_job_of_two_partitions_grows_into_the_other_one(agents: Agents, clean_cluster: TestCluster,
                                                          tmp_path: Path) -> None:
    cluster = clean_cluster
    install_plugin(cluster)  # the checkout's job_submit.lua (it keeps the partition list)
    wait_until("n5 powered down", lambda: _powered_down(cluster, "n5"), 90)
    t0 = time.monotonic()
    filler = cluster.submit("#!/bin/bash\nsleep 600\n", "-p", "train", "-w", "n[2-4]", "-N3", "--gres=gpu:4",
                            "--time=10")
    cluster.wait_state(filler, {"RUNNING"}, timeout=60)
    job = cluster.submit(BUSY_PREWARM_SCRIPT.replace("{VGPU}", str(cluster.root / "vgpu")), "-p", "train,cold",
                         "-w", "n1", "-N1", "--gres=gpu:2", "--time=10")
    cluster.wait_state(job, {"RUNNING"}, timeout=60)
    leader = cluster.job(job)
    assert leader is not None and leader.partition == "train" and leader.nodes == ("n1",), leader
    assert "[elastic-partitions:train,cold]" in leader.admin_comment, leader.admin_comment
    with running_controller(cluster, controller_config(tmp_path, agents)) as ctl:
        wait_until("a grow into cold", lambda: any(d.action == "grow" for d in ctl.decisions(job)), 90, ctl)
        grow = next(d for d in ctl.decisions(job) if d.action == "grow")
        assert grow.reason == "OVERUTILIZED" and grow.inputs["grow_partition"] == "cold", (grow.reason, grow.inputs)
        assert grow.inputs["resume_nodes"] == "n5" and "for Slurm to resume: n5" in grow.message, grow.message

        def ext_on_n5() -> Job | None:
            return next((e for e in _extensions(cluster, job) if e.is_running and "n5" in e.nodes), None)
        wait_for("the extension running on the resumed n5", ext_on_n5, 90)
        ext = ext_on_n5()
        assert ext is not None and ext.partition == "cold", ext
        on_n5 = wait_for("n5's agent reporting the extension at 95%", lambda: _busy(agents, "n5", ext.job_id), 60)
        grown_s = time.monotonic() - t0
    cluster.cancel_all()
    cluster.wait_state(job, {"CANCELLED", "COMPLETED"}, timeout=60)
    cluster.run(["scontrol", "update", "NodeName=n5", "State=POWER_DOWN_FORCE"])
    wait_until("n5 powered down again", lambda: _powered_down(cluster, "n5"), 60)
    print(f"\njob {job} in train grew into cold: extension {ext.job_id} on n5 at {on_n5.util_last_percent}% "
          f"after {grown_s:.1f}s; whole test {time.monotonic() - t0:.1f}s")
