"""Per-job statistics over a sliding window of samples (pure: ``now`` is passed in, nothing is read).

Each sample contributes one :class:`JobPoint` per job: the job's devices and the utilization of each. A job's
devices are the GPUs it holds (prolog allocation) plus any it runs processes on, so a job holding two GPUs and
using one at 90% has a per-sample mean of 45%, and a job holding GPUs with no process shows 0%: exactly the
allocated-but-idle signal the controller acts on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from slurm_elastic.agent.payload import JobReport


@dataclass(frozen=True)
class JobPoint:
    """One job in one sample."""

    job_id: int
    devices: tuple[str, ...]  # sorted device ids (allocated or in use)
    allocated: tuple[str, ...]
    in_use: tuple[str, ...]
    util_by_device: tuple[tuple[str, float | None], ...]
    util_reason: str | None  # why some device has no utilization
    memory_used_mib: int
    sluid: str | None = None
    user: str | None = None
    account: str | None = None
    uid: int | None = None

    # Cached: each point is read at every sample while it stays in the window.
    @cached_property
    def util_mean(self) -> float | None:
        values = [u for _, u in self.util_by_device if u is not None]
        return sum(values) / len(values) if values else None

    @cached_property
    def util_max(self) -> float | None:
        values = [u for _, u in self.util_by_device if u is not None]
        return max(values) if values else None


Sample = tuple[float, Mapping[int, JobPoint]]


def aggregate_jobs(samples: Sequence[Sample], now: float, window_s: float) -> tuple[JobReport, ...]:
    """Reports for the jobs of the latest sample, with statistics over the samples taken in (now-window, now].

    Jobs absent from the latest sample are gone (ended, or released their GPUs) and are not reported.
    """
    if not samples:
        return ()
    start = now - window_s
    window = [(t, pts) for t, pts in samples if start < t <= now]
    latest_t, latest = samples[-1]
    reports = []
    for job_id in sorted(latest):
        last = latest[job_id]
        series = [(t, pts[job_id]) for t, pts in window if job_id in pts] or [(latest_t, last)]
        means = [m for _, p in series if (m := p.util_mean) is not None]
        maxes = [m for _, p in series if (m := p.util_max) is not None]
        util_last = last.util_mean
        reports.append(JobReport(
            job_id=job_id,
            sluid=last.sluid,
            user=last.user,
            account=last.account,
            uid=last.uid,
            devices=last.devices,
            gpus_allocated=len(last.allocated),
            gpus_in_use=len(last.in_use),
            util_mean_percent=round(sum(means) / len(means), 3) if means else None,
            util_max_percent=max(maxes) if maxes else None,
            util_last_percent=round(util_last, 3) if util_last is not None else None,
            utilization_reason=None if util_last is not None else (last.util_reason or "no_utilization"),
            memory_used_mib=last.memory_used_mib,
            memory_max_mib=max(p.memory_used_mib for _, p in series),
            sample_count=len(series),
            util_sample_count=len(means),
            first_sample_at=series[0][0],
            last_sample_at=series[-1][0],
        ))
    return tuple(reports)


class JobHistory:
    """The samples of the last ``window_s`` seconds (the only mutable piece; still no clock of its own)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[Sample] = deque()

    def add(self, t: float, points: Sequence[JobPoint]) -> None:
        self._samples.append((t, {p.job_id: p for p in points}))
        while self._samples and self._samples[0][0] <= t - self.window_s:
            self._samples.popleft()

    def jobs(self, now: float) -> tuple[JobReport, ...]:
        return aggregate_jobs(list(self._samples), now, self.window_s)

    def __len__(self) -> int:
        return len(self._samples)
