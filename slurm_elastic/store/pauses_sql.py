"""Pauses: a paused job, partition or the whole controller still gets decisions, recorded as held."""

from __future__ import annotations

from sqlalchemy import and_, or_, select, update

from slurm_elastic.store.database import Database
from slurm_elastic.store.errors import StoreConflictError, StoreInputError
from slurm_elastic.store.models import PauseColumns
from slurm_elastic.store.records import PauseRecord, PauseScope

_ORDER = {PauseScope.GLOBAL: 0, PauseScope.PARTITION: 1, PauseScope.JOB: 2}


def pause_record(row: PauseColumns) -> PauseRecord:
    return PauseRecord(scope=PauseScope(row.scope), target=row.target, who=row.who, created_at=row.created_at,
                       reason=row.reason)


def normalize_target(scope: PauseScope, target: str | int | None) -> str:
    scope = PauseScope(scope)
    if scope is PauseScope.GLOBAL:
        if target not in (None, ""):
            raise StoreInputError(f"a global pause has no target, got {target!r}")
        return ""
    text = "" if target is None else str(target).strip()
    if scope is PauseScope.JOB and not (text.isdigit() and int(text) > 0):
        raise StoreInputError(f"a job pause needs a numeric job id, got {target!r}")
    if not text or len(text) > 255:
        raise StoreInputError(f"a {scope} pause needs a target of 1..255 characters, got {target!r}")
    return str(int(text)) if scope is PauseScope.JOB else text


class SqlPauses:
    def __init__(self, db: Database) -> None:
        self._db = db

    def pause(self, scope: PauseScope, target: str | int | None, *, who: str, reason: str = "") -> PauseRecord:
        """Pause (idempotent: pausing what is already paused keeps the first pause's who and when). A job
        pause also sets elastic_jobs.paused, in the same transaction."""
        scope = PauseScope(scope)
        key = normalize_target(scope, target)
        if not who:
            raise StoreInputError("who paused must be given")
        P = self._db.models.pause
        J = self._db.models.elastic_job
        now = self._db.now()
        try:
            with self._db.write("pause") as s:
                row = s.execute(select(P).where(P.scope == scope.value, P.target == key)).scalar_one_or_none()
                if row is None:
                    row = P(scope=scope.value, target=key, who=who, created_at=now, reason=reason)
                    s.add(row)
                if scope is PauseScope.JOB:
                    s.execute(update(J).where(J.job_id == int(key)).values(paused=True)
                              .execution_options(synchronize_session=False))
                s.flush()
                return pause_record(row)
        except StoreConflictError:  # a concurrent identical pause won: same outcome
            found = self._find(scope, key)
            if found is None:
                raise
            return found

    def resume(self, scope: PauseScope, target: str | int | None) -> bool:
        """Lift a pause; False if there was none."""
        scope = PauseScope(scope)
        key = normalize_target(scope, target)
        P = self._db.models.pause
        J = self._db.models.elastic_job
        with self._db.write("resume") as s:
            row = s.execute(select(P).where(P.scope == scope.value, P.target == key)).scalar_one_or_none()
            if scope is PauseScope.JOB:
                s.execute(update(J).where(J.job_id == int(key)).values(paused=False)
                          .execution_options(synchronize_session=False))
            if row is None:
                return False
            s.delete(row)
            return True

    def _find(self, scope: PauseScope, key: str) -> PauseRecord | None:
        P = self._db.models.pause
        with self._db.read("read pause") as s:
            row = s.execute(select(P).where(P.scope == scope.value, P.target == key)).scalar_one_or_none()
            return None if row is None else pause_record(row)

    def list_pauses(self) -> list[PauseRecord]:
        P = self._db.models.pause
        with self._db.read("list pauses") as s:
            rows = [pause_record(r) for r in s.execute(select(P)).scalars()]
        return sorted(rows, key=lambda p: (_ORDER[p.scope], p.target))

    def active_pause(self, job_id: int, partition: str | None = None) -> PauseRecord | None:
        """The pause that applies to this job, the broadest first (global, then partition, then job)."""
        P = self._db.models.pause
        cond = [P.scope == PauseScope.GLOBAL.value, and_(P.scope == PauseScope.JOB.value, P.target == str(job_id))]
        if partition:
            cond.append(and_(P.scope == PauseScope.PARTITION.value, P.target == partition))
        with self._db.read("check pauses") as s:
            rows = [pause_record(r) for r in s.execute(select(P).where(or_(*cond))).scalars()]
        return min(rows, key=lambda p: _ORDER[p.scope]) if rows else None
