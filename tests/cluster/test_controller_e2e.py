"""End to end on the real cluster: real agents over virtual GPUs, the real controller process, real Slurm.

Each test submits elastic jobs whose workload runs on every node at a chosen utilization, starts the controller
with a small-number policy (window 10 s, cooldown 15 s, grace 3 s), and watches Slurm change.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.slurm.model import Job
from slurm_elastic.store.records import ActionKind, ActionState
from tests.cluster.agents_harness import Agents
from tests.cluster.controller_harness import (
    controller_config,
    elastic_script,
    marker_file,
    node_count,
    running_controller,
    wait_until,
)
from tests.cluster.harness import TestCluster

pytestmark = pytest.mark.cluster

DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 3 --window 10s --cooldown 15s --grace 3s --signal USR2"


def extensions_of(cluster: TestCluster, leader: int) -> list[Job]:
    out = []
    for j in cluster.jobs():
        tag = parse_tag(j.comment)
        if tag and tag.parent == leader and j.state in {"RUNNING", "PENDING"}:
            out.append(j)
    return out


def test_underused_job_shrinks_to_min_after_grace_signal(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    marker = marker_file(cluster)
    job = cluster.submit(elastic_script(10, DIRECTIVES, marker), "-N3", "--gres=gpu:2", "--time=60", user="alice")
    cluster.wait_state(job, {"RUNNING"})
    with running_controller(cluster, controller_config(tmp_path, stack)) as ctl:
        wait_until("the job to shrink to 1 node", lambda: node_count(cluster, job) == 1, 150, ctl)
        shrinks = ctl.wait_applied(job, ActionKind.SHRINK, 2)
    assert [(a.params["from"], a.params["to"]) for a in shrinks] == [(3, 2), (2, 1)]
    # The grace signal came before each shrink took nodes away, with the configured grace in between.
    graces = [float(line.split()[1]) for line in marker.read_text().splitlines() if line.startswith("grace")]
    assert len(graces) >= 2
    for action, signalled in zip(shrinks, graces, strict=False):
        assert action.finished_at is not None
        assert signalled <= action.finished_at.timestamp() - 2.5
    # No resize inside the cooldown, never below min.
    gap = (shrinks[1].created_at - shrinks[0].finished_at).total_seconds()  # type: ignore[operator]
    assert gap >= 15 - 0.5
    # The freed nodes are idle again.
    rec = cluster.job(job)
    assert rec is not None
    (kept,) = rec.nodes
    wait_until("freed nodes idle", lambda: all(
        s == "idle" for n, s in _node_states(cluster).items() if n != kept), 30)


def _node_states(cluster: TestCluster) -> dict[str, str]:
    cp = cluster.run(["sinfo", "-h", "-N", "-n", ",".join(cluster.nodes), "-o", "%N %T"])
    return {line.split()[0]: line.split()[1] for line in cp.stdout.splitlines() if line.strip()}


def test_busy_job_grows_to_max_with_extension_jobs_as_its_owner(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    marker = marker_file(cluster)
    job = cluster.submit(elastic_script(90, DIRECTIVES, marker), "-N1", "--gres=gpu:2", "--time=60", user="alice")
    cluster.wait_state(job, {"RUNNING"})
    with running_controller(cluster, controller_config(tmp_path, stack)) as ctl:
        wait_until("two running extension jobs", lambda: sum(
            1 for e in extensions_of(cluster, job) if e.state == "RUNNING") == 2, 150, ctl)
        grows = ctl.wait_applied(job, ActionKind.GROW, 2)
        # Past the cooldown (the hold turns from COOLDOWN to AT_MAX), then a few more cycles: no third extension.
        wait_until("the cooldown to end at max", lambda: any(
            d.reason == "AT_MAX" and d.time > (grows[1].finished_at or grows[1].created_at)
            for d in ctl.decisions(job)), 60, ctl)
        ctl.wait_cycles(3)
        assert len(extensions_of(cluster, job)) == 2
        decisions = ctl.decisions(job)
    assert len(grows) == 2
    exts = extensions_of(cluster, job)
    for e in exts:
        assert e.user == "alice" and e.account == "nlp" and e.partition == "train"
        assert e.gpus_per_node() == 2 and e.name == f"elastic-ext-{job}"
    starts = [line for line in marker.read_text().splitlines() if "role=extension" in line]
    assert len(starts) == 2 and all(f"parent={job}" in s for s in starts)
    assert decisions[-1].action == "hold" and decisions[-1].reason == "AT_MAX"
    after_max = [d for d in decisions if d.time > grows[1].created_at]
    assert after_max and all(d.action == "hold" and d.reason in {"COOLDOWN", "AT_MAX"} for d in after_max)
    gap = (grows[1].created_at - grows[0].finished_at).total_seconds()  # type: ignore[operator]
    assert gap >= 15 - 0.5
    assert max(d.target_nodes or 0 for d in decisions) <= 3


def test_dry_run_records_decisions_and_leaves_slurm_alone(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    marker = marker_file(cluster)
    job = cluster.submit(elastic_script(10, DIRECTIVES, marker), "-N2", "--gres=gpu:1", "--time=60", user="bob")
    cluster.wait_state(job, {"RUNNING"})
    with running_controller(cluster, controller_config(tmp_path, stack, dry_run=True)) as ctl:
        wait_until("a dry-run shrink decision", lambda: any(
            d.action == "shrink" and d.dry_run for d in ctl.decisions(job)), 90, ctl)
        ctl.wait_cycles(3)  # longer than the grace a live shrink would wait before taking the node
        assert ctl.actions() == []
    assert node_count(cluster, job) == 2
    assert "grace" not in marker.read_text()


def test_het_job_gpu_component_shrinks(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    marker = marker_file(cluster)
    directives = ("#ELASTIC --het-group 1 --min-nodes 1 --max-nodes 2 --window 10s --cooldown 15s --grace 3s "
                  "--signal USR2")
    script = elastic_script(10, directives, marker, het=True)
    cp = cluster.run(["sbatch", "--parsable", "--chdir=/tmp", f"--output={cluster.jobs_dir}/%j.out", "-N1",
                      "--time=60", ":", "-N2", "--gres=gpu:2", "--time=60"], user="alice", input_text=script)
    assert cp.returncode == 0, cp.stderr
    leader = int(cp.stdout.strip().split(";")[0])
    cluster.wait_state(leader, {"RUNNING"})
    comp_id = next(j.job_id for j in cluster.jobs() if j.het_job_id == leader and j.het_job_offset == 1)
    assert node_count(cluster, comp_id) == 2
    with running_controller(cluster, controller_config(tmp_path, stack)) as ctl:
        wait_until("the GPU component to shrink to 1 node", lambda: node_count(cluster, comp_id) == 1, 120, ctl)
        shrinks = ctl.wait_applied(comp_id, ActionKind.SHRINK, 1)
    assert [(a.params["from"], a.params["to"]) for a in shrinks] == [(2, 1)]
    assert node_count(cluster, leader) == 1  # the other component is untouched


def test_silent_agent_causes_no_shrink(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    marker = marker_file(cluster)
    job = cluster.submit(elastic_script(10, DIRECTIVES, marker), "-N2", "--gres=gpu:1", "--time=60",
                         "--nodelist=n3,n4", user="bob")
    cluster.wait_state(job, {"RUNNING"})
    silent = stack.procs["n4"]
    os.kill(silent.pid, signal.SIGSTOP)
    try:
        with running_controller(cluster, controller_config(tmp_path, stack)) as ctl:
            wait_until("a decision on the job", lambda: len(ctl.decisions(job)) >= 1, 90, ctl)
            # holds are stored when they change: eight more cycles, not eight rows, show nothing was acted on
            ctl.wait_cycles(8, timeout=90)
            decisions = ctl.decisions(job)
            assert ctl.actions(job) == []
    finally:
        os.kill(silent.pid, signal.SIGCONT)
    assert node_count(cluster, job) == 2
    assert {d.reason for d in decisions} <= {"NO_METRICS", "STALE_METRICS", "WINDOW_NOT_FILLED", "TOO_FEW_SAMPLES"}


@pytest.mark.parametrize("crash_at", ["grow:after-intent", "grow:after-submit"])
def test_sigkill_between_intent_and_outcome_reconciles_without_duplicates(
        stack: Agents, tmp_path: Path, crash_at: str) -> None:
    cluster = stack.cluster
    marker = marker_file(cluster)
    directives = "#ELASTIC --min-nodes 1 --max-nodes 2 --window 10s --cooldown 15s --grace 3s --signal USR2"
    job = cluster.submit(elastic_script(90, directives, marker), "-N1", "--gres=gpu:2", "--time=60", user="alice")
    cluster.wait_state(job, {"RUNNING"})
    cfg = controller_config(tmp_path, stack)
    with running_controller(cluster, cfg, crash_at=crash_at) as ctl:
        wait_until("the controller to die at the crash point", lambda: ctl.proc.poll() is not None, 90)
        assert ctl.proc.returncode == -signal.SIGKILL
        crashed = ctl.actions(job)
    assert [a.state for a in crashed] == [ActionState.INTENT if crash_at.endswith("intent")
                                          else ActionState.IN_PROGRESS]
    with running_controller(cluster, cfg) as ctl:
        wait_until("one running extension job", lambda: len(extensions_of(cluster, job)) == 1
                   and all(a.state not in {ActionState.INTENT, ActionState.IN_PROGRESS} for a in ctl.actions(job)),
                   90, ctl)
        ctl.wait_cycles(3)  # a few more cycles: no second extension for the same key
        actions = ctl.actions(job)
        exts = extensions_of(cluster, job)
        # When the leader ends, reconcile cancels its extension: no orphan.
        cluster.cancel(job)
        wait_until("the extension to go with its leader (no orphan)", lambda: not extensions_of(cluster, job), 60,
                   ctl)
    assert len(exts) == 1  # no duplicate
    first = actions[0]
    if crash_at == "grow:after-submit":  # the extension existed: reconcile found it by its key
        assert first.state == ActionState.APPLIED and "reconciled" in first.message
        assert parse_tag(exts[0].comment).key == first.idempotency_key  # type: ignore[union-attr]
    else:  # nothing was submitted: aborted, and a later cycle grew anew
        assert first.state == ActionState.ABORTED
        assert any(a.state == ActionState.APPLIED for a in actions[1:])
    assert all(a.state in {ActionState.APPLIED, ActionState.ABORTED} for a in actions)


def torchrun_test_script(cluster: TestCluster) -> str:
    """The real torchrun template with test-sized directives, plus a virtual-GPU load at 90% on every node
    (torch runs on CPU here, so the GPU signal comes from the workload helper)."""
    from tests.cluster.agents_harness import JOB_PYTHON, REPO

    text = (REPO / "sbatch_templates" / "torchrun_elastic.sbatch").read_text()
    lines = [ln for ln in text.splitlines() if not ln.startswith("#ELASTIC")]
    head, body = lines[: lines.index("set -u")], lines[lines.index("set -u"):]
    load = (f"export PYTHONPATH={REPO} SLURM_ELASTIC_VGPU_DIR={cluster.root / 'vgpu'}\n"
            f"srun --overlap --kill-on-bad-exit=0 --ntasks-per-node=1 {JOB_PYTHON} "
            "-m slurm_elastic.testing.vgpu.workload --util 90 --mem-mib 500 &")
    # torch runs on the CPU here: one worker per node, not one per (virtual) GPU
    return "\n".join([*head, DIRECTIVES, "export SLURM_ELASTIC_MIN_NODES=1 SLURM_ELASTIC_MAX_NODES=3",
                      "export SLURM_ELASTIC_NPROC_PER_NODE=1", load,
                      *body]) + "\n"


def test_torchrun_workers_join_the_rendezvous_as_the_job_grows(stack: Agents, tmp_path: Path) -> None:
    from tests.cluster.agents_harness import REPO

    cluster = stack.cluster
    jobs_python = REPO / ".venv-jobs" / "bin"
    assert (jobs_python / "python3").exists(), "scripts/bootstrap builds .venv-jobs with torch"
    env_path = f"{jobs_python}:/usr/local/bin:/usr/bin:/bin"
    script = torchrun_test_script(cluster)
    # The user's own working directory (notices, checkpoints), new for every run: the jobs dir outlives test runs.
    work = Path(tempfile.mkdtemp(prefix="work-torchrun-", dir=cluster.jobs_dir))
    shutil.copy(REPO / "sbatch_templates" / "train_elastic.py", work / "train_elastic.py")
    shutil.chown(work, "alice")
    cp = cluster.run(["env", f"PATH={env_path}", "sbatch", "--parsable", f"--chdir={work}",
                      f"--output={cluster.jobs_dir}/%j.out", "-N1", "--gres=gpu:2", "--time=60"],
                     user="alice", input_text=script)
    assert cp.returncode == 0, cp.stderr
    job = int(cp.stdout.strip())
    cluster.wait_state(job, {"RUNNING"})
    cfg = controller_config(tmp_path, stack)
    cfg.write_text(cfg.read_text().replace('PATH = "/usr/local/bin:/usr/bin:/bin"', f'PATH = "{env_path}"'))

    def world_sizes() -> set[int]:
        sizes: set[int] = set()
        for out in cluster.jobs_dir.glob("*.out"):
            for line in out.read_text(errors="replace").splitlines():
                if line.startswith("rendezvous world_size=") and f"elastic-{job}" not in line:
                    sizes.add(int(line.split()[1].split("=")[1]))
        return sizes

    with running_controller(cluster, cfg) as ctl:
        wait_until("two running extension jobs", lambda: sum(
            1 for e in extensions_of(cluster, job) if e.state == "RUNNING") == 2, 180, ctl)
        wait_until("a rendezvous of 3 members", lambda: 3 in world_sizes(), 180, ctl)
    leader_out = (cluster.jobs_dir / f"{job}.out").read_text(errors="replace")
    assert "rendezvous world_size=1" in leader_out  # it started alone, then re-formed as the job grew


def test_sighup_reloads_or_refuses_and_sigterm_exits_cleanly(stack: Agents, tmp_path: Path) -> None:
    cfg = controller_config(tmp_path, stack)
    with running_controller(stack.cluster, cfg) as ctl:
        wait_until("the controller to start", lambda: "started" in ctl.log_text(), 30, ctl)
        good = cfg.read_text()
        cfg.write_text(good.replace("interval_s = 2.0", "interval_s = -5"))
        ctl.proc.send_signal(signal.SIGHUP)
        wait_until("the bad config to be refused", lambda: "reload refused" in ctl.log_text(), 30, ctl)
        assert ctl.proc.poll() is None  # still running on the old config
        cfg.write_text(good)
        ctl.proc.send_signal(signal.SIGHUP)
        wait_until("the config to be reloaded", lambda: "reloaded config" in ctl.log_text(), 30, ctl)
        ctl.proc.send_signal(signal.SIGTERM)
        assert ctl.proc.wait(timeout=30) == 0
    assert "controller stopped" in ctl.log_text()
