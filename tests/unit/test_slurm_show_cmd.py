"""``slurm-elastic slurm show``: the fragmentation figure over the adapter's snapshot."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slurm_elastic.cli import cluster_cmd
from slurm_elastic.slurm.model import ClusterSnapshot
from tests.unit.policy_builders import job, node, pending, snapshot


class _Cli:
    def __init__(self, snap: ClusterSnapshot) -> None:
        self.snap = snap

    def snapshot(self) -> ClusterSnapshot:
        return self.snap


@pytest.fixture
def snap(monkeypatch: pytest.MonkeyPatch) -> ClusterSnapshot:
    s = snapshot([job(1, nodes=("n1",), gpus=3), pending(2, gpus=2)], [node("n1", used=3), node("n2", used=2),
                                                                         node("n3")])
    monkeypatch.setattr(cluster_cmd, "SlurmCli", lambda **_: _Cli(s))
    return s


def test_show_prints_stranded_gpus(snap: ClusterSnapshot) -> None:
    out = CliRunner().invoke(cluster_cmd.slurm_cmd, ["show"])
    assert out.exit_code == 0, out.output
    assert "GPUs free on 2 partly used node(s): 3, stranded (no waiting job fits them): 1" in out.output


def test_show_json_has_the_figure(snap: ClusterSnapshot) -> None:
    out = CliRunner().invoke(cluster_cmd.slurm_cmd, ["show", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["fragmentation"] == {"partial_nodes": 2, "free_on_partial": 3, "stranded": 1}


def test_show_prints_each_nodes_leaf_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    s = snapshot([], [node("n1"), node("n2")])
    s = ClusterSnapshot(taken_at=s.taken_at, jobs=(), nodes=s.nodes, partitions=s.partitions,
                        leaf_switch={"n1": "leaf1"})
    monkeypatch.setattr(cluster_cmd, "SlurmCli", lambda **_: _Cli(s))
    out = CliRunner().invoke(cluster_cmd.slurm_cmd, ["show"])
    lines = {line.split()[0]: line.split() for line in out.output.splitlines() if line.startswith("n")}
    assert lines["n1"][4] == "leaf1"
    assert lines["n2"][4] == "-"
