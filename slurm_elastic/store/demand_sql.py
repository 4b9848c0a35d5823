"""Serving units' demand history: one row per service per slot (docs/serving.md, "Demand forecast")."""

from __future__ import annotations

import math
from datetime import datetime

from sqlalchemy import select

from slurm_elastic.store.database import Database, require_aware
from slurm_elastic.store.errors import StoreInputError
from slurm_elastic.store.models import DemandColumns
from slurm_elastic.store.records import DemandRecord


def _record(row: DemandColumns) -> DemandRecord:
    return DemandRecord(service=row.service, job_id=row.job_id, slot=row.slot, requests_per_s=row.requests_per_s,
                        p99_ms=row.p99_ms, replicas=row.replicas)


class SqlDemand:
    def __init__(self, db: Database) -> None:
        self._db = db

    def add_demand(self, rec: DemandRecord) -> None:
        """Store one slot; a slot already stored for the service is left as it is (a restarted controller)."""
        require_aware(rec.slot, f"demand slot of {rec.service}")
        if not rec.service or len(rec.service) > 255:
            raise StoreInputError(f"demand: service name must be 1..255 characters, got {rec.service!r}")
        for name, v in (("requests_per_s", rec.requests_per_s), ("p99_ms", rec.p99_ms)):
            if v is not None and (not math.isfinite(v) or v < 0):
                raise StoreInputError(f"demand of {rec.service}: {name} must be finite and >= 0, got {v}")
        D = self._db.models.demand
        with self._db.write("record serving demand") as s:
            seen = s.execute(select(D.id).where(D.service == rec.service, D.slot == rec.slot)).first()
            if seen is None:
                s.add(D(service=rec.service, job_id=rec.job_id, slot=rec.slot, requests_per_s=rec.requests_per_s,
                        p99_ms=rec.p99_ms, replicas=rec.replicas))

    def demand(self, service: str, since: datetime | None = None) -> list[DemandRecord]:
        """The service's slots, oldest first."""
        D = self._db.models.demand
        stmt = select(D).where(D.service == service)
        if since is not None:
            stmt = stmt.where(D.slot >= require_aware(since, "since"))
        with self._db.read("list serving demand") as s:
            return [_record(r) for r in s.execute(stmt.order_by(D.slot, D.id)).scalars()]
