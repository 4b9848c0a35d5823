"""Figures of merit of one run.

* JCT = completion - submission. ``p50_jct``/``p99_jct`` use the "lower" percentile: the value at index
  ``floor(q * (n - 1))`` of the sorted JCTs (numpy's ``method="lower"``), the convention under which the
  Pollux artifact's published p99 for workload-6 (32,383 s) is reproduced. ``jct_std`` is the population
  standard deviation.
* ``makespan`` = last completion - first submission; utilizations are taken over that window.
* ``avg_wait`` = mean of first start - submission.
* ``gpu_util`` (allocated) = GPU-seconds held by jobs / (cluster GPUs x makespan).
* ``effective_gpu_util`` = GPU-seconds spent computing (held x the model's compute share of a step, nothing
  while a job restarts) / (cluster GPUs x makespan).
* ``starvation`` = jobs whose wait exceeded ``starvation_threshold`` seconds (default 4 hours).
* ``resizes`` = applied resizes per job (mean).
* ``partial_free_gpus`` / ``stranded_gpus`` = time-weighted means over the makespan window of the free GPUs on
  partly used nodes and of those no waiting job could use (:mod:`slurm_elastic.policy.fragmentation`; the
  engine's samples, :attr:`SimResult.stranded`).

:func:`job_stats` (JCT and wait distributions, starvation) and :func:`weighted_mean_var` are the formulas
:func:`summarize` uses; ``slurm-elastic report`` and ``whatif`` apply the same ones to the jobs Slurm's
accounting recorded, so a report and a replay are measured alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from slurm_elastic.sim.engine import SimResult

DEFAULT_STARVATION_THRESHOLD = 4 * 3600.0


@dataclass(frozen=True)
class Metrics:
    avg_jct: float
    p50_jct: float
    p99_jct: float
    jct_std: float
    makespan: float
    avg_wait: float
    gpu_util: float
    effective_gpu_util: float
    starvation: int
    resizes: float
    jobs: int
    partial_free_gpus: float = 0.0
    stranded_gpus: float = 0.0

    def as_dict(self, digits: int = 3) -> dict[str, float | int]:
        return {k: (round(v, digits) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def percentile_lower(values: Sequence[float], q: float) -> float:
    """The value at index floor(q/100 * (n - 1)) of the sorted values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[math.floor(q / 100.0 * (len(ordered) - 1) + 1e-9)]


@dataclass(frozen=True)
class JobStats:
    """Distributions over finished jobs: JCT (completion - submission) and wait (first start - submission)."""

    jobs: int
    jct_mean: float
    jct_std: float  # population standard deviation
    jct_p50: float
    jct_p99: float
    wait_mean: float
    wait_p50: float
    wait_p99: float
    starved: int  # jobs whose wait exceeded the starvation threshold


def job_stats(jcts: Sequence[float], waits: Sequence[float],
              starvation_threshold: float = DEFAULT_STARVATION_THRESHOLD) -> JobStats:
    """The statistics of :class:`JobStats`, with :func:`percentile_lower` percentiles; all 0 without jobs."""
    if len(jcts) != len(waits):
        raise ValueError(f"{len(jcts)} JCTs but {len(waits)} waits")
    if not jcts:
        return JobStats(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    mean, var = weighted_mean_var(jcts)
    return JobStats(
        jobs=len(jcts),
        jct_mean=mean,
        jct_std=math.sqrt(var),
        jct_p50=percentile_lower(jcts, 50),
        jct_p99=percentile_lower(jcts, 99),
        wait_mean=sum(waits) / len(waits),
        wait_p50=percentile_lower(waits, 50),
        wait_p99=percentile_lower(waits, 99),
        starved=sum(1 for w in waits if w > starvation_threshold),
    )


def weighted_mean_var(values: Sequence[float], weights: Sequence[float] | None = None) -> tuple[float, float]:
    """Mean and population variance of ``values`` (each counted ``weight`` times); (0, 0) when empty."""
    w = [1.0] * len(values) if weights is None else list(weights)
    total = sum(w)
    if total <= 0:
        return 0.0, 0.0
    mean = sum(x * k for x, k in zip(values, w, strict=True)) / total
    return mean, sum(k * (x - mean) ** 2 for x, k in zip(values, w, strict=True)) / total


def time_weighted(samples: Sequence[tuple[float, ...]], column: int, start: float, end: float) -> float:
    """Mean over [start, end] of a step function given as (time, value...) samples at each change (the value
    before the first sample is 0)."""
    if end <= start:
        return 0.0
    total = 0.0
    value, at = 0.0, start
    for sample in samples:
        t = min(max(sample[0], start), end)
        total += value * (t - at)
        value, at = float(sample[column]), t
    total += value * (end - at)
    return total / (end - start)


def summarize(result: SimResult, starvation_threshold: float = DEFAULT_STARVATION_THRESHOLD) -> Metrics:
    jobs = result.jobs
    if not jobs:
        return Metrics(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, 0)
    stats = job_stats([j.jct for j in jobs], [j.wait for j in jobs], starvation_threshold)
    first = min(j.submit_time for j in jobs)
    last = max(j.end_time for j in jobs)
    makespan = last - first
    capacity = result.config.total_gpus * makespan
    held = sum(u.gpus * (u.end - u.start) for u in result.usage)
    busy = sum(u.busy_gpus * (u.end - u.start) for u in result.usage)
    return Metrics(
        avg_jct=stats.jct_mean,
        p50_jct=stats.jct_p50,
        p99_jct=stats.jct_p99,
        jct_std=stats.jct_std,
        makespan=makespan,
        avg_wait=stats.wait_mean,
        gpu_util=held / capacity if capacity > 0 else 0.0,
        effective_gpu_util=busy / capacity if capacity > 0 else 0.0,
        starvation=stats.starved,
        resizes=sum(j.resizes for j in jobs) / len(jobs),
        jobs=len(jobs),
        partial_free_gpus=time_weighted(result.stranded, 1, first, last),
        stranded_gpus=time_weighted(result.stranded, 2, first, last),
    )


#: JCTs below this count as this long when comparing one job's two runs, so that a one-minute job delayed by
#: one cycle does not count as twice as late.
SLOWDOWN_FLOOR_S = 600.0


@dataclass(frozen=True)
class Slowdown:
    """Per job, elastic JCT over rigid JCT of the same trace (both floored at ``floor_s``): the share of jobs
    that finished later than under rigid, later by more than 1.25x and by more than 2x, and the worst ratio."""

    jobs: int
    later: float
    later_125: float
    later_2: float
    worst: float
    worst_job: str
    floor_s: float

    def as_dict(self, digits: int = 4) -> dict[str, float | int | str]:
        return {k: (round(v, digits) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def slowdown(baseline: SimResult, elastic: SimResult, floor_s: float = SLOWDOWN_FLOOR_S) -> Slowdown:
    """Per-job slowdown of ``elastic`` against ``baseline`` (jobs matched by id; both runs finish every job)."""
    rigid = {j.job_id: j.jct for j in baseline.jobs}
    ratios: list[tuple[float, str]] = []
    for job in elastic.jobs:
        base = rigid.get(job.job_id)
        if base is None:
            raise ValueError(f"job {job.job_id} is in the elastic run but not in the baseline")
        ratios.append((max(job.jct, floor_s) / max(base, floor_s), job.job_id))
    if not ratios:
        return Slowdown(0, 0.0, 0.0, 0.0, 1.0, "", floor_s)
    n = len(ratios)
    worst, worst_job = max(ratios, key=lambda r: (r[0], r[1]))
    return Slowdown(
        jobs=n,
        later=sum(1 for r, _ in ratios if r > 1.0 + 1e-9) / n,
        later_125=sum(1 for r, _ in ratios if r > 1.25) / n,
        later_2=sum(1 for r, _ in ratios if r > 2.0) / n,
        worst=worst,
        worst_job=worst_job,
        floor_s=floor_s,
    )
