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

    def as_dict(self, digits: int = 3) -> dict[str, float | int]:
        return {k: (round(v, digits) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def percentile_lower(values: Sequence[float], q: float) -> float:
    """The value at index floor(q/100 * (n - 1)) of the sorted values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[math.floor(q / 100.0 * (len(ordered) - 1) + 1e-9)]


def summarize(result: SimResult, starvation_threshold: float = DEFAULT_STARVATION_THRESHOLD) -> Metrics:
    jobs = result.jobs
    if not jobs:
        return Metrics(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, 0)
    jcts = [j.jct for j in jobs]
    mean = sum(jcts) / len(jcts)
    std = math.sqrt(sum((x - mean) ** 2 for x in jcts) / len(jcts))
    first = min(j.submit_time for j in jobs)
    last = max(j.end_time for j in jobs)
    makespan = last - first
    capacity = result.config.total_gpus * makespan
    held = sum(u.gpus * (u.end - u.start) for u in result.usage)
    busy = sum(u.busy_gpus * (u.end - u.start) for u in result.usage)
    return Metrics(
        avg_jct=mean,
        p50_jct=percentile_lower(jcts, 50),
        p99_jct=percentile_lower(jcts, 99),
        jct_std=std,
        makespan=makespan,
        avg_wait=sum(j.wait for j in jobs) / len(jobs),
        gpu_util=held / capacity if capacity > 0 else 0.0,
        effective_gpu_util=busy / capacity if capacity > 0 else 0.0,
        starvation=sum(1 for j in jobs if j.wait > starvation_threshold),
        resizes=sum(j.resizes for j in jobs) / len(jobs),
        jobs=len(jobs),
    )
