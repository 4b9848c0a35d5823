"""Keep a growing job on its own leaf switch (pure): which free nodes a grow takes first.

With Slurm's topology/tree (``scontrol show topology``; the adapter's snapshot carries node -> leaf switch), a
grow takes free nodes under the leaf switch that holds most of the job's nodes first, then those under its other
switches, then any other (best fit and name order within each; capacity.NodePool.take). Traffic between nodes
under one leaf switch does not cross the spine. It is a preference, never a refusal: a grow still takes free
nodes elsewhere when its switch has none left. Without a topology (empty map) nothing changes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from slurm_elastic.policy.model import ElasticUnit


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
