"""A grow on the two-switch test cluster stays on the job's leaf switch while a node there is free.

Every test cluster has a topology.conf with two leaf switches under a spine (docker-slurm/daemon-lib.sh
write_topology: leaf1 n[1-2], leaf2 n[3-...]) and TopologyPlugin=topology/tree. The real controller reads it with
`scontrol show topology` (slurm/topology.py) and its grows take free nodes under the job's own leaf switch first
(policy/topology.py). A job on n4 (leaf2) with n1, n2 (leaf1) and n3 (leaf2) free: without the topology the grow
would take n1 (name order), with it n3.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.slurm.topology import parse_leaf_switches
from slurm_elastic.store.records import ActionKind
from tests.cluster.agents_harness import Agents
from tests.cluster.controller_harness import (
    controller_config,
    elastic_script,
    marker_file,
    running_controller,
    wait_until,
)
from tests.cluster.harness import TestCluster

pytestmark = pytest.mark.cluster

DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 2 --window 10s --cooldown 15s --grace 3s --signal USR2"


def _extension_nodes(cluster: TestCluster, leader: int) -> list[tuple[str, ...]]:
    out = []
    for j in cluster.jobs():
        tag = parse_tag(j.comment)
        if tag and tag.parent == leader and j.state == "RUNNING":
            out.append(j.nodes)
    return out


def test_a_grow_stays_on_the_jobs_leaf_switch_while_a_node_there_is_free(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    leaf = parse_leaf_switches(cluster.run(["scontrol", "show", "topology"]).stdout)
    # The cluster's own topology (not the test's assumption): n4's switch has n3 free, the other switch sorts first.
    assert leaf["n4"] == leaf["n3"] != leaf["n1"] == leaf["n2"], leaf
    marker = marker_file(cluster)
    job = cluster.submit(elastic_script(90, DIRECTIVES, marker), "-N1", "-w", "n4", "--gres=gpu:4", "--time=30",
                         user="alice")
    cluster.wait_state(job, {"RUNNING"})
    with running_controller(cluster, controller_config(tmp_path, stack)) as ctl:
        wait_until("a running extension job", lambda: bool(_extension_nodes(cluster, job)), 120, ctl)
        ctl.wait_applied(job, ActionKind.GROW, 1)
        (decision,) = [d for d in ctl.decisions(job) if d.action == "grow"]
    assert _extension_nodes(cluster, job) == [("n3",)]
    assert "n3" in decision.message and "n1" not in decision.message, decision.message
