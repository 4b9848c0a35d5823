"""What the jobs that ran did (pure): the figures of ``slurm-elastic report`` and ``whatif``.

Inputs are the finished GPU jobs of Slurm's accounting
(:class:`~slurm_elastic.sim.loaders.sacct.AccountingJob`) and the controller's ``usage`` answer
(:mod:`slurm_elastic.api.usage`): which jobs were elastic, their extension jobs, resizes and sampled
utilization. The JCT, wait and starvation formulas are the simulator's (:func:`slurm_elastic.sim.metrics.job_stats`),
so a report and a replay (:func:`replay_row`) measure alike.

* A job is counted in the window when it **ended** in it. JCT = last end - first submission; wait = first start -
  submission.
* ``gpu_hours``: what the job held over time: GPUs x time at each size its sacct records show (a shrink in
  place is a ``RESIZING`` record at the old size, then the new size from the resize on), plus its extension jobs'
  held the same way (an extension job is part of its elastic job, never a job of its own).
* ``gpu_hours_sampled`` / ``gpu_hours_used``: allocated GPU-hours the controller sampled, and those x utilization.
  Only elastic jobs are sampled; rigid jobs leave these and ``util_*`` empty.
* ``util_mean`` / ``util_var``: GPU utilization (0..1) weighted by GPU-seconds over every (job, bucket) of the
  samples, so the variance is across jobs and over time.
* ``resizes``: applied size changes: grows whose extension joined the job, applied shrinks and extension
  cancels (the journal's; a grow whose prewarm or resume failed never changed the size).
* ``node_hours_moved``: the integral over the job's run of |nodes now - nodes at start|, the node-hours its
  resizes took away or lent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from slurm_elastic.sim.engine import SimResult
from slurm_elastic.sim.loaders.sacct import AccountingJob
from slurm_elastic.sim.metrics import DEFAULT_STARVATION_THRESHOLD, job_stats, weighted_mean_var

GROUP_KEYS = ("account", "partition", "qos", "user")
KINDS = ("elastic", "rigid", "all")
COLUMNS = ("group", "kind", "jobs", "completed", "gpu_hours", "gpu_hours_sampled", "gpu_hours_used",
           "jct_mean_s", "jct_std_s", "jct_p50_s", "jct_p99_s", "wait_mean_s", "wait_p50_s", "wait_p99_s",
           "starved", "util_mean", "util_var", "resizes", "node_hours_moved")


@dataclass(frozen=True)
class JobFacts:
    """One finished job, with what the controller knew of it."""

    job_id: str
    user: str
    account: str
    partition: str
    qos: str
    state: str
    submit: float  # seconds since the epoch
    start: float
    end: float
    gpu_seconds: float
    elastic: bool
    resizes: int = 0
    node_seconds_moved: float = 0.0
    util: tuple[tuple[float, float, float], ...] = field(default=())  # (bucket, GPU-s allocated, GPU-s used)

    @property
    def jct(self) -> float:
        return self.end - self.submit

    @property
    def wait(self) -> float:
        return max(0.0, self.start - self.submit)


def local_epoch(printed: float) -> float:
    """The epoch of a time sacct printed in the host's local time, given as the loader reads it (as if UTC)."""
    return datetime.fromtimestamp(printed, UTC).replace(tzinfo=None).astimezone().timestamp()


def node_seconds_moved(resizes: Sequence[Mapping[str, Any]], end: float) -> float:
    """Integral of |nodes - nodes at start| from the first resize to ``end`` (grow: +nodes, else -nodes)."""
    events = sorted((datetime.fromisoformat(r["time"]).timestamp(),
                     int(r["nodes"]) if r["kind"] == "grow" else -int(r["nodes"])) for r in resizes)
    total, delta = 0.0, 0
    for i, (t, change) in enumerate(events):
        delta += change
        upto = min(end, events[i + 1][0]) if i + 1 < len(events) else end
        total += abs(delta) * max(0.0, upto - t)
    return total


def job_facts(jobs: Iterable[AccountingJob], usage: Mapping[str, Any] | None,
              to_epoch: Callable[[float], float] = local_epoch) -> tuple[list[JobFacts], int]:
    """Facts per job, and how many extension jobs were folded into their elastic jobs."""
    elastic = {str(j["job"]): j for j in (usage or {}).get("jobs", [])}
    parent_of = {str(e): key for key, j in elastic.items() for e in j.get("extensions", [])}
    acct = list(jobs)
    extension_seconds: dict[str, float] = {}
    for a in acct:
        if a.spec.job_id in parent_of:
            parent = parent_of[a.spec.job_id]
            extension_seconds[parent] = extension_seconds.get(parent, 0.0) + a.gpu_seconds
    out: list[JobFacts] = []
    for a in acct:
        if a.spec.job_id in parent_of:
            continue
        u = elastic.get(a.spec.job_id)
        end = to_epoch(a.end)
        resizes = list(u["resizes"]) if u else []
        out.append(JobFacts(
            job_id=a.spec.job_id, user=a.spec.user or "", account=a.spec.account or "",
            partition=a.spec.partition or "", qos=a.qos or "", state=a.state,
            submit=to_epoch(a.spec.submit_time), start=to_epoch(a.start), end=end,
            gpu_seconds=a.gpu_seconds + extension_seconds.get(a.spec.job_id, 0.0),
            elastic=u is not None, resizes=len(resizes),
            node_seconds_moved=node_seconds_moved(resizes, end),
            util=tuple((float(b), float(alloc), float(used)) for b, alloc, used in (u["util"] if u else []))))
    return out, sum(1 for a in acct if a.spec.job_id in parent_of)


def in_window(facts: Iterable[JobFacts], since: datetime, until: datetime) -> list[JobFacts]:
    lo, hi = since.timestamp(), until.timestamp()
    return [f for f in facts if lo <= f.end < hi]


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def group_row(group: str, kind: str, facts: Sequence[JobFacts],
              starvation_threshold: float = DEFAULT_STARVATION_THRESHOLD) -> dict[str, Any]:
    """One row of the report (keys: :data:`COLUMNS`); None where nothing was measured."""
    stats = job_stats([f.jct for f in facts], [f.wait for f in facts], starvation_threshold)
    points = [(used / alloc, alloc) for f in facts for _, alloc, used in f.util if alloc > 0]
    sampled = sum(alloc for f in facts for _, alloc, _ in f.util)
    used = sum(u for f in facts for _, _, u in f.util)
    mean, var = weighted_mean_var([p[0] for p in points], [p[1] for p in points])
    return {
        "group": group, "kind": kind, "jobs": stats.jobs,
        "completed": sum(1 for f in facts if f.state == "COMPLETED"),
        "gpu_hours": round(sum(f.gpu_seconds for f in facts) / 3600, 3),
        "gpu_hours_sampled": round(sampled / 3600, 3) if points else None,
        "gpu_hours_used": round(used / 3600, 3) if points else None,
        "jct_mean_s": round(stats.jct_mean, 1), "jct_std_s": round(stats.jct_std, 1),
        "jct_p50_s": stats.jct_p50, "jct_p99_s": stats.jct_p99, "wait_mean_s": round(stats.wait_mean, 1),
        "wait_p50_s": stats.wait_p50, "wait_p99_s": stats.wait_p99, "starved": stats.starved,
        "util_mean": _round(mean, 4) if points else None, "util_var": _round(var, 6) if points else None,
        "resizes": sum(f.resizes for f in facts),
        "node_hours_moved": round(sum(f.node_seconds_moved for f in facts) / 3600, 3),
    }


def report_rows(facts: Sequence[JobFacts], by: str | None,
                starvation_threshold: float = DEFAULT_STARVATION_THRESHOLD) -> list[dict[str, Any]]:
    """Per group (``by`` one of :data:`GROUP_KEYS`, or one group "all"): elastic, rigid and all jobs."""
    if by is not None and by not in GROUP_KEYS:
        raise ValueError(f"cannot group by {by!r}: use one of {', '.join(GROUP_KEYS)}")
    groups: dict[str, list[JobFacts]] = {} if by else {"all": []}
    for f in facts:
        groups.setdefault((getattr(f, by) or "-") if by else "all", []).append(f)
    rows = []
    for name in sorted(groups):
        members = groups[name]
        for kind in KINDS:
            chosen = [f for f in members if kind == "all" or f.elastic == (kind == "elastic")]
            rows.append(group_row(name, kind, chosen, starvation_threshold))
    return rows


def replay_row(kind: str, result: SimResult, starvation_threshold: float = DEFAULT_STARVATION_THRESHOLD
               ) -> dict[str, Any]:
    """A simulated run measured like :func:`group_row` (allocated and used GPU-hours from the model; resizes and
    node-hours moved from its usage intervals, nodes = GPUs / GPUs per node)."""
    jobs = result.jobs
    stats = job_stats([j.jct for j in jobs], [j.wait for j in jobs], starvation_threshold)
    held = sum(u.gpus * (u.end - u.start) for u in result.usage)
    busy = sum(u.busy_gpus * (u.end - u.start) for u in result.usage)
    points = [(u.busy_gpus / u.gpus, u.gpus * (u.end - u.start)) for u in result.usage if u.gpus > 0]
    mean, var = weighted_mean_var([p[0] for p in points], [p[1] for p in points])
    first: dict[int, int] = {}
    moved = 0.0
    for u in sorted(result.usage, key=lambda u: (u.job, u.start)):
        first.setdefault(u.job, u.gpus)
        moved += abs(u.gpus - first[u.job]) * (u.end - u.start) / result.config.gpus_per_node
    return {
        "group": "replay", "kind": kind, "jobs": stats.jobs, "completed": stats.jobs,
        "gpu_hours": round(held / 3600, 3), "gpu_hours_sampled": round(held / 3600, 3),
        "gpu_hours_used": round(busy / 3600, 3),
        "jct_mean_s": round(stats.jct_mean, 1), "jct_std_s": round(stats.jct_std, 1),
        "jct_p50_s": stats.jct_p50, "jct_p99_s": stats.jct_p99, "wait_mean_s": round(stats.wait_mean, 1),
        "wait_p50_s": stats.wait_p50, "wait_p99_s": stats.wait_p99, "starved": stats.starved,
        "util_mean": round(mean, 4) if points else None, "util_var": round(var, 6) if points else None,
        "resizes": sum(j.resizes for j in jobs), "node_hours_moved": round(moved / 3600, 3),
    }


def utilization_series(facts: Sequence[JobFacts], bucket_s: float, origin: float) -> list[tuple[float, float]]:
    """(bucket start in seconds since the epoch, GPU-weighted utilization 0..1) over the sampled jobs."""
    per: dict[float, list[float]] = {}
    for f in facts:
        for b, alloc, used in f.util:
            acc = per.setdefault(b, [0.0, 0.0])
            acc[0] += alloc
            acc[1] += used
    return [(origin + b * bucket_s, used / alloc) for b, (alloc, used) in sorted(per.items()) if alloc > 0]
