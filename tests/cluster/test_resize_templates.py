"""No training work lost at a resize: each shipped template, run as the user, trains through a shrink that
releases one of the leader's own nodes (2 -> 1), a grow by an extension job (1 -> 3) and a shrink that cancels
it (3 -> 1), driven by the real controller over real agents. The test reads the training log and counts the
steps repeated after each restart (the steps done after the last checkpoint before it): the target is 0.

Small on purpose (CI runs every cluster test on 2 cores): tiny models, 0.1 s steps, a 10 s window, a 2 s
cooldown, utilization swung between 0 and 100 %. The grace period is long (30 s); a shrink goes at the job's
acknowledgement, which the test checks.
"""

from __future__ import annotations

import re
import shutil
import time
import uuid
from pathlib import Path

import pytest

from slurm_elastic.store.records import ActionKind
from tests.cluster.agents_harness import JOB_PYTHON, REPO, Agents
from tests.cluster.controller_harness import controller_config, node_count, running_controller, set_util, wait_until
from tests.cluster.harness import TestCluster
from tests.cluster.test_controller_e2e import extensions_of

pytestmark = pytest.mark.cluster

DIRECTIVES = ("#ELASTIC --min-nodes 1 --max-nodes 3 --step 2 --scale-up-above 80 --scale-down-below 40 "
              "--window 10s --cooldown 2s --grace 30s --signal USR1")
TEMPLATES = {
    "torchrun_elastic.sbatch": ("train_elastic.py", "--step-seconds 0.1 --checkpoint-every 1000000"),
    "dlrm_embedding.sbatch": ("train_dlrm.py",
                              "--step-seconds 0.1 --tables 2 --rows 1000 --batch 32 --checkpoint-every 1000000"),
    "minimal.sbatch": ("train_minimal.py", "--step-seconds 0.1 --checkpoint-every 1000000"),
}
STEP_RE = re.compile(r"^step=(\d+) loss=\S+ world=(\S+)")
RESUMED_RE = re.compile(r"^resumed step=(\d+)")


def template_script(name: str, cluster: TestCluster, util_file: Path, directives: str = DIRECTIVES) -> str:
    """The template as shipped, with test-sized directives and a virtual-GPU load whose utilization the test
    sets (torch runs on CPU here, so the controller's signal comes from the workload helper)."""
    lines = [ln for ln in (REPO / "sbatch_templates" / name).read_text().splitlines()
             if not ln.startswith("#ELASTIC")]
    at = next(i for i, ln in enumerate(lines) if ln.startswith('echo "elastic role='))
    # The load is no part of the template: it ignores the grace signal (scancel --full reaches its tasks too).
    load = (f"export SLURM_ELASTIC_VGPU_DIR={cluster.root / 'vgpu'}\n"
            f"srun --overlap --kill-on-bad-exit=0 --ntasks-per-node=1 bash -c \"trap '' USR1; exec {JOB_PYTHON} "
            f"-m slurm_elastic.testing.vgpu.workload --util 60 --util-file {util_file} --mem-mib 500\" &")
    head = lines.index("set -u")
    cpu = "export SLURM_ELASTIC_NPROC_PER_NODE=1  # torch runs on the CPU here: one worker per node, not per GPU"
    return "\n".join([*lines[:head], directives, cpu, *lines[head:at], load, *lines[at:]]) + "\n"


def training_log(path: Path) -> tuple[list[tuple[int, str]], list[int]]:
    """(step, world) lines and the resumed steps, in the order rank 0 wrote them."""
    steps: list[tuple[int, str]] = []
    resumed: list[int] = []
    text = path.read_text(errors="replace") if path.exists() else ""
    for line in text.splitlines():
        if m := STEP_RE.match(line):
            steps.append((int(m.group(1)), m.group(2)))
        elif m := RESUMED_RE.match(line):
            resumed.append(int(m.group(1)))
    return steps, resumed


def repeated_steps(path: Path) -> list[int]:
    """Per restart: how many steps done before it were done again after it (last step seen - resumed step)."""
    out: list[int] = []
    last = 0
    text = path.read_text(errors="replace") if path.exists() else ""
    for line in text.splitlines():
        if m := STEP_RE.match(line):
            last = max(last, int(m.group(1)))
        elif (m := RESUMED_RE.match(line)) and last > 0:
            out.append(max(0, last - int(m.group(1))))
    return out


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_template_trains_through_grow_and_shrink_without_repeating_steps(
        name: str, stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    train, train_args = TEMPLATES[name]
    work = cluster.jobs_dir / f"work-{uuid.uuid4().hex[:8]}"  # the user's own working directory
    work.mkdir()
    shutil.copy(REPO / "sbatch_templates" / train, work / train)
    shutil.chown(work, "alice")
    util = work / "util"
    set_util(util, 60)  # between the thresholds: no resize until the test says so
    env_path = f"{REPO / '.venv-jobs' / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    cp = cluster.run(["env", f"PATH={env_path}", f"PYTHONPATH={REPO}", f"SLURM_ELASTIC_TRAIN_ARGS={train_args}",
                      "sbatch", "--parsable", f"--chdir={work}", f"--output={cluster.jobs_dir}/%j.out", "-N2",
                      "--gres=gpu:2", "--time=30"], user="alice", input_text=template_script(name, cluster, util))
    assert cp.returncode == 0, cp.stderr
    job = int(cp.stdout.strip())
    out = cluster.jobs_dir / f"{job}.out"
    torch = name != "minimal.sbatch"

    def progressed(past: int, world: str | None = None) -> bool:
        steps, _ = training_log(out)
        return any(s > past and (world is None or w == world) for s, w in steps)

    def last_step() -> int:
        steps, _ = training_log(out)
        return max((s for s, _ in steps), default=0)

    seen_at: dict[str, float] = {}

    def trains_on(what: str, world: str | None) -> None:
        """Training goes on at the new size; when it first stepped at that size is kept (wall clock)."""
        mark = last_step()
        if torch:
            wait_until(f"a step at world {world} ({what})", lambda: progressed(mark, world), 120, ctl)
            seen_at[what] = time.time()
        wait_until(f"training past step {mark + 10} ({what})",
                   lambda: progressed(mark + 10, world if torch else None), 120, ctl)

    cluster.wait_state(job, {"RUNNING"})
    cfg = controller_config(tmp_path, stack)
    cfg.write_text(cfg.read_text().replace('PATH = "/usr/local/bin:/usr/bin:/bin"', f'PATH = "{env_path}"'))
    started = time.monotonic()
    with running_controller(cluster, cfg) as ctl:
        wait_until("training to start", lambda: progressed(10), 120, ctl)
        set_util(util, 0)  # shrink 2 -> 1: one of the leader's own nodes goes
        wait_until("the leader to shrink to 1 node", lambda: node_count(cluster, job) == 1, 120, ctl)
        trains_on("after the shrink", "1")
        set_util(util, 100)  # grow 1 -> 3 with one extension job of 2 nodes
        wait_until("an extension job of 2 nodes", lambda: any(
            e.state == "RUNNING" for e in extensions_of(cluster, job)), 120, ctl)
        trains_on("after the grow", "3")
        set_util(util, 0)  # shrink 3 -> 1: the extension is cancelled
        wait_until("the extension to go", lambda: not extensions_of(cluster, job), 120, ctl)
        trains_on("after the second shrink", "1")
        shrinks = ctl.wait_applied(job, ActionKind.SHRINK, 2)
        grows = ctl.applied(job, ActionKind.GROW)
    elapsed = time.monotonic() - started
    assert cluster.job_state(job) == "RUNNING", out.read_text()[-3000:]  # the job survived every resize
    assert [(a.params["from"], a.params["to"]) for a in shrinks] == [(2, 1), (3, 1)]
    assert [(a.params["from"], a.params["to"]) for a in grows] == [(1, 3)]
    # Both shrinks went at the job's acknowledgement, well inside the 30 s grace period.
    for a in shrinks:
        assert "checkpoint acknowledged after" in a.message, a.message
        assert a.finished_at is not None and (a.finished_at - a.created_at).total_seconds() < 25
    text = out.read_text(errors="replace")
    assert text.count("notice acknowledged") >= 3, text[-3000:]  # two shrinks and the grow
    lost = repeated_steps(out)
    if torch:  # every resize restarts the workers: three restarts after the first start
        assert len(lost) >= 3, text[-3000:]
    if torch:  # decision (the journaled intent) -> first training step at the new size
        took = [seen_at[w] - a.created_at.timestamp() for w, a in (
            ("after the shrink", shrinks[0]), ("after the grow", grows[0]), ("after the second shrink", shrinks[1]))]
        print(f"{name}: decision -> new world size: shrink 2->1 {took[0]:.0f}s, grow 1->3 {took[1]:.0f}s, "
              f"shrink 3->1 {took[2]:.0f}s")
    print(f"{name}: steps repeated per restart {lost}; the whole test {elapsed:.0f}s")
    assert lost == [0] * len(lost), f"steps repeated after a resize: {lost}\n{text[-3000:]}"
