"""The free-node pool: which nodes a grow may take, indexed so that a cycle stays fast on big clusters.

A node is *free* when it is available (not down, drained, failing, ...), not completing, reserved or powering,
not requested by a pending extension job, and either IDLE or MIXED with no GPU allocated (a CPU-only job on a
GPU node leaves its GPUs free). One free node serves at most one grant or reservation per cycle: extension
jobs take whole nodes' worth of the unit's GRES per node, and sharing a node with another GPU job would
risk memory and CPU limits the snapshot can not show.

Nodes are grouped into *classes* by their free GRES, per partition, and kept in natural name order; fitting a
request walks the few classes that fit (smallest first: best fit leaves big nodes for big requests) instead of
every node, and per-status counters answer "how many fit?" without a scan. A node in several partitions is
indexed in each.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from slurm_elastic.slurm.model import GresCount, Node

GresKey = tuple[str, str | None]
#: What a job needs per node: ((name, type or None), count) pairs, sorted; () needs nothing.
Need = tuple[tuple[GresKey, int], ...]
#: Free GRES of a node, as sorted ((name, type or None), count) pairs.
FreeGres = tuple[tuple[GresKey, int], ...]

_NOT_FREE_FLAGS = frozenset(
    {"COMPLETING", "RESERVED", "PLANNED", "POWERING_UP", "POWERING_DOWN", "POWERED_DOWN", "POWER_DOWN",
     "REBOOT_ISSUED", "REBOOT_REQUESTED", "MAINTENANCE", "DRAIN", "FAIL", "NOT_RESPONDING"}
)
_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """``n2`` before ``n10``: digits compare as numbers."""
    return tuple((1, int(p)) if p.isdigit() else (0, p) for p in _DIGITS.split(name) if p)


def need_of(gres_per_node: Iterable[GresCount]) -> Need:
    total: dict[GresKey, int] = {}
    for g in gres_per_node:
        if g.count > 0:
            key = (g.name, g.type)
            total[key] = total.get(key, 0) + g.count
    return tuple(sorted(total.items(), key=_gres_sort))


def _gres_sort(item: tuple[GresKey, int]) -> tuple[str, str]:
    (name, gtype), _ = item
    return (name, gtype or "")


def free_gres(node: Node) -> FreeGres:
    """Free count per (name, type) and per (name, None) for every GRES name on the node.

    When Slurm reports used GRES without a type, a typed free count is bounded by the untyped one.
    """
    total_typed: dict[GresKey, int] = {}
    total_name: dict[str, int] = {}
    for g in node.gres:
        total_name[g.name] = total_name.get(g.name, 0) + g.count
        if g.type is not None:
            total_typed[(g.name, g.type)] = total_typed.get((g.name, g.type), 0) + g.count
    used_typed: dict[GresKey, int] = {}
    used_name: dict[str, int] = {}
    for g in node.gres_used:
        used_name[g.name] = used_name.get(g.name, 0) + g.count
        if g.type is not None:
            used_typed[(g.name, g.type)] = used_typed.get((g.name, g.type), 0) + g.count
    out: dict[GresKey, int] = {}
    for name, count in total_name.items():
        out[(name, None)] = max(0, count - used_name.get(name, 0))
    for (name, gtype), count in total_typed.items():
        out[(name, gtype)] = max(0, min(count - used_typed.get((name, gtype), 0), out[(name, None)]))
    return tuple(sorted(out.items(), key=_gres_sort))


def fits(free: FreeGres | Mapping[GresKey, int], need: Need) -> bool:
    table = dict(free) if not isinstance(free, Mapping) else free
    return all(table.get(key, 0) >= count for key, count in need)


def add_gres(free: FreeGres, need: Need) -> FreeGres:
    """Free GRES after a job holding ``need`` on the node releases it (typed needs also free the name)."""
    table = dict(free)
    for (name, gtype), count in need:
        table[(name, gtype)] = table.get((name, gtype), 0) + count
        if gtype is not None:
            table[(name, None)] = table.get((name, None), 0) + count
    return tuple(sorted(table.items(), key=_gres_sort))


#: Flags of a node Slurm is switching off (or was asked to): never grown onto, whatever else it says.
_POWERING_DOWN_FLAGS = frozenset({"POWERING_DOWN", "POWER_DOWN"})
#: Flags that rule a powered-down node out as capacity (the resume would not give a usable node).
#: NOT_RESPONDING: a node left so by a failed resume (even once RESUMEd) is refused by Slurm's scheduler
#: (ReqNodeNotAvail, measured on 22.05) until it is powered down again (POWER_DOWN_FORCE).
_NOT_RESUMABLE_FLAGS = frozenset({"DRAIN", "FAIL", "MAINTENANCE", "RESERVED", "REBOOT_REQUESTED",
                                  "REBOOT_ISSUED", "POWERING_UP", "NOT_RESPONDING", *_POWERING_DOWN_FLAGS})


def is_resumable_node(node: Node) -> bool:
    """A node Slurm's power saving switched off (IDLE + POWERED_DOWN, as ``sinfo`` shows ``idle~``) that Slurm
    would resume for a job naming it: capacity with a resume cost (power_resume). A node powering down, drained
    or down is not."""
    return (node.state == "IDLE" and "POWERED_DOWN" in node.state_flags
            and not _NOT_RESUMABLE_FLAGS.intersection(node.state_flags))


def is_free_node(node: Node) -> bool:
    if not node.is_available or _NOT_FREE_FLAGS.intersection(node.state_flags):
        return False
    if node.state == "IDLE":
        return True
    return node.state == "MIXED" and node.gpus() > 0 and node.gpus_used() == 0


def is_planned_node(node: Node) -> bool:
    """An idle node Slurm's backfill has PLANNED for a waiting job, otherwise free (measured on 22.05: the nodes
    free behind a job that waits on Resources carry the flag, planned for that very job). Not free for a grow;
    free for the waiting jobs, first of all the one Slurm planned it for."""
    return (node.state == "IDLE" and "PLANNED" in node.state_flags
            and is_free_node(replace(node, state_flags=tuple(f for f in node.state_flags if f != "PLANNED"))))


class Status(enum.Enum):
    FREE = 0
    RESERVED = 1  # held for a pending job of higher priority
    GRANTED = 2  # given to a grow this cycle


@dataclass
class _Class:
    free: FreeGres
    size: int  # total free GRES units: best-fit order
    names: list[str]
    start: int = 0  # every node before this index is no longer FREE


class NodePool:
    """Mutable pool for one decide() call. Not shared, never returned."""

    def __init__(self, nodes: Sequence[Node], exclude: frozenset[str] = frozenset(),
                 select: Callable[[Node], bool] = is_free_node) -> None:
        self.status: dict[str, Status] = {}
        self.partitions_of: dict[str, tuple[str, ...]] = {}
        self.class_of: dict[str, FreeGres] = {}
        self.reserved_by: dict[str, int] = {}
        self._by_part: dict[str, dict[FreeGres, _Class]] = {}
        self._counts: dict[tuple[str, FreeGres, Status], int] = {}
        self._free_in_part: dict[str, int] = {}
        self._fit_cache: dict[tuple[FreeGres, Need], bool] = {}
        self._order: dict[str, list[_Class]] = {}
        for node in sorted(nodes, key=lambda n: natural_key(n.name)):
            if node.name in exclude or not select(node) or node.name in self.status:
                continue
            cls = free_gres(node)
            self.status[node.name] = Status.FREE
            self.partitions_of[node.name] = node.partitions
            self.class_of[node.name] = cls
            for part in node.partitions:
                classes = self._by_part.setdefault(part, {})
                entry = classes.get(cls)
                if entry is None:
                    entry = classes[cls] = _Class(cls, sum(c for _, c in cls), [])
                entry.names.append(node.name)
                key = (part, cls, Status.FREE)
                self._counts[key] = self._counts.get(key, 0) + 1
                self._free_in_part[part] = self._free_in_part.get(part, 0) + 1
        for part, classes in self._by_part.items():
            self._order[part] = sorted(classes.values(), key=lambda c: (c.size, c.free))

    def __len__(self) -> int:
        return len(self.status)

    def free_count(self, partition: str) -> int:
        """FREE nodes of ``partition`` (of any class)."""
        return self._free_in_part.get(partition, 0)

    def _fits(self, cls: FreeGres, need: Need) -> bool:
        key = (cls, need)
        hit = self._fit_cache.get(key)
        if hit is None:
            hit = self._fit_cache[key] = fits(cls, need)
        return hit

    def count_fit(self, partition: str, need: Need, status: Status = Status.FREE) -> int:
        total = 0
        for cls in self._order.get(partition, ()):
            if self._fits(cls.free, need):
                total += self._counts.get((partition, cls.free, status), 0)
        return total

    def _set(self, name: str, status: Status) -> None:
        old = self.status[name]
        self.status[name] = status
        cls = self.class_of[name]
        for part in self.partitions_of[name]:
            self._counts[(part, cls, old)] -= 1
            key = (part, cls, status)
            self._counts[key] = self._counts.get(key, 0) + 1
            if old is Status.FREE:
                self._free_in_part[part] -= 1

    def peek(self, partition: str, need: Need, count: int) -> list[str]:
        """The up to ``count`` FREE nodes that fit ``need`` that :meth:`take` would mark (no reserve), unmarked."""
        out: list[str] = []
        for cls in self._order.get(partition, ()):
            if len(out) >= count:
                break
            if self._fits(cls.free, need):
                out.extend(n for n in cls.names[cls.start:] if self.status[n] is Status.FREE)
        return out[:count]

    def take(
        self,
        partitions: Sequence[str],
        need: Need,
        count: int,
        *,
        status: Status,
        reserve: Mapping[str, int] | None = None,
        holder: int | None = None,
        prefer: Mapping[str, int] | None = None,
    ) -> list[str]:
        """Mark up to ``count`` FREE nodes that fit ``need`` as ``status``; best fit, then name order.

        With ``reserve`` (partition -> nodes to keep free), a node is skipped when taking it would leave fewer
        FREE nodes than that in any of its partitions. With ``prefer`` (node -> rank), nodes of a higher rank go
        first (a node not in it ranks 0); within a rank, best fit then name order.
        """
        taken: list[str] = []
        rank_of = dict(prefer or {})
        for rank in sorted({0, *rank_of.values()}, reverse=True):
            only = (lambda n, r=rank: rank_of.get(n, 0) == r) if rank_of else None
            for part in partitions:
                self._take_from(part, need, count, taken, status=status, reserve=reserve, holder=holder, only=only)
        return taken

    def _take_from(self, part: str, need: Need, count: int, taken: list[str], *, status: Status,
                   reserve: Mapping[str, int] | None, holder: int | None, only: Callable[[str], bool] | None) -> None:
        for cls in self._order.get(part, ()):
            if len(taken) >= count:
                return
            if not self._fits(cls.free, need) or self._counts.get((part, cls.free, Status.FREE), 0) == 0:
                continue
            names = cls.names
            while cls.start < len(names) and self.status[names[cls.start]] is not Status.FREE:
                cls.start += 1
            i = cls.start
            while i < len(names) and len(taken) < count:
                name = names[i]
                i += 1
                if self.status[name] is not Status.FREE or (only is not None and not only(name)):
                    continue
                if reserve and any(
                    self._free_in_part.get(p, 0) - 1 < reserve.get(p, 0) for p in self.partitions_of[name]
                ):
                    continue
                self._set(name, status)
                if holder is not None:
                    self.reserved_by[name] = holder
                taken.append(name)
