"""Each unit's progress for the policy (tail_protection, victim_by_service), from the resize journal.

The journal keeps every applied resize with its from/to node counts, so walking a unit's resizes back from its
current size gives the size it started with, how long it has run below it and the GPU-seconds it has held
(:func:`slurm_elastic.policy.unit_progress`). Nothing new is stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from slurm_elastic.policy import ElasticUnit, ResizeRecord, unit_progress


def journal_since(units: Iterable[ElasticUnit], now: datetime, recent: timedelta) -> datetime | None:
    """How far back the journal must be read for the units' whole lives, or None when ``recent`` covers them."""
    starts = [u.job.start_time for u in units if u.job.start_time is not None]
    oldest = min(starts, default=now)
    return oldest if oldest < now - recent else None


def with_progress(units: Sequence[ElasticUnit], history: Iterable[ResizeRecord], now: datetime
                  ) -> tuple[ElasticUnit, ...]:
    """``units`` with ``requested_nodes``, ``shrunk_s`` and ``attained_gpu_s`` filled from ``history`` (the
    journal of their lives, as the policy's ResizeRecords). A unit without a start time is left as it is."""
    by_unit: dict[int, list[ResizeRecord]] = {}
    for rec in history:
        by_unit.setdefault(rec.unit_id, []).append(rec)
    out: list[ElasticUnit] = []
    for u in units:
        if u.job.start_time is None:
            out.append(u)
            continue
        p = unit_progress(u.job.start_time, now, u.current_nodes, u.job.gpus_per_node(), by_unit.get(u.unit_id, ()))
        out.append(replace(u, requested_nodes=p.requested_nodes, shrunk_s=p.shrunk_s, attained_gpu_s=p.attained_gpu_s))
    return tuple(out)
