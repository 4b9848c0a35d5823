"""Extension jobs may use any partition the leader was submitted to (``sbatch -p train,cold``): Slurm shows a
running job only the partition it runs in, so the job_submit plugin keeps the list in the admin_comment
(``[elastic-partitions:train,cold]``); the policy grows into the leader's own partition first, then into the
others (powered-on free nodes before powered-down ones), and the extension job is submitted to the plan's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_elastic.controller.extension import build_request
from slurm_elastic.directives.admin_comment import spec_from_admin_comment, submitted_partitions
from slurm_elastic.policy import Action, Decision, Reason, decide
from slurm_elastic.slurm.model import Node
from tests.unit.policy_builders import NOW, cfg, job, make_input, node, unit, util

BOTH = "[elastic:v1 min=1 max=4] [elastic-partitions:train,cold]"


@pytest.mark.parametrize(("text", "parts"), [
    (BOTH, ("train", "cold")),
    ("site note [elastic-partitions:cold,train,cold] [elastic:v1 max=2]", ("cold", "train")),
    ("[elastic:v1 max=2]", ()),
    ("", ()),
    (None, ()),
    ("[elastic-partitions:]", ()),
])
def test_submitted_partitions_are_read_from_their_own_segment(text: str | None, parts: tuple[str, ...]) -> None:
    assert submitted_partitions(text) == parts


def test_the_partitions_segment_leaves_the_spec_alone() -> None:
    spec = spec_from_admin_comment(BOTH)
    assert spec is not None and (spec.min_nodes, spec.max_nodes) == (1, 4)


def _decide(all_nodes: list[Node], admin_comment: str = BOTH, **cfg_values: object) -> Decision:
    leader = replace(job(100, nodes=("n1",), partition="train", started_ago=600), admin_comment=admin_comment)
    inp = make_input([unit(leader, max_nodes=4)], [node("n1", used=4, partitions=("train",)), *all_nodes],
                     utils=[util(100, 95)])
    return {d.unit_id: d for d in decide(inp, cfg(**cfg_values), NOW)}[100]


def test_a_leader_submitted_to_two_partitions_grows_into_the_other_when_its_own_is_full() -> None:
    d = _decide([node("n2", used=4, partitions=("train",)), node("n5", partitions=("cold",))])
    assert (d.action, d.reason, d.target_nodes) == (Action.GROW, Reason.OVERUTILIZED, 2), d.message
    assert d.grow is not None and d.grow.nodes == ("n5",) and d.grow.partition == "cold"
    assert d.inputs["grow_partition"] == "cold"


def test_without_the_list_it_grows_only_in_the_partition_it_runs_in() -> None:
    d = _decide([node("n2", used=4, partitions=("train",)), node("n5", partitions=("cold",))],
                admin_comment="[elastic:v1 min=1 max=4]")
    assert (d.action, d.reason) == (Action.HOLD, Reason.NO_FREE_NODES), d.message
    assert "partition train" in d.message


def test_its_own_partition_comes_first() -> None:
    d = _decide([node("n2", partitions=("train",)), node("n5", partitions=("cold",))])
    assert d.grow is not None and d.grow.nodes == ("n2",) and d.grow.partition == "train"
    assert "grow_partition" not in d.inputs


def test_a_powered_on_node_of_another_partition_before_a_powered_down_one_of_its_own() -> None:
    off = node("n3", partitions=("train",), flags=("CLOUD", "POWERED_DOWN"))
    d = _decide([node("n2", used=4, partitions=("train",)), off, node("n5", partitions=("cold",))])
    assert d.grow is not None and d.grow.nodes == ("n5",) and d.grow.partition == "cold"
    assert d.grow.resume_nodes == ()


def test_powered_down_nodes_of_another_partition_are_resumed_for_it() -> None:
    off = node("n5", partitions=("cold",), flags=("CLOUD", "POWERED_DOWN"))
    d = _decide([node("n2", used=4, partitions=("train",)), off])
    assert d.grow is not None and d.grow.nodes == ("n5",) and d.grow.resume_nodes == ("n5",)
    assert d.grow.partition == "cold" and "powered-down node(s) for Slurm to resume: n5" in d.message
    assert _decide([node("n2", used=4, partitions=("train",)), off], power_resume=False).reason is (
        Reason.NO_FREE_NODES)


def test_the_extension_job_is_submitted_to_the_plans_partition() -> None:
    leader = job(42, partition="train")
    args = dict(a.split("=", 1) for a in build_request(leader, ["n5"], "grow:42:7", NOW, rendezvous="h:1",
                                                       partition="cold").sbatch_args if "=" in a)
    assert args["--partition"] == "cold" and args["--nodelist"] == "n5"
    default = build_request(leader, ["n2"], "grow:42:8", NOW, rendezvous="h:1").sbatch_args
    assert "--partition=train" in default
