"""Adaptive batch size on the real cluster: torchrun_elastic.sbatch running train_adaptive.py (as the user, CPU
gloo, a tiny model) opts in, publishes its gradient statistics and step times, and after the controller grows it
from 1 to 2 nodes restarts with a different batch plan, read from slurm_elastic.goodput.batch_plan: the plan at
2 nodes is the one the shared model computes from what the job had published, and its learning-rate factor is
the sqrt rule's. The choice of the plan itself is tested in tests/unit/test_batchsize.py.
"""

from __future__ import annotations

import math
import re
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
from tests.cluster.test_resize_templates import template_script

pytestmark = pytest.mark.cluster

DIRECTIVES = ("#ELASTIC --min-nodes 1 --max-nodes 2 --step 1 --scale-up-above 80 --scale-down-below 40 "
              "--window 10s --cooldown 2s --grace 30s --signal USR1")
TRAIN_ARGS = "--sample-seconds 0.002 --noise 30 --checkpoint-every 1000000"
PLAN_RE = re.compile(r"^batch_plan world=(\d+) local_batch=(\d+) accum_steps=(\d+) global_batch=(\d+) "
                     r"lr_factor=(\S+) basis=(.+)$")


def plans(out: Path) -> list[tuple[int, int, int, int, float, str]]:
    text = out.read_text(errors="replace") if out.exists() else ""
    return [(int(m[1]), int(m[2]), int(m[3]), int(m[4]), float(m[5]), m[6].strip())
            for ln in text.splitlines() if (m := PLAN_RE.match(ln))]


def test_job_restarts_with_a_new_batch_plan_after_a_grow(stack: Agents, tmp_path: Path) -> None:
    from slurm_elastic.goodput import parse_records, plan_for, read_state

    cluster = stack.cluster
    # between the thresholds until the job has published its statistics
    work, util = user_workdir(cluster, ["train_elastic.py", "train_adaptive.py"], 60)
    script = template_script("torchrun_elastic.sbatch", cluster, util)
    script = re.sub(r"^#ELASTIC .*$", DIRECTIVES, script, count=1, flags=re.M)
    env_path = f"{REPO / '.venv-jobs' / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    started = time.monotonic()
    cp = cluster.run(["env", f"PATH={env_path}", f"PYTHONPATH={REPO}", f"SLURM_ELASTIC_TRAIN_ARGS={TRAIN_ARGS}",
                      f"SLURM_ELASTIC_TRAIN_SCRIPT={work / 'train_adaptive.py'}", "sbatch", "--parsable",
                      f"--chdir={work}", f"--output={cluster.jobs_dir}/%j.out", "-N1", "--gres=gpu:1", "--time=30"],
                     user="alice", input_text=script)
    assert cp.returncode == 0, cp.stderr
    job = int(cp.stdout.strip())
    out = cluster.jobs_dir / f"{job}.out"
    stats_file = work / ".slurm-elastic" / f"gradstats-{job}.jsonl"

    def published_at_one_node() -> bool:
        return stats_file.exists() and any(r.get("nodes") == 1 and "grad_sqr" in r
                                           for r in parse_records(stats_file.read_bytes()))

    cluster.wait_state(job, {"RUNNING"})
    cfg = controller_config(tmp_path, stack)
    cfg.write_text(cfg.read_text().replace('PATH = "/usr/local/bin:/usr/bin:/bin"', f'PATH = "{env_path}"'))
    with running_controller(cluster, cfg) as ctl:
        wait_until("the first plan and statistics at 1 node", lambda: bool(plans(out)) and published_at_one_node(),
                   120, ctl)
        records_before = parse_records(stats_file.read_bytes())
        set_util(util, 100)  # grow 1 -> 2 with one extension job
        wait_until("a plan at world 2", lambda: any(p[0] == 2 for p in plans(out)), 150, ctl)
        grows = ctl.applied(job, ActionKind.GROW)
        assert node_count(cluster, job) == 1  # the leader keeps its node; the second comes as an extension job
    elapsed = time.monotonic() - started
    text = out.read_text(errors="replace")
    got = plans(out)
    first = got[0]
    second = next(p for p in got if p[0] == 2)
    assert first[0] == 1 and first[5] == "initial batch" and first[3] == 32, text[-3000:]
    assert [(a.params["from"], a.params["to"]) for a in grows] == [(1, 2)]
    # the restart read a different plan, computed by the shared model from what the job had published
    assert second[5] == "goodput", text[-3000:]
    assert (second[1], second[2]) != (first[1], first[2])
    assert second[3] == second[1] * 2 * (second[2] + 1)
    assert second[4] == pytest.approx(math.sqrt(second[3] / 32), abs=1e-3)
    state = read_state(records_before, 1)
    assert state is not None and state.stats is not None
    want = plan_for(state, 2, 1)
    assert want is not None
    # statistics published between the snapshot and the restart may move the choice by a grid step at most
    assert want.global_batch / 2 <= second[3] <= want.global_batch * 2, (want, second)
    print(f"adaptive batch: plans {got}; the whole test {elapsed:.0f}s")
