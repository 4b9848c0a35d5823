"""GPU-granular growth on the real cluster (gpu_granular_growth, policy/gpugrain.py): a torchrun job (the shipped
torchrun_elastic.sbatch, one worker per GPU its task holds) on 2 GPUs of n1 is grown by 2 GPUs onto n2, a node
another job holds half of, trains there at world size 4 with no step repeated, then gives those 2 GPUs back by
the extension's cancellation and trains on at world 2.

The other nodes are full (rigid jobs on n3 and n4), so no whole node is free: only a GPU-granular grow can happen.
torch runs on the CPU here; the job's GPUs are the cluster's device files, one worker per GPU Slurm gave it
(SLURM_GPUS_ON_NODE), which is what the test checks at each size.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm_elastic.store.records import ActionKind
from tests.cluster.agents_harness import REPO, Agents
from tests.cluster.controller_harness import (
    controller_config,
    node_count,
    running_controller,
    set_util,
    user_workdir,
    wait_until,
)
from tests.cluster.test_controller_e2e import extensions_of
from tests.cluster.test_resize_templates import DIRECTIVES as RESIZE_DIRECTIVES
from tests.cluster.test_resize_templates import repeated_steps, template_script, training_log
from tests.policy_text import CLUSTER, policy_text

pytestmark = pytest.mark.cluster

DIRECTIVES = ("#ELASTIC --min-nodes 1 --max-nodes 2 --step 1 --scale-up-above 80 --scale-down-below 40 "
              "--window 10s --cooldown 2s --grace 30s --signal USR1")
TRAIN_ARGS = "--step-seconds 0.1 --checkpoint-every 1000000"


def test_torchrun_job_grows_by_two_gpus_on_a_shared_node_and_gives_them_back(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    t0 = time.monotonic()
    hold = "#!/bin/bash\nsleep 900\n"
    fillers = [cluster.submit(hold, "-w", "n3", "--gres=gpu:4", "--time=15", user="bob"),
               cluster.submit(hold, "-w", "n4", "--gres=gpu:4", "--time=15", user="bob")]
    other = cluster.submit(hold, "-w", "n2", "--gres=gpu:2", "--time=15", user="bob")  # half of n2
    for j in (*fillers, other):
        cluster.wait_state(j, {"RUNNING"})
    work, util = user_workdir(cluster, ["train_elastic.py"], 60)
    # The template as shipped: one worker per GPU (the resize test's one-per-node override is taken out).
    script = template_script("torchrun_elastic.sbatch", cluster, util)
    script = script.replace("export SLURM_ELASTIC_NPROC_PER_NODE=1", "true")
    script = script.replace(RESIZE_DIRECTIVES, DIRECTIVES)
    env_path = f"{REPO / '.venv-jobs' / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    cp = cluster.run(["env", f"PATH={env_path}", f"PYTHONPATH={REPO}", f"SLURM_ELASTIC_TRAIN_ARGS={TRAIN_ARGS}",
                      "sbatch", "--parsable", f"--chdir={work}", f"--output={cluster.jobs_dir}/%j.out", "-N1",
                      "-w", "n1", "--gres=gpu:2", "--time=15"], user="alice", input_text=script)
    assert cp.returncode == 0, cp.stderr
    job = int(cp.stdout.strip())
    out = cluster.jobs_dir / f"{job}.out"

    def progressed(past: int, world: str) -> bool:
        return any(s > past and w == world for s, w in training_log(out)[0])

    def last_step() -> int:
        return max((s for s, _ in training_log(out)[0]), default=0)

    try:
        cluster.wait_state(job, {"RUNNING"})
        cfg = controller_config(tmp_path, stack)
        cfg.write_text(cfg.read_text().replace('PATH = "/usr/local/bin:/usr/bin:/bin"', f'PATH = "{env_path}"'))
        (tmp_path / "policy.toml").write_text(policy_text(CLUSTER, gpu_granular_growth=True))
        with running_controller(cluster, cfg) as ctl:
            wait_until("training at world 2 (2 GPUs, 2 workers)", lambda: progressed(5, "2"), 120, ctl)
            set_util(util, 100)  # grow: no whole node is free, so +2 GPUs on n2
            wait_until("a running extension job", lambda: any(
                e.state == "RUNNING" for e in extensions_of(cluster, job)), 120, ctl)
            (ext,) = extensions_of(cluster, job)
            mark = last_step()
            wait_until("training at world 4 on the shared node", lambda: progressed(mark, "4"), 120, ctl)
            wait_until("10 steps at world 4", lambda: progressed(mark + 10, "4"), 120, ctl)
            other_state = cluster.job_state(other)
            set_util(util, 0)  # shrink: the extension's 2 GPUs go back
            wait_until("the extension to go", lambda: not extensions_of(cluster, job), 120, ctl)
            mark = last_step()
            wait_until("training at world 2 again", lambda: progressed(mark + 10, "2"), 120, ctl)
            (grow,) = ctl.applied(job, ActionKind.GROW)
            (shrink,) = ctl.wait_applied(job, ActionKind.SHRINK, 1)
            decision = next(d for d in ctl.decisions(job) if d.action == "grow")
        assert ext.nodes == ("n2",) and [str(g) for g in ext.gres_per_node if g.name == "gpu"] == ["gpu:2"], ext
        assert other_state == "RUNNING"  # n2 was shared: the other job's 2 GPUs stayed its own
        assert (grow.params["from"], grow.params["to"], grow.params["nodes"]) == (1, 2, ["n2"])
        assert grow.gpus == 2
        assert decision.inputs["grow_gpus"] == 2 and "+2 GPU(s) on n2" in decision.message
        assert (shrink.params["from"], shrink.params["to"]) == (2, 1)
        assert cluster.job_state(job) == "RUNNING" and node_count(cluster, job) == 1
        text = out.read_text(errors="replace")
        assert "workers/node=2" in text, text[-3000:]  # one worker per GPU, leader and extension alike
        lost = repeated_steps(out)
        assert len(lost) >= 2, text[-3000:]  # the grow and the shrink each restarted the workers
        assert lost == [0] * len(lost), f"steps repeated after a resize: {lost}\n{text[-3000:]}"
        print(f"\nGPU-granular cluster test: steps repeated per restart {lost}; {time.monotonic() - t0:.0f}s")
    finally:
        cluster.cancel(job, *fillers, other)
