"""The walk's victim orders (rule walk) and its small containers: node info on demand, a list scanned many times
(policy/walk.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Generic, TypeVar

from slurm_elastic.policy.capacity import (
    FreeGres,
    Need,
    free_gres,
)
from slurm_elastic.policy.work import UnitWork
from slurm_elastic.slurm.model import Node


def victim_key(w: UnitWork, grow_rank: Mapping[datetime, int]) -> tuple[int, int, float, int, int]:
    """Lowest priority first, then lowest measured efficiency (unknown after known), then most recently grown
    (never grown last), then unit id."""
    eff = w.efficiency
    rank = grow_rank.get(w.last_grow) if w.last_grow is not None else None
    return (
        w.priority,
        0 if eff is not None else 1,
        eff if eff is not None else 0.0,
        -rank if rank is not None else 1,
        w.unit_id,
    )


def marginal_loss(w: UnitWork) -> float:
    """The share of its speed a unit loses per node taken: its efficiency (marginal with goodput, else
    utilization; unknown counts as 1) over its current nodes."""
    eff = w.efficiency if w.efficiency is not None else 1.0
    return eff / max(1, w.current)


def _exhausted(w: UnitWork) -> bool:
    """No node left to give back to pending jobs above its admit floor (``taken`` only grows during a walk: it
    stays so)."""
    return w.current - max(w.unit.min_nodes, w.admit_floor) - w.taken <= 0 or w.taken >= len(w.removal())


def service_key(w: UnitWork) -> tuple[float, float, int, int]:
    """victim_by_service: least marginal loss first (to two decimals, so that near-equal losses fall to the
    next key), then most attained service (GPU-seconds; unknown last), then lowest priority, then unit id."""
    attained = w.unit.attained_gpu_s
    return (round(marginal_loss(w), 2), -attained if attained is not None else 0.0, w.priority, w.unit_id)


def added_time_s(w: UnitWork, now: datetime) -> float | None:
    """victim_by_remaining: the seconds losing one node adds to the unit at linear scaling (remaining time by
    its time limit / (nodes - 1)); None when its time limit or start is unknown."""
    remaining = w.unit.job.remaining_seconds(now)
    if remaining is None:
        return None
    return max(0.0, remaining) / max(1, w.current - 1)


def remaining_key(w: UnitWork, now: datetime) -> tuple[int, float, int, int]:
    """victim_by_remaining: least added time first (unknown last), then lowest priority, then unit id."""
    added = added_time_s(w, now)
    return (0 if added is not None else 1, added if added is not None else 0.0, w.priority, w.unit_id)


class _NodeInfo:
    """Free GRES and partitions of any node of the snapshot (not only free ones), computed on demand."""

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        self._nodes = {n.name: n for n in nodes}
        self._free: dict[str, FreeGres] = {}

    def free(self, name: str) -> FreeGres | None:
        hit = self._free.get(name)
        if hit is None:
            node = self._nodes.get(name)
            if node is None:
                return None
            hit = self._free[name] = free_gres(node)
        return hit

    def node(self, name: str) -> Node | None:
        return self._nodes.get(name)

    def partitions(self, name: str) -> tuple[str, ...]:
        node = self._nodes.get(name)
        return node.partitions if node is not None else ()


_T = TypeVar("_T")


class _Live(Generic[_T]):
    """A list that is scanned from the front many times (once per pending job) and whose entries, once dead
    (``dead`` true), stay dead: a scan skips them through next-pointers with path halving, so the scans of a
    walk cost the live entries they visit, not the whole list each time (victims with no surplus left, nodes
    already claimed)."""

    def __init__(self, items: Sequence[_T], dead: Callable[[_T], bool]) -> None:
        self._items = items
        self._next = list(range(len(items) + 1))  # next[i]: no live entry in [i, next[i]); next[n] == n
        self._dead = dead

    def __iter__(self) -> Iterator[_T]:
        items, nxt, dead, n = self._items, self._next, self._dead, len(self._items)
        i = 0
        while True:
            while nxt[i] != i:
                nxt[i] = nxt[nxt[i]]
                i = nxt[i]
            if i >= n:
                return
            item = items[i]
            if dead(item):
                nxt[i] = i + 1
            else:
                yield item
            i += 1


def _need_text(need: Need) -> str:
    return ",".join(f"{n}:{t}:{c}" if t else f"{n}:{c}" for (n, t), c in need) or "no GRES"


