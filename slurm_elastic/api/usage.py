"""The ``usage`` read: what the state store knows about the elastic jobs of a reporting window, for
``slurm-elastic report`` (which joins it with Slurm's accounting).

Per elastic job: its extension jobs (their GPU-hours are the job's), its applied size changes (grows that
joined, shrinks and extension cancels: :func:`resize_time`), and its GPU
utilization from the controller's samples, downsampled to buckets of ``bucket_s`` seconds: per bucket the
GPU-seconds allocated and used (allocated x utilization). A sample stands for the time since the job's previous
sample, at most twice the job's median gap (a controller that was down does not stretch one sample over the
outage); a job's first sample for its median gap, or ``interval_s`` when it has one sample.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from typing import Any

from slurm_elastic.store import SqlStore
from slurm_elastic.store.journal_sql import JOINED_AT
from slurm_elastic.store.records import ActionKind, ActionRecord, ActionState, ElasticJobRecord, SampleRecord

RESIZE_KINDS = (ActionKind.GROW, ActionKind.SHRINK, ActionKind.CANCEL_EXTENSION)


def resize_time(a: ActionRecord) -> str | None:
    """When an applied action changed the job's size (ISO), or None when it never did: a grow changes it when its
    extension joins (controller/grants.py; one whose prewarm or resume failed never joined), a shrink or an
    extension cancel when it is applied."""
    if a.kind == ActionKind.GROW:
        joined = a.params.get(JOINED_AT)
        return joined if isinstance(joined, str) else None
    if a.kind == ActionKind.CANCEL_EXTENSION and (a.params.get("failed_grow") or a.params.get("recovery")):
        # the extension of a failed grow (controller/cancels.py) never joined, and reconcile's recoveries end a
        # duplicate, an orphan or one pending on a dead node: no size change
        return None
    return (a.finished_at or a.updated_at).isoformat()


def display_id(rec: ElasticJobRecord) -> str:
    """The job id as sacct prints it: ``8+1`` for a het component, else the raw id."""
    if rec.het_job_id is not None and rec.het_offset is not None:
        return f"{rec.het_job_id}+{rec.het_offset}"
    return str(rec.job_id)


def sample_weights(samples: list[SampleRecord], interval_s: float) -> list[float]:
    """Seconds each sample stands for (module docstring)."""
    times = [s.time.timestamp() for s in samples]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    median = statistics.median(gaps) if gaps else interval_s
    return [median] + [min(g, 2 * median) for g in gaps] if samples else []


def utilization_buckets(samples: list[SampleRecord], interval_s: float, origin: float,
                        bucket_s: float) -> list[list[float]]:
    """``[bucket index, GPU-seconds allocated, GPU-seconds used]`` per bucket with samples, oldest first."""
    out: dict[int, list[float]] = {}
    for s, dt in zip(samples, sample_weights(samples, interval_s), strict=True):
        b = int((s.time.timestamp() - origin) // bucket_s)
        row = out.setdefault(b, [float(b), 0.0, 0.0])
        row[1] += s.gpus_alloc * dt
        row[2] += s.gpus_alloc * dt * s.util_mean / 100.0
    return [out[b] for b in sorted(out)]


def usage(store: SqlStore, *, user: str | None, since: datetime, until: datetime, bucket_s: float,
          interval_s: float) -> dict[str, Any]:
    """Elastic jobs (of ``user`` only, unless None) seen by the controller between ``since`` and ``until``."""
    origin = since.timestamp()
    jobs = []
    for rec in store.jobs.list_jobs(active_only=False, user=user):
        # An active row is one the controller still sees: its last_seen is only its last change (observe_jobs).
        seen = rec.last_seen if rec.ended_at is not None else until
        if seen < since or rec.first_seen >= until:
            continue
        samples = store.samples.samples(rec.job_id, since=since, until=until)
        actions = store.journal.list_actions(job_id=rec.job_id, states=[ActionState.APPLIED])
        resizes = [{"kind": str(a.kind), "nodes": a.nodes, "gpus": a.gpus, "time": at}
                   for a in reversed(actions) if a.kind in RESIZE_KINDS and (at := resize_time(a)) is not None]
        extensions = [e.job_id for e in store.jobs.extensions(rec.job_id, active_only=False)]
        jobs.append({"job": display_id(rec), "user": rec.user, "account": rec.account,
                     "partition": rec.partition, "qos": rec.qos, "extensions": sorted(extensions),
                     "resizes": resizes, "util": utilization_buckets(samples, interval_s, origin, bucket_s)})
    return {"since": since.isoformat(), "bucket_s": bucket_s, "jobs": jobs}
