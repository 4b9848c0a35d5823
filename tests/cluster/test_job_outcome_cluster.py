"""A job that trains to its end across a shrink of one of its own nodes ends COMPLETED in Slurm's accounting, and
``report`` counts it completed.

Slurm kills the job's task on the released node (``srun: error: n2: task 1: Killed``) and srun exits 137 however
training ended; before the templates ended with ``launch outcome`` the batch script passed that on and sacct said
FAILED 9:0 for a job that finished (docs/slurm-facts.md). The shipped minimal template (standard library only, so
it runs on every release cluster) trains 400 steps of 0.1 s on 2 nodes; the real controller over real agents
shrinks it to 1 (the utilization stays at 0) well before the end, and the job then runs to its last step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastic.report import group_row, job_facts
from slurm_elastic.sim.loaders.sacct import parse_accounting
from slurm_elastic.slurm.accounting import REPORT_FIELDS
from slurm_elastic.store.records import ActionKind
from tests.cluster.agents_harness import REPO, Agents
from tests.cluster.controller_harness import (
    controller_config,
    node_count,
    running_controller,
    user_workdir,
    wait_until,
)
from tests.cluster.harness import RELEASE
from tests.cluster.test_resize_templates import template_script

pytestmark = pytest.mark.cluster

DIRECTIVES = ("#ELASTIC --min-nodes 1 --max-nodes 2 --scale-up-above 80 --scale-down-below 40 "
              "--window 10s --cooldown 2s --grace 30s --signal USR1")
STEPS = 400
TRAIN_ARGS = f"--step-seconds 0.1 --steps {STEPS} --checkpoint-every 1000000"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def sacct_rows(stack: Agents, job: int) -> list[str]:
    cp = stack.cluster.run(["sacct", "-X", "-P", "-n", "-j", str(job), "-o", "JobID,State,ExitCode"])
    return [ln for ln in cp.stdout.splitlines() if ln.strip()]


def test_a_job_that_trains_to_its_end_across_a_shrink_of_its_own_node_completes(
        stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    # below --scale-down-below from the start: the first full window shrinks 2 -> 1
    work, util = user_workdir(cluster, ["train_minimal.py"], 0)
    script = "\n".join(DIRECTIVES if ln.startswith("#ELASTIC") else ln  # the template's, with this test's sizes
                       for ln in template_script("minimal.sbatch", cluster, util).splitlines()) + "\n"
    # A release cluster's client commands are its wrappers (tests/cluster/harness.py), in the job too (srun).
    path = ("" if RELEASE == "22.05" else f"{cluster.root / 'bin'}:") + "/usr/local/bin:/usr/bin:/bin"
    cp = cluster.run(["env", f"PATH={path}", f"PYTHONPATH={REPO}",
                      f"SLURM_ELASTIC_TRAIN_ARGS={TRAIN_ARGS}", "sbatch", "--parsable", f"--chdir={work}",
                      f"--output={cluster.jobs_dir}/%j.out", "-N2", "--gres=gpu:1", "--time=10"],
                     user="alice", input_text=script)
    assert cp.returncode == 0, cp.stderr
    job = int(cp.stdout.strip())
    out = cluster.jobs_dir / f"{job}.out"
    cluster.wait_state(job, {"RUNNING"})
    with running_controller(cluster, controller_config(tmp_path, stack)) as ctl:
        wait_until("the leader to shrink to 1 node", lambda: node_count(cluster, job) == 1, 120, ctl)
        shrink = ctl.wait_applied(job, ActionKind.SHRINK, 1)[0]
        text = out.read_text(errors="replace")
        assert f"training done at step {STEPS}" not in text, (
            "training ended before the shrink (this machine too slow for the test's 40 s of training?)")
        # The job ends by itself: Slurm keeps an ended job out of squeue, so its end is read from sacct.
        wait_until(f"job {job} to end", lambda: any(r.split("|")[1].split()[0] in ENDED
                                                   for r in sacct_rows(stack, job)), 120, ctl)
    text = out.read_text(errors="replace")
    assert (shrink.params["from"], shrink.params["to"], len(shrink.params["released_nodes"])) == (2, 1, 1)
    assert f"training done at step {STEPS}" in text, text[-3000:]
    # The task on the released node was killed and srun failed for it: the outcome line says why it is no failure.
    assert "only because Slurm killed the task(s) on" in text and "the job exits 0" in text, text[-3000:]
    rows = sacct_rows(stack, job)
    final = rows[-1].split("|")  # a resized job's earlier records are RESIZING
    assert final[1:] == ["COMPLETED", "0:0"], rows
    # report counts it completed: the same parser and figures as `slurm-elastic report`.
    export = cluster.run(["sacct", "-X", "-P", "-j", str(job), "-o", ",".join(REPORT_FIELDS)], check=True).stdout
    jobs, _ = parse_accounting("sacct", export)
    assert [(a.spec.job_id, a.state) for a in jobs] == [(str(job), "COMPLETED")], export
    facts, _ = job_facts(jobs, {"jobs": [{"job": job, "extensions": [], "resizes": [], "util": []}]})
    row = group_row("all", "elastic", facts)
    assert (row["jobs"], row["completed"]) == (1, 1)
