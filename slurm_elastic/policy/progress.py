"""A unit's progress so far, from its resize journal: the inputs of tail_protection and victim_by_service.

The controller knows a unit's current size and the applied resizes of its life (the journal); walking them back
from now gives the node count over time, hence the size the job started with (what it asked for), how long it
ran below that size, and the GPU-seconds it held (its attained service). The simulator counts the same things
on its own clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from slurm_elastic.policy.model import Outcome, ResizeRecord


@dataclass(frozen=True)
class Progress:
    requested_nodes: int
    shrunk_s: float
    attained_gpu_s: float


def unit_progress(start: datetime, now: datetime, current_nodes: int, gpus_per_node: int,
                  resizes: Iterable[ResizeRecord]) -> Progress:
    """Progress of a unit that started at ``start`` and holds ``current_nodes`` now.

    ``resizes`` are the unit's journal entries; only applied ones between ``start`` and ``now`` count, newest
    first, each taking the count back from ``to_nodes`` to ``from_nodes``. The size before the oldest of them is
    the requested size. Entries missing from the journal (pruned) make the older past look like the oldest
    size known, never an error.
    """
    applied = sorted((r for r in resizes if r.outcome is Outcome.APPLIED and start <= r.at <= now),
                     key=lambda r: r.at, reverse=True)
    segments: list[tuple[float, int]] = []  # (seconds, nodes), newest first
    count, until = current_nodes, now
    for rec in applied:
        segments.append(((until - rec.at).total_seconds(), count))
        count, until = rec.from_nodes, rec.at
    segments.append((max(0.0, (until - start).total_seconds()), count))
    requested = count
    shrunk = sum(s for s, n in segments if n < requested)
    attained = sum(s * n for s, n in segments) * gpus_per_node
    return Progress(requested, shrunk, attained)
