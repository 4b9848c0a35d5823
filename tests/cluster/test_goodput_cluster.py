"""Goodput on the real cluster: a busy job publishes a FLAT throughput (the same samples/s at any size) with the
documented bash one-liner; the controller grows it once (nothing is known above 1 node yet), measures no gain at
2 nodes, shrinks it back, and does not grow it again. The linear case is tests/unit/test_controller_goodput.py."""

from __future__ import annotations

import json
import os
import pwd
import uuid
from pathlib import Path

import pytest

from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.store.records import ActionKind
from tests.cluster.agents_harness import JOB_PYTHON, REPO, Agents
from tests.cluster.controller_harness import controller_config, node_count, running_controller, wait_until
from tests.cluster.harness import TestCluster
from tests.policy_text import CLUSTER, policy_text

pytestmark = pytest.mark.cluster

COOLDOWN_S = 15
DIRECTIVES = (f"#ELASTIC --min-nodes 1 --max-nodes 3 --window 10s --cooldown {COOLDOWN_S}s --grace 3s "
              "--signal USR2")
CYCLES_AFTER = 5
GOODPUT_POLICY = policy_text(CLUSTER, goodput=True, min_throughput_samples=3)


def flat_script(cluster: TestCluster, samples_per_s: float) -> str:
    """The leader (not its extension jobs) appends one report a second, unlabelled, whatever its size; the
    publisher ignores the grace signal (scancel --full reaches every process of the job)."""
    return f"""#!/bin/bash
{DIRECTIVES}
export PYTHONPATH={REPO}
export SLURM_ELASTIC_VGPU_DIR={cluster.root / "vgpu"}
trap 'echo "grace $(date +%s.%N)"' USR2
if [ -z "${{SLURM_ELASTIC_ROLE:-}}" ]; then
  f="$PWD/.slurm-elastic/goodput-$SLURM_JOB_ID.jsonl"; mkdir -p "${{f%/*}}"
  ( trap '' USR2
    while :; do printf '{{"time":%s,"samples_per_s":{samples_per_s}}}\\n' "$(date +%s.%N)" >> "$f"; sleep 1; done ) &
fi
srun --kill-on-bad-exit=0 --ntasks-per-node=1 {JOB_PYTHON} -m slurm_elastic.vgpu.workload --util 90 --mem-mib 500 &
child=$!
while kill -0 $child 2>/dev/null; do wait $child; done
sleep 600
"""


def running_extensions(cluster: TestCluster, leader: int) -> int:
    jobs = cluster.squeue_json()["jobs"]
    assert isinstance(jobs, list)
    return sum(1 for j in jobs if (tag := parse_tag(str(j.get("comment") or ""))) and tag.parent == leader
               and j.get("job_state") in {"RUNNING", "PENDING"})


def test_flat_throughput_grows_once_then_shrinks_back_and_stays(agents: Agents, clean_cluster: TestCluster,
                                                                 tmp_path: Path) -> None:
    cluster = clean_cluster
    alice = pwd.getpwnam("alice")
    work = cluster.jobs_dir / f"goodput-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    os.chown(work, alice.pw_uid, alice.pw_gid)
    cfg = controller_config(tmp_path, agents)
    (tmp_path / "policy.toml").write_text(GOODPUT_POLICY)
    job = cluster.submit(flat_script(cluster, 800.0), "-N1", "--gres=gpu:2", "--time=60", f"--chdir={work}",
                         user="alice")
    cluster.wait_state(job, {"RUNNING"})
    published = work / ".slurm-elastic" / f"goodput-{job}.jsonl"
    with running_controller(cluster, cfg) as ctl:
        wait_until("the job to grow to 2 nodes", lambda: node_count(cluster, job) + running_extensions(
            cluster, job) >= 2, 120, ctl)
        wait_until("the shrink back to 1 node", lambda: ctl.applied(job, ActionKind.SHRINK)
                   and running_extensions(cluster, job) == 0 and node_count(cluster, job) == 1, 120, ctl)
        (shrink,) = ctl.applied(job, ActionKind.SHRINK)
        assert shrink.finished_at is not None
        # Past the cooldown after the shrink back (the hold leaves COOLDOWN), then cycle after cycle: the job stays
        # at 1 node, no new grow (a regrow would be decided in the first cycle past the cooldown).
        wait_until("the cooldown after the shrink back to end", lambda: shrink.finished_at is not None and any(
            d.time > shrink.finished_at and d.reason not in {"COOLDOWN", "ACTION_IN_PROGRESS"}
            for d in ctl.decisions(job)), 2 * COOLDOWN_S + 30, ctl)
        for _ in range(CYCLES_AFTER):
            ctl.wait_cycles(1)
            assert node_count(cluster, job) == 1 and running_extensions(cluster, job) == 0
        grows = ctl.applied(job, ActionKind.GROW)
        decisions = ctl.decisions(job)
    t0 = decisions[0].time
    for d in decisions:  # the timeline, for the record (pytest -s)
        if d.action != "hold" or d.id == decisions[-1].id:
            print(f"+{(d.time - t0).total_seconds():5.1f}s {d.action} {d.current_nodes}->{d.target_nodes} "
                  f"{d.reason} basis={d.inputs.get('basis')}: {d.message}")
    assert len(grows) == 1 and (grows[0].params["from"], grows[0].params["to"]) == (1, 2)
    assert len(ctl.applied(job, ActionKind.SHRINK)) == 1
    acts = [d for d in decisions if d.action != "hold"]
    assert [(d.action, d.current_nodes, d.target_nodes, d.reason) for d in acts] == [
        ("grow", 1, 2, "OVERUTILIZED"), ("shrink", 2, 1, "LOW_MARGINAL_EFFICIENCY")]
    grow_d, shrink_d = acts
    assert grow_d.inputs["basis"] == "utilization"  # no throughput known above 1 node yet
    assert shrink_d.inputs["basis"] == "throughput"
    assert shrink_d.inputs["marginal_efficiency_last"] == pytest.approx(0.0, abs=1e-9)
    assert shrink_d.inputs["throughput"] == pytest.approx(800.0)
    assert "marginal efficiency 0.00 < 0.50; shrink back" in shrink_d.message
    # After the shrink back, past the cooldown, the measured next step holds it at 1 node: the hold stands through
    # CYCLES_AFTER cycles (holds are stored when they change, so it may be one row).
    later = [d for d in decisions if d.id > shrink_d.id and d.reason not in {"COOLDOWN", "ACTION_IN_PROGRESS"}]
    assert later, [(d.action, d.reason) for d in decisions[-10:]]
    assert all(d.action == "hold" and d.reason == "LOW_MARGINAL_EFFICIENCY" for d in later)
    assert decisions[-1].id == later[-1].id  # the standing hold
    assert later[-1].inputs["basis"] == "throughput" and later[-1].inputs["marginal_efficiency_next"] == 0.0
    # The file is the job's own (the controller read it as such) and well-formed JSON lines.
    assert published.stat().st_uid == alice.pw_uid
    assert all(json.loads(line)["samples_per_s"] == 800.0 for line in published.read_text().splitlines())
