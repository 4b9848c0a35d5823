"""GPUs stranded on partly used nodes (pure): the fragmentation figure of ``slurm-elastic status`` and the
simulator's ``stranded_gpus``.

A node is **partly used** when it is up and schedulable and some but not all of its GPUs are allocated. Its free
GPUs are ``free_on_partial``. Of those, a node's free GPUs are **stranded** when no waiting job could use them: no
job waiting in one of the node's partitions asks for at most that many GPUs per node (a job that asks 4 GPUs per
node cannot start on a node with 2 free). With no job waiting, every free GPU on a partly used node counts as
stranded: nobody is asking for it, and only a job shaped to fit it could use it.

Idle and full nodes strand nothing: an idle node takes any job that fits a node, a full one has nothing free.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from slurm_elastic.slurm.model import ClusterSnapshot


@dataclass(frozen=True)
class NodeGpus:
    """One schedulable node: its GPUs, how many are free, and its partitions (empty: any partition)."""

    total: int
    free: int
    partitions: frozenset[str] = frozenset()


@dataclass(frozen=True)
class WaitingNeed:
    """One waiting job: the GPUs it needs free on a node, and the partitions it may run in (empty: any)."""

    gpus_per_node: int
    partitions: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Fragmentation:
    partial_nodes: int  # nodes with some but not all GPUs allocated
    free_on_partial: int  # free GPUs on those nodes
    stranded: int  # of those, the GPUs no waiting job could use

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _usable(node: NodeGpus, needs: Sequence[WaitingNeed]) -> bool:
    for need in needs:
        if need.gpus_per_node > node.free:
            continue
        if not need.partitions or not node.partitions or need.partitions & node.partitions:
            return True
    return False


def fragmentation(nodes: Iterable[NodeGpus], waiting: Iterable[WaitingNeed]) -> Fragmentation:
    """The figure over ``nodes`` (schedulable ones only) and the jobs ``waiting``; jobs that ask no GPU are
    ignored (they cannot use a GPU)."""
    needs = sorted((w for w in waiting if w.gpus_per_node > 0), key=lambda w: w.gpus_per_node)
    partial = free = stranded = 0
    for node in nodes:
        if not 0 < node.free < node.total:
            continue
        partial += 1
        free += node.free
        if not _usable(node, needs):
            stranded += node.free
    return Fragmentation(partial, free, stranded)


def stranded_free(free: Sequence[int], gpus_per_node: int, min_need: int | None) -> tuple[int, int]:
    """The simulator's form (one partition, every node ``gpus_per_node`` GPUs): (free GPUs on partly used nodes,
    those of them stranded) when the smallest per-node need of the waiting jobs is ``min_need`` (None: none
    waits). Same rule as :func:`fragmentation`, in O(nodes)."""
    partial = stranded = 0
    for f in free:
        if 0 < f < gpus_per_node:
            partial += f
            if min_need is None or f < min_need:
                stranded += f
    return partial, stranded


def snapshot_fragmentation(snapshot: ClusterSnapshot) -> Fragmentation:
    """:func:`fragmentation` of a Slurm snapshot: available nodes with GPUs, and the pending jobs' GPUs per node
    in their partitions (Slurm writes a multi-partition job's ``partition`` as ``a,b``)."""
    nodes = [NodeGpus(n.gpus(), max(0, n.gpus() - n.gpus_used()), frozenset(n.partitions))
             for n in snapshot.nodes if n.is_available and n.gpus() > 0]
    waiting = [WaitingNeed(j.gpus_per_node(), frozenset(p for p in j.partition.split(",") if p))
               for j in snapshot.jobs if j.is_pending]
    return fragmentation(nodes, waiting)
