"""Downsampled per-job utilization: one row per job per controller interval (the controller aggregates)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select

from slurm_elastic.store.database import Database, require_aware
from slurm_elastic.store.errors import StoreInputError
from slurm_elastic.store.models import SampleColumns
from slurm_elastic.store.records import NewSample, SampleRecord


def sample_record(row: SampleColumns) -> SampleRecord:
    return SampleRecord(id=row.id, job_id=row.job_id, time=row.time, util_mean=row.util_mean,
                        util_max=row.util_max, gpus_alloc=row.gpus_alloc, gpus_in_use=row.gpus_in_use,
                        sample_count=row.sample_count)


def _check(x: NewSample) -> None:
    require_aware(x.time, f"sample time of job {x.job_id}")
    for name, v in (("util_mean", x.util_mean), ("util_max", x.util_max)):
        if not math.isfinite(v) or not 0.0 <= v <= 100.0:
            raise StoreInputError(f"sample of job {x.job_id}: {name} must be within 0..100, got {v}")
    if min(x.gpus_alloc, x.gpus_in_use, x.sample_count) < 0:
        raise StoreInputError(f"sample of job {x.job_id}: counts must be >= 0")


class SqlSamples:
    def __init__(self, db: Database) -> None:
        self._db = db

    def add_samples(self, samples: Sequence[NewSample]) -> int:
        """Store samples in one transaction; how many."""
        for x in samples:
            _check(x)
        if not samples:
            return 0
        S = self._db.models.sample
        with self._db.write("record samples") as s:
            s.add_all([S(job_id=x.job_id, time=x.time, util_mean=x.util_mean, util_max=x.util_max,
                         gpus_alloc=x.gpus_alloc, gpus_in_use=x.gpus_in_use, sample_count=x.sample_count)
                       for x in samples])
        return len(samples)

    def samples(self, job_id: int, since: datetime | None = None, until: datetime | None = None,
                limit: int | None = None) -> list[SampleRecord]:
        """Oldest first."""
        S = self._db.models.sample
        stmt = select(S).where(S.job_id == job_id)
        if since is not None:
            stmt = stmt.where(S.time >= require_aware(since, "since"))
        if until is not None:
            stmt = stmt.where(S.time < require_aware(until, "until"))
        stmt = stmt.order_by(S.time, S.id)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._db.read("list samples") as s:
            return [sample_record(r) for r in s.execute(stmt).scalars()]
