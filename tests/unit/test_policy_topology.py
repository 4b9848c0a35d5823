"""A grow prefers free nodes under the job's own leaf switch (policy/topology.py, NodePool.take's prefer)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from slurm_elastic.policy import Action, decide
from slurm_elastic.policy.capacity import NodePool, Status, need_of
from slurm_elastic.policy.topology import grow_preference, switch_ranks
from slurm_elastic.slurm.topology import parse_leaf_switches
from tests.unit.policy_builders import NOW, cfg, ext, gpu, job, make_input, node, unit, util

# The recorded two-leaf topology of the 22.05 controller: n1-n3 under leaf1, n4-n6 under leaf2.
LEAVES = parse_leaf_switches(
    (Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "22.05" / "scontrol_show_topology.txt").read_text())


def _grow_nodes(leader_nodes: tuple[str, ...], free: tuple[str, ...], want: int,
                leaf_switch: dict[str, str] | None = None, exts: tuple[str, ...] = ()) -> tuple[str, ...]:
    u = unit(job(100, nodes=leader_nodes), exts=[ext(200, exts)] if exts else [], step=want, max_nodes=6)
    held = set(leader_nodes) | set(exts)
    all_nodes = [node(f"n{i}", used=4 if f"n{i}" in held else 0) for i in range(1, 7)
                 if f"n{i}" in held or f"n{i}" in free]
    inp = make_input([u], all_nodes, utils=[util(100, 95)])
    inp = replace(inp, snapshot=replace(inp.snapshot, leaf_switch=LEAVES if leaf_switch is None else leaf_switch))
    (d,) = decide(inp, cfg(), NOW)
    assert d.action is Action.GROW, d.message
    assert d.grow is not None
    return d.grow.nodes


def test_grow_stays_on_the_jobs_leaf_switch_while_a_node_there_is_free() -> None:
    # Without a topology the grow takes name order (n2); with it, n5 under the job's leaf2.
    assert _grow_nodes(("n4",), ("n2", "n5"), 1, leaf_switch={}) == ("n2",)
    assert _grow_nodes(("n4",), ("n2", "n5"), 1) == ("n5",)
    assert _grow_nodes(("n1",), ("n2", "n5"), 1) == ("n2",)


def test_grow_spills_to_other_switches_only_for_the_rest() -> None:
    assert _grow_nodes(("n4",), ("n1", "n2", "n6"), 2) == ("n6", "n1")


def test_extension_nodes_count_and_the_main_switch_goes_first() -> None:
    # Leader on n1 (leaf1), extension on n4 and n5 (leaf2): leaf2 holds more of the job.
    assert _grow_nodes(("n1",), ("n2", "n6"), 1, exts=("n4", "n5")) == ("n6",)


def test_switch_ranks() -> None:
    assert switch_ranks(["n1", "n4", "n5"], LEAVES) == {"n1": 1, "n2": 1, "n3": 1, "n4": 2, "n5": 2, "n6": 2}
    assert switch_ranks(["x9"], LEAVES) == {}
    assert grow_preference(unit(job(1, nodes=("n2",))), {}) == {}


def test_pool_take_keeps_best_fit_within_a_rank_and_the_reserve() -> None:
    nodes = [node("a1"), node("a2", gpus=8), node("b1"), node("b2")]
    pool = NodePool(nodes)
    need = need_of(gpu(4))
    got = pool.take(["gpu"], need, 2, status=Status.GRANTED, prefer={"a1": 1, "a2": 1})
    assert got == ["a1", "a2"]  # the preferred rank first, best fit (4 GPUs before 8) inside it
    pool = NodePool(nodes)
    got = pool.take(["gpu"], need, 3, status=Status.GRANTED, reserve={"gpu": 1}, prefer={"b2": 1})
    assert got == ["b2", "a1", "b1"]
