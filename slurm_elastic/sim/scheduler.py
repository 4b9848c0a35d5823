"""The base scheduler: which pending jobs start this cycle. Pure functions on GPU counts, no I/O.

Jobs are rigid (they start at the size they asked for) and ordered by priority: submission time, then trace
order (Slurm's age factor with every other factor equal). Admission counts GPUs, not node shapes: placement is
GPU-granular (see :mod:`slurm_elastic.sim.cluster`), so a job fits whenever enough GPUs are free.

``fifo``
    Strict FIFO: start jobs in priority order and stop at the first that does not fit.
``greedy``
    FIFO with greedy backfill, as in the Pollux artifact's FIFO baseline: walk the whole queue in priority
    order and start every job that fits in what is still free. There is no reservation, so a large job can wait
    while smaller, later jobs keep taking the GPUs that free up.
``backfill``
    EASY backfill (Slurm's ``sched/backfill`` with a single reservation): start jobs in order until one does
    not fit; reserve for that head job the earliest time at which enough GPUs will be free, from running jobs'
    expected ends (start + time limit); then start a later job only if it fits now and either ends (by its own
    time limit) before that time, or uses only GPUs the head job will not need.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

SchedulerKind = Literal["fifo", "greedy", "backfill"]
SCHEDULERS: tuple[SchedulerKind, ...] = ("fifo", "greedy", "backfill")


@dataclass(frozen=True)
class PendingJob:
    key: int
    gpus: int
    time_limit: float  # the estimate backfill trusts, in seconds


@dataclass(frozen=True)
class RunningJob:
    key: int
    gpus: int
    expected_end: float  # start + time limit; may lie in the past for a job that overran


def plan(
    kind: SchedulerKind,
    pending: Sequence[PendingJob],
    running: Sequence[RunningJob],
    free_gpus: int,
    now: float,
) -> list[int]:
    """Keys of the pending jobs (given in priority order) to start now, in the order they start."""
    if kind == "fifo":
        return _fifo(pending, free_gpus)
    if kind == "greedy":
        return _greedy(pending, free_gpus)
    return _easy(pending, running, free_gpus, now)


def _fifo(pending: Sequence[PendingJob], free: int) -> list[int]:
    started: list[int] = []
    for job in pending:
        if job.gpus > free:
            break
        started.append(job.key)
        free -= job.gpus
    return started


def _greedy(pending: Sequence[PendingJob], free: int) -> list[int]:
    started: list[int] = []
    for job in pending:
        if free == 0:
            break  # nothing further can fit
        if job.gpus <= free:
            started.append(job.key)
            free -= job.gpus
    return started


def _easy(pending: Sequence[PendingJob], running: Sequence[RunningJob], free: int, now: float) -> list[int]:
    started: list[int] = []
    index = 0
    while index < len(pending) and pending[index].gpus <= free:
        started.append(pending[index].key)
        free -= pending[index].gpus
        index += 1
    if index >= len(pending):
        return started
    head = pending[index]
    # Running jobs, including those just started, free their GPUs at their expected end.
    ends = [(max(r.expected_end, now), r.gpus) for r in running]
    ends.extend((now + job.time_limit, job.gpus) for job in pending[:index])
    ends.sort()
    available = free
    shadow = float("inf")
    for end, gpus in ends:
        available += gpus
        if available >= head.gpus:
            shadow = end
            break
    extra = available - head.gpus if shadow != float("inf") else 0
    for position in range(index + 1, len(pending)):
        job = pending[position]
        if free == 0:
            break
        if job.gpus > free:
            continue
        if now + job.time_limit <= shadow:
            started.append(job.key)
            free -= job.gpus
        elif job.gpus <= extra:
            started.append(job.key)
            free -= job.gpus
            extra -= job.gpus
    return started
