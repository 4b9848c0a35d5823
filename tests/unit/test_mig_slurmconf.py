"""One node's GRES in slurm.conf and gres.conf: rewritten without touching other nodes, refused when unsafe."""

from __future__ import annotations

import pytest

from slurm_elastic.mig.slurmconf import (
    SlurmConfEditError,
    gres_summary,
    node_gres_lines,
    node_gres_value,
    set_node_gres,
    set_node_gres_lines,
)

CONF = """ClusterName=elastic
NodeName=n[1-4] NodeHostname=vm NodeAddr=127.0.0.1 Port=[17001-17004] CPUs=8 Gres=gpu:4,mps:400 State=UNKNOWN
PartitionName=train Nodes=n[1-4] Default=YES
"""
GRES = """NodeName=n1 Name=gpu File=/dev/n1/gpu[0-3]
NodeName=n3,n4 Name=gpu File=/dev/nvidia[0-3]
NodeName=n4 Name=mps Count=400 File=/dev/nvidia[0-3]
NodeName=n4 Name=nic File=/dev/infiniband/uverbs0
"""


def test_a_shared_record_is_split_with_its_per_node_lists() -> None:
    out = set_node_gres(CONF, "n4", "gpu:3g.20gb:2,gpu:a100:3,mps:300", "workflow=7")
    lines = out.splitlines()
    assert lines[1] == ("NodeName=n[1-3] NodeHostname=vm NodeAddr=127.0.0.1 Port=[17001-17003] CPUs=8 "
                        "Gres=gpu:4,mps:400 State=UNKNOWN")
    assert lines[2] == "# slurm-elastic-mig: n4 workflow=7"
    assert lines[3] == ("NodeName=n4 NodeHostname=vm NodeAddr=127.0.0.1 Port=17004 CPUs=8 "
                        "Gres=gpu:3g.20gb:2,gpu:a100:3,mps:300 State=UNKNOWN")
    assert node_gres_value(out, "n4") == "gpu:3g.20gb:2,gpu:a100:3,mps:300"
    assert node_gres_value(out, "n2") == "gpu:4,mps:400"
    assert out.endswith("Default=YES\n")


def test_a_middle_node_and_per_node_addresses() -> None:
    conf = "NodeName=g[01-03] NodeAddr=10.0.0.[1-3] Port=[7001-7003] Gres=gpu:8\n"
    out = set_node_gres(conf, "g02", "gpu:1g.10gb:7")
    assert out.splitlines() == [
        "NodeName=g[01,03] NodeAddr=10.0.0.[1,3] Port=[7001,7003] Gres=gpu:8",
        "# slurm-elastic-mig: g02",
        "NodeName=g02 NodeAddr=10.0.0.2 Port=7002 Gres=gpu:1g.10gb:7",
    ]
    assert out.endswith("\n")


def test_a_second_rewrite_replaces_the_marker_and_the_value() -> None:
    once = set_node_gres(CONF, "n4", "gpu:a100:4", "a")
    twice = set_node_gres(once, "n4", "gpu:1g.5gb:7", "b")
    assert twice.count("# slurm-elastic-mig: n4") == 1 and "# slurm-elastic-mig: n4 b" in twice
    assert node_gres_value(twice, "n4") == "gpu:1g.5gb:7"
    assert set_node_gres(twice, "n4", "gpu:4,mps:400", marker=False).count("slurm-elastic-mig") == 0


def test_a_record_without_gres_gets_one() -> None:
    assert node_gres_value("NodeName=x1 CPUs=4\n", "x1") is None
    assert node_gres_value(set_node_gres("NodeName=x1 CPUs=4\n", "x1", "gpu:a100:1"), "x1") == "gpu:a100:1"


@pytest.mark.parametrize(("conf", "message"), [
    ("NodeName=n[1-4] Port=[1-3]\n", "Port lists 3 values for 4 nodes"),
    ("NodeName=n1 CPUs=1\n", "no NodeName= record names n4"),
    ("NodeName=n4 CPUs=1\nNodeName=n[3-4] CPUs=2\n", "several NodeName= records"),
    ("NodeName=n[1-4] \\\n  CPUs=8\n", "continuation lines"),
])
def test_unsafe_slurm_conf_edits_are_refused(conf: str, message: str) -> None:
    with pytest.raises(SlurmConfEditError, match=message):
        set_node_gres(conf, "n4", "gpu:a100:4")


def test_gres_conf_lines_of_a_node_are_replaced_in_place_and_others_kept() -> None:
    assert node_gres_lines(GRES, "n4") == ("NodeName=n3,n4 Name=gpu File=/dev/nvidia[0-3]",
                                           "NodeName=n4 Name=mps Count=400 File=/dev/nvidia[0-3]")
    new = ["NodeName=n4 Name=gpu Type=3g.20gb File=/dev/x0", "NodeName=n4 Name=gpu Type=a100 File=/dev/x1"]
    out = set_node_gres_lines(GRES, "n4", new, "workflow=3")
    assert out.splitlines() == [
        "NodeName=n1 Name=gpu File=/dev/n1/gpu[0-3]",
        "NodeName=n3 Name=gpu File=/dev/nvidia[0-3]",
        "# slurm-elastic-mig: n4 workflow=3",
        *new,
        "NodeName=n4 Name=nic File=/dev/infiniband/uverbs0",  # not ours: kept
    ]
    again = set_node_gres_lines(out, "n4", new[:1])
    assert again.count("slurm-elastic-mig") == 1 and node_gres_lines(again, "n4") == (new[0],)


def test_gres_conf_refuses_global_gpu_lines_and_foreign_new_lines() -> None:
    with pytest.raises(SlurmConfEditError, match="for every node"):
        set_node_gres_lines("Name=gpu File=/dev/nvidia[0-7]\n", "n4", [])
    with pytest.raises(SlurmConfEditError, match="must start with NodeName=n4"):
        set_node_gres_lines(GRES, "n4", ["NodeName=n5 Name=gpu File=/x"])


def test_original_lines_go_back_without_a_marker() -> None:
    new = set_node_gres_lines(GRES, "n1", ["NodeName=n1 Name=gpu Type=a100 File=/dev/n1/gpu0"])
    back = set_node_gres_lines(new, "n1", node_gres_lines(GRES, "n1"), marker=False)
    assert back == GRES


def test_gres_summary_ignores_zero_counts_and_sums_typed_mps() -> None:
    assert gres_summary("gpu:3g.20gb:2,gpu:1g.5gb:1,gpu:a100:3,mps:3g.20gb:0,mps:1g.5gb:0,mps:a100:300") == {
        "gpu:1g.5gb": 1, "gpu:3g.20gb": 2, "gpu:a100": 3, "mps": 300}
    assert gres_summary("gpu:a100:2(S:0-1),mps:200") == gres_summary("mps:200,gpu:a100:2")
    assert gres_summary("") == {} and gres_summary(None) == {}
