"""Slurm's topology (slurm/topology.py) from ``scontrol show topology`` replies recorded on 22.05."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.errors import SlurmParseError
from slurm_elastic.slurm.runner import CommandResult, SlurmCommands
from slurm_elastic.slurm.topology import parse_leaf_switches

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "22.05"
TREE = (RECORDED / "scontrol_show_topology.txt").read_text()


def test_recorded_tree_gives_each_node_its_leaf_switch() -> None:
    assert parse_leaf_switches(TREE) == {"n1": "leaf1", "n2": "leaf1", "n3": "leaf1",
                                         "n4": "leaf2", "n5": "leaf2", "n6": "leaf2"}


def test_no_topology_plugin_gives_no_switches() -> None:
    assert parse_leaf_switches((RECORDED / "scontrol_show_topology_none.txt").read_text()) == {}


def test_a_node_under_two_leaves_keeps_the_first_and_other_lines_are_skipped() -> None:
    text = TREE.replace("Nodes=n[4-6]", "Nodes=n[3-6]") + "\nBlockName=b1 BlockIndex=0 Nodes=n[1-6]\n"
    assert parse_leaf_switches(text)["n3"] == "leaf1"


def test_bad_lines_raise_parse_errors() -> None:
    with pytest.raises(SlurmParseError, match="has no Level"):
        parse_leaf_switches("SwitchName=s0 Nodes=n1\n")
    with pytest.raises(SlurmParseError, match="bad hostlist"):
        parse_leaf_switches("SwitchName=s0 Level=0 LinkSpeed=1 Nodes=n[1-\n")


class _Runner:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float, input_text: str | None,
                 env: Mapping[str, str] | None) -> CommandResult:
        self.calls.append(tuple(argv))
        return CommandResult(tuple(argv), 0, TREE, "")


def test_adapter_reads_the_topology_once_per_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _Runner()
    cli = SlurmCli(SlurmCommands(runner=runner, env={}), topology=True)
    assert cli.leaf_switches()["n5"] == "leaf2"
    assert cli.leaf_switches()["n1"] == "leaf1"
    assert runner.calls == [("scontrol", "show", "topology")]
    monkeypatch.setattr(SlurmCli, "TOPOLOGY_TTL", SlurmCli.TOPOLOGY_TTL * 0)
    cli.leaf_switches()
    assert len(runner.calls) == 2


class _Failing(_Runner):
    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def __call__(self, argv: Sequence[str], *, timeout: float, input_text: str | None,
                 env: Mapping[str, str] | None) -> CommandResult:
        if self.fail:
            self.calls.append(tuple(argv))
            return CommandResult(tuple(argv), 1, "", "scontrol: error: Invalid user")
        return super().__call__(argv, timeout=timeout, input_text=input_text, env=env)


def test_a_failed_read_keeps_the_last_topology(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _Failing()
    cli = SlurmCli(SlurmCommands(runner=runner, env={}), topology=True)
    assert cli.leaf_switches()["n1"] == "leaf1"
    runner.fail = True
    monkeypatch.setattr(SlurmCli, "TOPOLOGY_TTL", SlurmCli.TOPOLOGY_TTL * 0)
    assert cli.leaf_switches()["n1"] == "leaf1"
    assert len(runner.calls) >= 2


def test_the_test_clusters_topology_has_partition_train_nodes_on_both_leaves() -> None:
    """Recorded from the test cluster (docker-slurm write_topology): the cluster test of a grow kept on its leaf
    switch needs free always-on nodes under both leaf switches."""
    leaves = parse_leaf_switches((RECORDED / "recorded" / "scontrol-topology.txt").read_text())
    assert leaves == {"n1": "leaf1", "n2": "leaf1", "n3": "leaf2", "n4": "leaf2", "n5": "leaf2", "n6": "leaf2"}
