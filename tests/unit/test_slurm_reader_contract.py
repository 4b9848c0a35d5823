"""One contract, two read backends: the squeue/sinfo JSON reader and the optional pyslurm reader.

The JSON reader plays the captured 22.05 replies through its real parsing path; the pyslurm reader reads a
stand-in module shaped like pyslurm's object API carrying the same cluster state. Both must yield the same
snapshot facts. (pyslurm itself cannot be built on this machine: see slurm_elastic/slurm/pyslurm_reader.py.)
"""

from __future__ import annotations

import json
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.errors import SlurmParseError
from slurm_elastic.slurm.model import ClusterSnapshot
from slurm_elastic.slurm.pyslurm_reader import PyslurmReader
from slurm_elastic.slurm.runner import CommandResult, SlurmCommands

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "22.05"
PARTITIONS = ("PartitionName=train Default=YES Nodes=n[1-4] PriorityTier=1 State=UP\n"
              "PartitionName=serve Default=NO Nodes=n[1-4] PriorityTier=10 State=UP\n")


def recorded_runner(argv: Sequence[str], *, timeout: float, input_text: str | None,
                    env: Mapping[str, str] | None) -> CommandResult:
    if argv[0] == "scontrol" and "--json" in argv:  # 22.05's scontrol has no JSON (recorded reply)
        return CommandResult(tuple(argv), 1, "", (FIX / "recorded" / "scontrol-nodes.json.stderr").read_text())
    replies = {"squeue": (FIX / "squeue.json").read_text(), "sinfo": (FIX / "sinfo.json").read_text(),
               "scontrol": PARTITIONS}
    return CommandResult(tuple(argv), 0, replies[argv[0]], "")


def fake_pyslurm() -> types.ModuleType:
    squeue = json.loads((FIX / "squeue.json").read_text())["jobs"]
    sinfo = json.loads((FIX / "sinfo.json").read_text())["nodes"]
    mod = types.ModuleType("pyslurm")

    def job(j: dict[str, Any]) -> types.SimpleNamespace:
        gpus = j["tres_per_node"].split(":")[-1] if j["tres_per_node"] else None
        return types.SimpleNamespace(
            id=j["job_id"], name=j["name"], user_name=j["user_name"], user_id=j["user_id"], account=j["account"],
            partition=j["partition"], qos=j["qos"], priority=j["priority"], state=j["job_state"],
            state_reason=j["state_reason"], nodes=j["nodes"], batch_host=j["batch_host"],
            num_nodes=j["node_count"], gres_per_node={"gpu": int(gpus)} if gpus else {},
            time_limit=j["time_limit"], submit_time=j["submit_time"], start_time=j["start_time"],
            end_time=j["end_time"], comment=j["comment"], admin_comment=j["admin_comment"],
            het_id=j["het_job_id"], het_offset=j["het_job_offset"], array_id=j["array_job_id"],
            array_task_id=j["array_task_id"])

    def node(n: dict[str, Any]) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            name=n["name"], state=n["state"].upper(), partitions=n["partitions"], total_cpus=n["cpus"],
            allocated_cpus=n["alloc_cpus"], configured_gres=n["gres"], allocated_gres=n["gres_used"],
            reason=n["reason"], address=n["address"], port=n["port"])

    class Loader:
        def __init__(self, items: dict[Any, Any]) -> None:
            self.items = items

        def load(self) -> dict[Any, Any]:
            return self.items

    mod.Jobs = Loader({j["job_id"]: job(j) for j in squeue})  # type: ignore[attr-defined]
    mod.Nodes = Loader({n["name"]: node(n) for n in sinfo})  # type: ignore[attr-defined]
    parts = {p: types.SimpleNamespace(name=p, nodes="n[1-4]", is_default=p == "train", priority_tier=t,
                                      state="UP") for p, t in (("train", 1), ("serve", 10))}
    mod.Partitions = Loader(parts)  # type: ignore[attr-defined]
    return mod


@pytest.fixture(params=["json", "pyslurm"])
def snapshot(request: pytest.FixtureRequest) -> ClusterSnapshot:
    if request.param == "json":
        return SlurmCli(SlurmCommands(env={}, runner=recorded_runner)).snapshot()
    return PyslurmReader(fake_pyslurm()).snapshot()


def test_contract_jobs(snapshot: ClusterSnapshot) -> None:
    bob = snapshot.job(2)
    assert bob is not None
    assert (bob.user, bob.account, bob.state, bob.nodes, bob.batch_host) == ("bob", "vision", "RUNNING", ("n2",), "n2")
    assert bob.gpus_per_node() == 1 and bob.time_limit_min == 30 and bob.comment == 'hello "world"'
    comp = snapshot.job(4)
    assert comp is not None and comp.display_id == "3+1" and comp.is_pending and comp.nodes == ()
    task = snapshot.job(7)
    assert task is not None and task.display_id == "5_0" and task.nodes == ("n3",)
    assert not bob.is_het_component


def test_contract_nodes_and_partitions(snapshot: ClusterSnapshot) -> None:
    assert [n.name for n in snapshot.nodes] == ["n1", "n2", "n3", "n4"]
    n2 = snapshot.node("n2")
    assert n2 is not None and n2.gpus() == 4 and n2.gpus_used() == 1 and n2.partitions == ("train", "serve")
    assert {p.name: p.is_default for p in snapshot.partitions} == {"train": True, "serve": False}


def test_pyslurm_without_object_api_is_a_clear_error() -> None:
    with pytest.raises(SlurmParseError, match="object API"):
        PyslurmReader(types.ModuleType("pyslurm")).snapshot()
