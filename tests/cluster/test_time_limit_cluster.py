"""On the real cluster, the rules that read a job's Slurm time limit.

- A shrink raises the job's Slurm time limit (extend_time_limit_on_shrink, on by default): an underused 3-node
  job with ``--time=60`` shrinks to 1 node in one step; its TimeLimit, as Slurm reports it, grows by the
  remaining time x (3/1 - 1), rounded up to whole minutes, as the decision computed.
- A grow gives it back: the same job, busy again, grows 1 -> 3 and its TimeLimit drops by remaining x (1 - 1/3),
  at most what the shrink added, so it never ends below the 60 minutes asked for; the extension job's limit is
  the leader's new remaining time.
- Restart-cost awareness: of two equally busy jobs, the one whose remaining time can not pay back the restart
  cost holds (RESTART_COST), the one with an hour left grows.
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
    marker_file,
    node_count,
    running_controller,
    set_util,
    util_script,
    wait_until,
)
from tests.cluster.harness import TestCluster
from tests.policy_text import CLUSTER, policy_text

pytestmark = pytest.mark.cluster

DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 3 --step 2 --window 10s --cooldown 15s --grace 3s --signal USR2"


def _time_limit_min(cluster: TestCluster, job: int) -> int:
    rec = cluster.job(job)
    assert rec is not None and rec.time_limit_min is not None
    return rec.time_limit_min


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


def test_a_grow_that_can_not_pay_back_its_restart_is_not_made(stack: Agents, tmp_path: Path) -> None:
    """restart_cost_s = 300: the 10-minute job can gain at most (600 - 300) s x efficiency x 1/1 <= 300 s, so it
    holds; the 60-minute job gains about 3,300 s x efficiency and grows by one node."""
    cluster = stack.cluster
    marker = marker_file(cluster)
    directives = "#ELASTIC --min-nodes 1 --max-nodes 2 --window 10s --cooldown 15s --grace 3s --signal USR2"
    cfg = controller_config(tmp_path, stack)
    (tmp_path / "policy.toml").write_text(policy_text(CLUSTER, restart_cost_aware=True, restart_cost_s=300))
    short = cluster.submit(elastic_script(90, directives, marker), "-N1", "--gres=gpu:2", "--time=10",
                           user="alice")
    long = cluster.submit(elastic_script(90, directives, marker), "-N1", "--gres=gpu:2", "--time=60", user="bob")
    cluster.wait_state(short, {"RUNNING"})
    cluster.wait_state(long, {"RUNNING"})
    with running_controller(cluster, cfg) as ctl:
        (grow,) = ctl.wait_applied(long, ActionKind.GROW, 1, timeout=90)
        wait_until("a RESTART_COST hold of the short job", lambda: any(
            d.reason == "RESTART_COST" for d in ctl.decisions(short)), 60, ctl)
        ctl.wait_cycles(3)  # holds are stored when they change: it stands three cycles later
        assert ctl.applied(short, ActionKind.GROW) == []
        assert ctl.decisions(short)[-1].reason == "RESTART_COST"
        held = [d for d in ctl.decisions(short) if d.reason == "RESTART_COST"]
        grown = next(d for d in ctl.decisions(long) if d.action == "grow")
    assert (grow.params["from"], grow.params["to"]) == (1, 2)
    for d in held:
        assert d.action == "hold" and d.inputs["restart_cost_s"] == 300.0
        assert d.inputs["restart_cost.source"] == "global"
        assert float(str(d.inputs["expected_gain_s"])) <= 300.0
        assert "<= restart cost 300s" in d.message
    assert float(str(grown.inputs["expected_gain_s"])) > 300.0 and grown.inputs["restart_cost_s"] == 300.0


def test_a_regrow_gives_the_added_time_back(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    util_file = cluster.jobs_dir / f"util-{uuid.uuid4().hex[:8]}"
    set_util(util_file, 10)
    job = cluster.submit(util_script(cluster, util_file, DIRECTIVES), "-N3", "--gres=gpu:2", "--time=60",
                         user="bob")
    cluster.wait_state(job, {"RUNNING"})
    with running_controller(cluster, controller_config(tmp_path, stack)) as ctl:
        wait_until("the job to shrink to 1 node", lambda: node_count(cluster, job) == 1, 75, ctl)
        (shrink,) = ctl.wait_applied(job, ActionKind.SHRINK, 1)
        added_min = int(shrink.params["time_limit_add_s"]) // 60
        assert _time_limit_min(cluster, job) == 60 + added_min
        set_util(util_file, 95)
        (grow,) = ctl.wait_applied(job, ActionKind.GROW, 1, timeout=90)
        decision = next(d for d in ctl.decisions(job) if d.action == "grow")
        st = ctl.store()
        try:
            (ext,) = st.jobs.extensions(job, active_only=False)
            rec = st.jobs.get_job(job)
        finally:
            st.close()
        ext_limit = _time_limit_min(cluster, ext.job_id)
    sub_min = int(str(decision.inputs["time_limit_sub_s"])) // 60
    remaining = float(str(decision.inputs["remaining_s"]))
    assert (grow.params["from"], grow.params["to"]) == (1, 3)
    # remaining x (1 - 1/3), whole minutes rounded down, at most what the shrink added
    assert sub_min == min(added_min, int(remaining * 2 / 3 / 60 + 1e-9)) and sub_min > 100
    new = 60 + added_min - sub_min
    assert new >= 60 and _time_limit_min(cluster, job) == new  # what Slurm now enforces
    assert rec is not None and rec.time_limit_added_min == added_min - sub_min
    assert f"time limit {60 + added_min} -> {new} min (-{sub_min}min)" in (grow.message or "")
    assert ext_limit <= int((remaining - sub_min * 60) // 60) + 1  # the extension never outlives the leader
