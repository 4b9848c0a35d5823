"""Keep a growing job on its own leaf switch (pure): which free nodes a grow takes first.

With Slurm's topology/tree (``scontrol show topology``; the adapter's snapshot carries node -> leaf switch), a
grow takes free nodes under the leaf switch that holds most of the job's nodes first, then those under its other
switches, then any other (best fit and name order within each; capacity.NodePool.take). Traffic between nodes
under one leaf switch does not cross the spine. It is a preference, never a refusal: a grow still takes free
nodes elsewhere when its switch has none left. Without a topology (empty map) nothing changes.

The throughput model charges a grow that has to leave the job's leaf switch (:func:`charge_cross_switch`): the
job's all-reduce then crosses the spine, so the synchronisation share of a step (the linear-sync model of
policy/speedup.py) is taken :data:`CROSS_SWITCH_SYNC_PENALTY` longer at the new size. A job that already spans
switches is not charged again: its measured utilization and throughput include that cost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from slurm_elastic.policy.model import ElasticUnit

#: A step's synchronisation share is this much longer once the job spans two leaf switches (25%): the all-reduce's
#: ring then has two hops through the spine, which on a typical two-tier fat tree is oversubscribed (2:1 or worse)
#: and shared with other jobs, while traffic under one leaf switch is not. An assumption, kept small so that it only
#: decides close calls (docs/policy.md, "Topology"); no cross-switch traffic can be measured on the test clusters,
#: whose nodes all share one host.
CROSS_SWITCH_SYNC_PENALTY = 0.25


def unit_nodes(unit: ElasticUnit) -> tuple[str, ...]:
    """The nodes the unit runs on: the leader's and its running extension jobs'."""
    return unit.job.nodes + tuple(n for e in unit.running_extensions for n in e.nodes)


def switch_ranks(nodes: Iterable[str], leaf_switch: Mapping[str, str]) -> dict[str, int]:
    """Node -> rank for :meth:`NodePool.take`'s ``prefer``: every node under a leaf switch that holds some of
    ``nodes`` ranks by how many of them it holds (the job's main switch first); other nodes are left out (0)."""
    held = Counter(leaf_switch[n] for n in nodes if n in leaf_switch)
    if not held:
        return {}
    return {node: held[switch] for node, switch in leaf_switch.items() if held.get(switch)}


def grow_preference(unit: ElasticUnit, leaf_switch: Mapping[str, str]) -> dict[str, int]:
    return switch_ranks(unit_nodes(unit), leaf_switch) if leaf_switch else {}


def crosses_switch(nodes: Iterable[str], add: int, leaf_switch: Mapping[str, str], free: Iterable[str]) -> bool:
    """Whether growing a job on ``nodes`` by ``add`` free nodes (of ``free``) must leave its leaf switch: its
    nodes are all under one leaf switch and fewer than ``add`` free nodes are left there. False without a
    topology, for a job already across switches (or on nodes the topology does not name), and for ``add`` <= 0."""
    switches = {leaf_switch.get(n) for n in nodes}
    if add <= 0 or len(switches) != 1 or None in switches:
        return False
    (own,) = switches
    room = sum(1 for n in free if leaf_switch.get(n) == own)
    return room < add


def charge_cross_switch(speedup: float, util_pct: float, nodes: int, add: int) -> float:
    """The speedup of a grow from ``nodes`` to ``nodes + add`` once it crosses to another leaf switch: the step
    time at the new size (1 / ``speedup`` of today's) plus :data:`CROSS_SWITCH_SYNC_PENALTY` of its
    synchronisation share, which the linear-sync model puts at ``(1 - u) * (nodes + add) / nodes`` of today's step
    (``u``: the mean GPU utilization at ``nodes``)."""
    if speedup <= 0 or nodes <= 0 or add <= 0:
        return speedup
    u = min(1.0, max(0.0, util_pct / 100.0))
    sync = (1.0 - u) * (nodes + add) / nodes
    return 1.0 / (1.0 / speedup + CROSS_SWITCH_SYNC_PENALTY * sync)
