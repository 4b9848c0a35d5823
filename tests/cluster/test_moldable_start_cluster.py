"""On the real cluster, moldable start (policy/moldable.py, controller/molds.py).

A rigid job holds two of the four nodes; an elastic job (``#ELASTIC --min-nodes 1``, no ``--max-nodes``) asks
for all four with ``--time=60`` and waits on Resources. With ``moldable_start = true`` the controller reshapes
it (``scontrol update NumNodes=2-4 TimeLimit=120``): Slurm starts it at once on the two free nodes, with the time
limit scaled by 4/2. Its request stays its max: once the rigid job ends, the busy job grows back to four nodes
(``MOLDED_REGROW``, no metrics window needed: one grow of two nodes, or two of one when the rigid job's nodes come
free a cycle apart) and the grows give back the minutes the mold added.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm_elastic.store.records import ActionKind, ExtensionRecord
from tests.cluster.agents_harness import Agents
from tests.cluster.controller_harness import (
    ControllerProcess,
    controller_config,
    elastic_script,
    marker_file,
    node_count,
    running_controller,
    wait_until,
)
from tests.policy_text import CLUSTER, policy_text

pytestmark = pytest.mark.cluster

DIRECTIVES = "#ELASTIC --min-nodes 1 --step 2 --window 10s --cooldown 15s --grace 3s --signal USR2"


def test_a_waiting_elastic_job_is_molded_starts_on_fewer_nodes_and_grows_back(stack: Agents,
                                                                               tmp_path: Path) -> None:
    cluster = stack.cluster
    t0 = time.monotonic()
    marker = marker_file(cluster)
    rigid = cluster.submit("#!/bin/bash\nsleep 600\n", "-N2", "--gres=gpu:4", "--time=30", user="alice")
    cluster.wait_state(rigid, {"RUNNING"})
    job = cluster.submit(elastic_script(95, DIRECTIVES, marker), "-N4", "--gres=gpu:4", "--time=60", user="bob")
    wait_until("the elastic job to wait on Resources", lambda: (j := cluster.job(job)) is not None
               and j.state == "PENDING" and j.state_reason == "Resources", 30)
    cfg = controller_config(tmp_path, stack)
    (tmp_path / "policy.toml").write_text(policy_text(CLUSTER, moldable_start=True))
    with running_controller(cluster, cfg) as ctl:
        (mold,) = ctl.wait_applied(job, ActionKind.MOLD, 1, timeout=30)
        cluster.wait_state(job, {"RUNNING"}, timeout=30)
        assert node_count(cluster, job) == 2
        started = cluster.job(job)
        assert started is not None and started.time_limit_min == 120  # 60 min x 4/2
        decision = next(d for d in ctl.decisions(job) if d.action == "mold")
        cluster.cancel(rigid)
        ctl.wait_applied(job, ActionKind.GROW, 1, timeout=60)
        wait_until("the grown job to run on 4 nodes", lambda: node_count(cluster, job) + sum(
            node_count(cluster, e.job_id) for e in _extensions(ctl, job)) == 4, 30, ctl)
        grown = cluster.job(job)
        grows = ctl.applied(job, ActionKind.GROW)
        regrows = [d for d in ctl.decisions(job) if d.action == "grow"]
    assert (mold.params["from"], mold.params["to"], mold.params["time_limit_min"]) == (4, 2, 120)
    assert mold.message == "NumNodes=2-4, time limit 60 -> 120 min"
    assert decision.reason == "MOLDABLE_START" and (decision.current_nodes, decision.target_nodes) == (4, 2)
    assert decision.inputs["free_whole_nodes"] == 2 and decision.inputs["time_limit_add_s"] == 3600
    # back to its request (the mold kept it as max), by the molded job's own rule, in one or two steps
    steps = [(int(g.params["from"]), int(g.params["to"])) for g in grows]
    assert steps in ([(2, 4)], [(2, 3), (3, 4)]), steps
    assert [d.reason for d in regrows] == ["MOLDED_REGROW"] * len(steps)
    assert all(d.inputs["molded_request"] == 4 for d in regrows)
    sub_min = sum(int(g.params["time_limit_sub_s"]) for g in grows) // 60
    assert 55 <= sub_min <= 60, [d.inputs for d in regrows]  # the 60 minutes the mold added, given back
    assert grown is not None and grown.time_limit_min == 120 - sub_min
    print(f"\nmoldable start cluster test: {time.monotonic() - t0:.1f}s")


def _extensions(ctl: ControllerProcess, job: int) -> list[ExtensionRecord]:
    st = ctl.store()
    try:
        return list(st.jobs.extensions(job, active_only=True))
    finally:
        st.close()
