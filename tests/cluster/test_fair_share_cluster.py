"""Fair share of spare GPUs on the real cluster: weights from Slurm's sshare, decided by the real controller.

alice (account nlp, RawShares 2 -> NormShares 0.5) and bob (account vision, RawShares 1 -> 0.25) each run a busy
elastic job on one node; bob's job runs in QOS high, so Slurm gives it the higher priority and, without fair share,
the priority walk would serve it first and give it every spare node. With ``fair_share = true`` the controller
reads the weights from sshare and:

- A: 2 spare nodes, both jobs asking for 2 (``step = 2``): each account gets exactly one;
- B: 1 spare node: it goes to nlp, the account with the larger share, although bob's job has the higher priority.

Both grow decisions must fall in the same cycle (a unit alone in a cycle has no competitor to share with), so a
dry-run controller first fills both jobs' metric windows in the same store; the live controller then decides both
in its first cycle.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.store.records import DecisionRecord
from tests.cluster.agents_harness import Agents
from tests.cluster.controller_harness import (
    ControllerProcess,
    controller_config,
    elastic_script,
    running_controller,
    wait_until,
)
from tests.cluster.harness import TestCluster
from tests.policy_text import CLUSTER, policy_text

pytestmark = pytest.mark.cluster

DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 4 --window 10s --cooldown 15s --grace 3s --signal USR2"
FAIR_POLICY = policy_text(CLUSTER, step=2, fair_share=True)
HOLDER = "fair-share-test"
# A grow intent shows as a grow, or as the walk's hold when it got no node.
WALK_HOLDS = {"FAIR_SHARE_LIMIT", "NO_FREE_NODES", "PENDING_HIGHER_PRIORITY", "RESERVE_KEPT", "QUOTA_REACHED"}


def _marker(cluster: TestCluster) -> Path:
    path = cluster.jobs_dir / f"marker-{uuid.uuid4().hex[:8]}"
    path.touch()
    path.chmod(0o666)
    return path


def _extensions(cluster: TestCluster, leader: int) -> list[dict[str, object]]:
    jobs = cluster.squeue_json()["jobs"]
    assert isinstance(jobs, list)
    return [j for j in jobs if (tag := parse_tag(str(j.get("comment") or ""))) and tag.parent == leader
            and j.get("job_state") in {"RUNNING", "PENDING"}]


def _ext_nodes(cluster: TestCluster, leader: int) -> int:
    return sum(int(str(e.get("node_count") or 0)) for e in _extensions(cluster, leader))


def _start_jobs(cluster: TestCluster) -> tuple[int, int]:
    """alice's and bob's busy jobs, both running with their workload started."""
    marker = _marker(cluster)
    # All 4 GPUs of a node each (two 2-GPU jobs would share one node and leave 3 spare).
    alice = cluster.submit(elastic_script(90, DIRECTIVES, marker), "-N1", "--gres=gpu:4", "--nodelist=n1",
                           "--time=30", user="alice")
    bob = cluster.submit(elastic_script(90, DIRECTIVES, marker), "-N1", "--gres=gpu:4", "--nodelist=n2",
                         "--time=30", "--qos=high", user="bob")
    for job in (alice, bob):
        cluster.wait_state(job, {"RUNNING"})
    wait_until("both workloads to start", lambda: marker.read_text().count("start ") >= 2, 30)
    jobs = cluster.squeue_json()["jobs"]
    assert isinstance(jobs, list)
    prio = {int(j["job_id"]): int(j["priority"]) for j in jobs if int(j["job_id"]) in (alice, bob)}
    assert prio[bob] > prio[alice], f"bob's job must have the higher Slurm priority: {prio}"
    return alice, bob


def _warm_up(stack: Agents, tmp_path: Path, alice: int, bob: int) -> Path:
    """A dry-run controller until both units would grow in the same cycle; returns the live config."""
    cluster = stack.cluster
    # One holder name for both: the live controller takes the lease over at once.
    dry = controller_config(tmp_path, stack, dry_run=True, holder=HOLDER, name="controller-dry.toml")
    (tmp_path / "policy.toml").write_text(FAIR_POLICY)
    with running_controller(cluster, dry, dry_run=True) as ctl:
        def same_cycle_grows() -> bool:
            grows = [d for d in ctl.decisions() if d.action == "grow" or d.reason in WALK_HOLDS]
            return bool({d.cycle_id for d in grows if d.job_id == alice}
                        & {d.cycle_id for d in grows if d.job_id == bob})
        wait_until("both jobs to want to grow in one dry-run cycle", same_cycle_grows, 90, ctl)
    live = controller_config(tmp_path, stack, holder=HOLDER, name="controller.toml")
    (tmp_path / "policy.toml").write_text(FAIR_POLICY)
    return live


def _live(ctl: ControllerProcess, job: int) -> list[DecisionRecord]:
    return [d for d in ctl.decisions(job) if not d.dry_run]


def _first_growth_cycle(ctl: ControllerProcess, alice: int, bob: int) -> tuple[DecisionRecord, DecisionRecord]:
    decided = [d for d in _live(ctl, alice) + _live(ctl, bob)
               if d.action == "grow" or d.reason in WALK_HOLDS]
    cycle = min(d.cycle_id for d in decided)
    a = next(d for d in _live(ctl, alice) if d.cycle_id == cycle)
    b = next(d for d in _live(ctl, bob) if d.cycle_id == cycle)
    return a, b


def test_two_spare_nodes_one_per_account(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    alice, bob = _start_jobs(cluster)
    live = _warm_up(stack, tmp_path, alice, bob)
    with running_controller(cluster, live) as ctl:
        wait_until("one extension node for each job", lambda: _ext_nodes(cluster, alice) == 1
                   and _ext_nodes(cluster, bob) == 1, 60, ctl)
        ctl.wait_cycles(3)  # a few more cycles: nobody takes more (no spare node is left)
        exts = {job: _extensions(cluster, job) for job in (alice, bob)}
        a, b = _first_growth_cycle(ctl, alice, bob)
    assert [int(str(e["node_count"])) for e in exts[alice]] == [1]
    assert [int(str(e["node_count"])) for e in exts[bob]] == [1]
    assert exts[alice][0]["account"] == "nlp" and exts[bob][0]["account"] == "vision"
    # In one cycle: each got 1 of the 2 wanted, limited by its account's fair share; the weights came from sshare.
    assert (a.action, a.target_nodes, b.action, b.target_nodes) == ("grow", 2, "grow", 2)
    assert "limited by account vision fair share" in b.message and "limited by account nlp fair share" in a.message
    assert a.inputs["account_weight"] == pytest.approx(0.5) and b.inputs["account_weight"] == pytest.approx(0.25)
    assert a.inputs["account_weight.source"] == "account_shares"


def test_one_spare_node_goes_to_the_account_with_more_shares(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    filler = cluster.submit("#!/bin/bash\nsleep 600\n", "-N1", "--gres=gpu:4", "--time=30", "--nodelist=n4")
    cluster.wait_state(filler, {"RUNNING"})
    alice, bob = _start_jobs(cluster)
    live = _warm_up(stack, tmp_path, alice, bob)
    with running_controller(cluster, live) as ctl:
        wait_until("alice's job to get the spare node", lambda: _ext_nodes(cluster, alice) == 1, 60, ctl)
        ctl.wait_cycles(3)  # a few more cycles: bob's job gets no node
        ext_bob = _extensions(cluster, bob)
        a, b = _first_growth_cycle(ctl, alice, bob)
        later_bob = _live(ctl, bob)
    assert ext_bob == []
    assert (a.action, a.target_nodes) == ("grow", 2)
    assert (b.action, b.reason) == ("hold", "FAIR_SHARE_LIMIT")
    assert "account vision has used its fair share" in b.message
    assert b.inputs["fair_share_nodes_left"] == 0 and b.inputs["account_weight"] == pytest.approx(0.25)
    assert a.inputs["account_weight"] == pytest.approx(0.5)
    assert all(d.action != "grow" for d in later_bob)


@pytest.fixture
def vision_gpu_limit(stack: Agents) -> Iterator[int]:
    """Account vision limited to 4 GPUs (GrpTRES) for one test; the limit is removed again afterwards."""
    cluster = stack.cluster
    argv = ["sacctmgr", "-i", "modify", "account", "where", "name=vision", "set"]
    cp = cluster.run([*argv, "GrpTRES=gres/gpu=4"])
    assert cp.returncode == 0, cp.stderr
    try:
        yield 4
    finally:
        cluster.run([*argv, "GrpTRES=gres/gpu=-1"])


def test_grows_stay_within_the_accounts_slurm_gpu_limit(stack: Agents, tmp_path: Path,
                                                        vision_gpu_limit: int) -> None:
    """bob's job (2 GPUs on 1 node, step 2, max 4) under vision's GrpTRES gres/gpu=4: one extension node fits,
    a second would pend with AssocGrpGRES forever, so the controller plans it with 1 node and then holds."""
    cluster = stack.cluster
    marker = _marker(cluster)
    bob = cluster.submit(elastic_script(90, DIRECTIVES, marker), "-N1", "--gres=gpu:2", "--time=30", user="bob")
    cluster.wait_state(bob, {"RUNNING"})
    cfg = controller_config(tmp_path, stack)
    (tmp_path / "policy.toml").write_text(policy_text(CLUSTER, step=2))
    with running_controller(cluster, cfg) as ctl:
        wait_until("a 1-node extension job", lambda: _ext_nodes(cluster, bob) == 1, 90, ctl)
        wait_until("a QUOTA_REACHED hold after the cooldown", lambda: any(
            d.reason == "QUOTA_REACHED" for d in _live(ctl, bob)), 60, ctl)
        exts = _extensions(cluster, bob)
        decisions = _live(ctl, bob)
    assert [(e["job_state"], int(str(e["node_count"]))) for e in exts] == [("RUNNING", 1)]
    grow = next(d for d in decisions if d.action == "grow")
    assert (grow.current_nodes, grow.target_nodes) == (1, 2)
    assert "+1 of 2 wanted, limited by account vision GrpTRES gres/gpu=4 with 2 GPU(s) in use" in grow.message
    held = next(d for d in decisions if d.reason == "QUOTA_REACHED")
    assert "account vision GrpTRES gres/gpu=4 with 4 GPU(s) in use leaves 0" in held.message
    assert held.inputs["gpu_limit_scope"] == "account:vision" and held.inputs["gpu_limit_left"] == 0
