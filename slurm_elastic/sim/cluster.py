"""GPU bookkeeping of N nodes x G GPUs and the rule that picks which GPUs a starting job gets.

Placement is GPU-granular: a job asking ``g`` GPUs may span nodes with partial use, as in the Pollux artifact
(and as Slurm does with ``--gpus=g`` without ``--exclusive``). Two rules:

``spread`` (default, the artifact's rule)
    Repeatedly take the node with the most free GPUs (lowest index on a tie) and give the job as many of its
    GPUs as it still needs. On an empty cluster a 6-GPU job gets 4 + 2; on a fragmented one it may span many
    nodes, which the measured step times penalise.
``pack`` (closer to Slurm's cons_tres)
    A job that fits on one node goes to the node with the fewest free GPUs that still fits it (best fit); a
    larger job first takes whole free nodes, then best-fits its remainder; if that fails it falls back to
    ``spread``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Literal

from slurm_elastic.sim.errors import SimulationError
from slurm_elastic.sim.power import NodePower, PowerReport, PowerSaving

PlacementRule = Literal["spread", "pack"]
Allocation = tuple[tuple[int, int], ...]  # (node index, GPUs) in allocation order; the first is the batch host


def shape_of(alloc: Allocation) -> tuple[int, ...]:
    """GPUs per node of an allocation, in the order nodes first appear. A node may appear twice (a GPU-granular
    grow onto the job's own node): the performance model sees the node once, with all the job's GPUs there."""
    per_node: dict[int, int] = {}
    for node, gpus in alloc:
        per_node[node] = per_node.get(node, 0) + gpus
    return tuple(per_node.values())


class Cluster:
    """Free GPUs per node. Every change is checked: a node never goes below 0 or above G free GPUs."""

    def __init__(self, num_nodes: int, gpus_per_node: int, *, power: PowerSaving | None = None,
                 clock: Callable[[], float] = lambda: 0.0) -> None:
        if num_nodes < 1 or gpus_per_node < 1:
            raise SimulationError(
                f"a cluster needs at least 1 node and 1 GPU per node, not {num_nodes}x{gpus_per_node}"
            )
        self.num_nodes = num_nodes
        self.gpus_per_node = gpus_per_node
        self.free = [gpus_per_node] * num_nodes
        self.free_total = num_nodes * gpus_per_node
        # Power saving (sim/power.py): which nodes are off, and the boot the last take() had to wait for.
        self.power = NodePower(power, num_nodes) if power is not None else None
        self.clock = clock
        self.boot_s = 0.0

    @property
    def total_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def whole_free_nodes(self) -> list[int]:
        return [i for i, f in enumerate(self.free) if f == self.gpus_per_node]

    def partial_node(self, gpus: int, prefer: int | None, exclude: Collection[int] = ()) -> int | None:
        """A node with at least ``gpus`` free GPUs for a GPU-granular grow, never one of ``exclude`` (the job's
        own): ``prefer`` when it has them, else the best fit among partly used nodes (fewest free, lowest
        index), else None."""
        if prefer is not None and prefer not in exclude and 0 <= prefer < self.num_nodes \
                and self.free[prefer] >= gpus:
            return prefer
        fits = [i for i, f in enumerate(self.free) if gpus <= f < self.gpus_per_node and i not in exclude]
        return min(fits, key=lambda i: (self.free[i], i)) if fits else None

    def take(self, alloc: Allocation) -> None:
        asked: dict[int, int] = {}
        for node, gpus in alloc:
            asked[node] = asked.get(node, 0) + gpus
            if gpus < 1 or self.free[node] < asked[node]:
                raise SimulationError(f"node {node} has {self.free[node]} free GPUs, cannot take {asked[node]}")
        self.boot_s = 0.0
        for node, gpus in alloc:
            if self.power is not None and self.free[node] == self.gpus_per_node:
                self.boot_s = max(self.boot_s, self.power.used(node, self.clock()))
            self.free[node] -= gpus
            self.free_total -= gpus

    def give_back(self, alloc: Allocation) -> None:
        back: dict[int, int] = {}
        for node, gpus in alloc:
            back[node] = back.get(node, 0) + gpus
            if self.free[node] + back[node] > self.gpus_per_node:
                raise SimulationError(f"node {node} would have more than {self.gpus_per_node} free GPUs")
        for node, gpus in alloc:
            self.free[node] += gpus
            self.free_total += gpus
            if self.power is not None and self.free[node] == self.gpus_per_node:
                self.power.freed(node, self.clock())

    def power_state(self, node: int) -> str:
        """The node's power state as Slurm would show it ("" when it is not under power saving)."""
        return self.power.state(node, self.clock()) if self.power is not None else ""

    def power_report(self, end: float) -> PowerReport | None:
        return self.power.report(end) if self.power is not None else None

    def place(self, gpus: int, rule: PlacementRule) -> Allocation:
        """Pick GPUs for a job without taking them. The caller has checked that ``gpus <= free_total``."""
        if gpus > self.free_total:
            raise SimulationError(f"cannot place {gpus} GPUs, {self.free_total} free")
        if rule == "pack":
            packed = self._pack(gpus)
            if packed is not None:
                return packed
        return self._spread(gpus)

    def _spread(self, gpus: int) -> Allocation:
        free = list(self.free)
        alloc: list[tuple[int, int]] = []
        while gpus > 0:
            node = max(range(len(free)), key=lambda i: (free[i], -i))
            n = min(free[node], gpus)
            alloc.append((node, n))
            free[node] -= n
            gpus -= n
        return tuple(alloc)

    def _best_fit(self, free: list[int], gpus: int) -> int | None:
        fits = [i for i, f in enumerate(free) if f >= gpus]
        return min(fits, key=lambda i: (free[i], i)) if fits else None

    def _pack(self, gpus: int) -> Allocation | None:
        g = self.gpus_per_node
        free = list(self.free)
        alloc: list[tuple[int, int]] = []
        if gpus > g:
            for node in range(len(free)):
                if gpus < g:
                    break
                if free[node] == g:
                    alloc.append((node, g))
                    free[node] = 0
                    gpus -= g
        if gpus > 0:
            target = self._best_fit(free, gpus)
            if target is None:
                return None
            alloc.append((target, gpus))
        return tuple(alloc)
