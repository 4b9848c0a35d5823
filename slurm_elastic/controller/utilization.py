"""Per-unit utilization for the policy, from the samples the controller stored cycle after cycle.

Each cycle stores at most one sample per unit: the agents' window means merged over all the unit's nodes
(:func:`~slurm_elastic.controller.collect.merge_job`), stamped with the *oldest* agent sample time, and only when
every node of the unit reported it (partial coverage stores nothing, so a silent agent makes the unit's metrics
go stale instead of skewing them). The policy then gets the mean and max over the unit's window, how much of
the window the samples cover, and when the newest one was taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from slurm_elastic.policy import JobUtilization
from slurm_elastic.store.records import SampleRecord


def window_query_start(now: datetime, window_s: float, interval_s: float) -> datetime:
    """Samples are read from two cycles before the window, so that a window of N seconds is seen as filled by
    samples taken every ``interval_s`` whatever the phase between cycles and agent samples (the oldest sample
    marks the window's start; the mean then spans at most two extra cycles)."""
    return now - timedelta(seconds=window_s + 2 * interval_s)


def utilization_from_samples(unit_id: int, samples: Sequence[SampleRecord], gpus_allocated: int,
                             gpus_in_use: int) -> JobUtilization | None:
    if not samples:
        return None
    ordered = sorted(samples, key=lambda s: s.time)
    covered = (ordered[-1].time - ordered[0].time).total_seconds()
    return JobUtilization(
        unit_id=unit_id,
        mean_util=sum(s.util_mean for s in ordered) / len(ordered),
        max_util=max(s.util_max for s in ordered),
        window_s=covered,
        samples=len(ordered),
        last_sample_at=ordered[-1].time,
        gpus_allocated=gpus_allocated,
        gpus_in_use=gpus_in_use,
    )
