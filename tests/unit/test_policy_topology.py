"""A grow prefers free nodes under the job's own leaf switch (policy/topology.py, NodePool.take's prefer)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from slurm_elastic.policy import Action, Decision, Reason, decide
from slurm_elastic.policy.capacity import NodePool, Status, need_of
from slurm_elastic.policy.speedup import model_speedup
from slurm_elastic.policy.topology import (
    CROSS_SWITCH_SYNC_PENALTY,
    charge_cross_switch,
    crosses_switch,
    grow_preference,
    switch_ranks,
)
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


def _speedup_decision(free: tuple[str, ...], mean: float, leaf_switch: dict[str, str] | None = None) -> Decision:
    u = unit(job(100, nodes=("n1",), time_limit_min=600, priority=1000), max_nodes=4)
    nodes = [node("n1", used=4), *(node(n) for n in free)]
    inp = make_input([u], nodes, utils=[util(100, mean, restart=90.0)])
    inp = replace(inp, snapshot=replace(inp.snapshot, leaf_switch=LEAVES if leaf_switch is None else leaf_switch))
    (d,) = decide(inp, cfg(speedup_growth=True, scale_up_above=95, scale_down_below=20), NOW)
    return d


def test_charge_cross_switch_lengthens_the_sync_share_only() -> None:
    # 90% utilization, 1 -> 2 nodes: step 0.45 compute + 0.2 sync of today's; across switches sync is 25% longer.
    plain = model_speedup(90, 1, 1)
    assert plain == pytest.approx(1 / 0.65)
    assert charge_cross_switch(plain, 90, 1, 1) == pytest.approx(1 / (0.65 + CROSS_SWITCH_SYNC_PENALTY * 0.2))
    assert charge_cross_switch(plain, 100, 1, 1) == pytest.approx(plain)  # no sync, nothing to charge
    assert charge_cross_switch(plain, 90, 1, 0) == plain
    assert 0 < CROSS_SWITCH_SYNC_PENALTY <= 0.5  # small: it decides close calls only


def test_crosses_switch_only_when_the_jobs_switch_has_too_few_free_nodes() -> None:
    assert crosses_switch(["n1"], 1, LEAVES, ["n4"])
    assert not crosses_switch(["n1"], 1, LEAVES, ["n2", "n4"])
    assert crosses_switch(["n1"], 2, LEAVES, ["n2", "n4"])
    assert not crosses_switch(["n1", "n4"], 1, LEAVES, ["n5"])  # already across: its measurements carry the cost
    assert not crosses_switch(["n1"], 1, {}, ["n4"])
    assert not crosses_switch(["x9"], 1, LEAVES, ["n4"])


def test_a_grow_that_must_leave_the_jobs_switch_is_charged_and_a_close_call_holds() -> None:
    same = _speedup_decision(("n2",), 90)
    assert (same.action, same.reason) == (Action.GROW, Reason.SPEEDUP_GAIN)
    assert same.inputs["cross_switch"] is False
    assert same.inputs["next_speedup"] == pytest.approx(round(model_speedup(90, 1, 1), 3))
    across = _speedup_decision(("n4",), 90)  # efficiency 0.54 on one switch, 0.43 across: below 0.5
    assert (across.action, across.reason) == (Action.HOLD, Reason.LOW_SPEEDUP_GAIN)
    assert across.inputs["cross_switch"] is True
    charged = charge_cross_switch(model_speedup(90, 1, 1), 90, 1, 1)
    assert across.inputs["next_speedup"] == pytest.approx(round(charged, 3))
    assert "cross-switch" in str(across.inputs["speedup_source"])
    # Without a topology nothing is charged (and nothing recorded).
    flat = _speedup_decision(("n4",), 90, leaf_switch={})
    assert flat.action is Action.GROW and "cross_switch" not in flat.inputs
