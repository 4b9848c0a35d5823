"""On the real cluster: a shrink raises the job's Slurm time limit (extend_time_limit_on_shrink, on by default).

An underused 3-node job with ``--time=60`` shrinks to 1 node in one step; its TimeLimit, as Slurm reports it,
grows by the remaining time x (3/1 - 1), rounded up to whole minutes, as the decision computed.
"""

from __future__ import annotations

import math
import uuid
from pathlib import Path

import pytest

from slurm_elastic.store.records import ActionKind
from tests.cluster.agents_harness import Agents
from tests.cluster.controller_harness import (
    controller_config,
    elastic_script,
    node_count,
    running_controller,
    wait_until,
)
from tests.cluster.harness import TestCluster

pytestmark = pytest.mark.cluster

DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 3 --step 2 --window 10s --cooldown 15s --grace 3s --signal USR2"


def _time_limit_min(cluster: TestCluster, job: int) -> int:
    rec = cluster.job_record(job)
    assert rec is not None
    return int(str(rec["time_limit"]))


def _scontrol_time_limit(cluster: TestCluster, job: int) -> str:
    out = cluster.run(["scontrol", "-o", "show", "job", str(job)]).stdout
    return next(f.split("=", 1)[1] for f in out.split() if f.startswith("TimeLimit="))


def test_shrink_extends_the_slurm_time_limit(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    marker = cluster.jobs_dir / f"marker-{uuid.uuid4().hex[:8]}"
    marker.touch()
    marker.chmod(0o666)
    job = cluster.submit(elastic_script(10, DIRECTIVES, marker), "-N3", "--gres=gpu:2", "--time=60", user="bob")
    cluster.wait_state(job, {"RUNNING"})
    assert _time_limit_min(cluster, job) == 60
    with running_controller(cluster, controller_config(tmp_path, stack)) as ctl:
        wait_until("the job to shrink to 1 node", lambda: node_count(cluster, job) == 1, 75, ctl)
        (shrink,) = ctl.wait_applied(job, ActionKind.SHRINK, 1)
        decision = next(d for d in ctl.decisions(job) if d.action == "shrink")
    assert (shrink.params["from"], shrink.params["to"]) == (3, 1)
    remaining = float(str(decision.inputs["remaining_s"]))
    add_s = int(shrink.params["time_limit_add_s"])
    # remaining x (3/1 - 1), rounded up to whole minutes (the decision's remaining_s is rounded to 0.1 s)
    assert add_s == decision.inputs["time_limit_add_s"]
    assert math.ceil((remaining - 0.05) * 2 / 60) * 60 <= add_s <= math.ceil((remaining + 0.05) * 2 / 60) * 60
    assert 3000 < remaining < 3600 and 100 * 60 <= add_s <= 120 * 60
    new = 60 + add_s // 60
    assert _time_limit_min(cluster, job) == new  # what Slurm now enforces
    assert _scontrol_time_limit(cluster, job) == f"{new // 60:02d}:{new % 60:02d}:00"
    assert f"time limit 60 -> {new} min (+{add_s // 60}min)" in shrink.message
    assert f"time limit +{add_s // 60}min" in decision.message
