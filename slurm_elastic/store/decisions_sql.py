"""Decisions (every one, holds included, with the inputs behind it) and the controller's cycles."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import Table, bindparam, func, insert, select, update

from slurm_elastic.store.coltypes import LongText, dump_json
from slurm_elastic.store.database import Database, require_aware
from slurm_elastic.store.errors import StoreInputError
from slurm_elastic.store.lease_sql import check_fencing
from slurm_elastic.store.models import CycleColumns, DecisionColumns
from slurm_elastic.store.records import (
    CycleRecord,
    DecisionCount,
    DecisionFilter,
    DecisionRecord,
    FencingToken,
    NewDecision,
)

MAX_TEXT = 16000


def decision_record(row: DecisionColumns) -> DecisionRecord:
    return DecisionRecord(
        id=row.id, time=row.time, cycle_id=row.cycle_id, job_id=row.job_id, action=row.action, reason=row.reason,
        message=row.message, inputs=dict(row.inputs), current_nodes=row.current_nodes,
        target_nodes=row.target_nodes, signal=row.signal, profile=row.profile, paused=row.paused,
        dry_run=row.dry_run,
    )


def cycle_record(row: CycleColumns) -> CycleRecord:
    return CycleRecord(id=row.id, started_at=row.started_at, finished_at=row.finished_at, holder=row.holder,
                       dry_run=row.dry_run, decisions=row.decisions, actions=row.actions, error=row.error)


def _checked_inputs(d: NewDecision) -> str:
    """The decision's inputs as the JSON text stored (serialized once: the check and the row share it)."""
    for name, value in (("action", d.action), ("reason", d.reason)):
        if not value or len(value) > 64:
            raise StoreInputError(f"decision for job {d.job_id}: {name} must be 1..64 characters, got {value!r}")
    try:
        return dump_json(dict(d.inputs))
    except (TypeError, ValueError) as e:
        raise StoreInputError(f"decision for job {d.job_id}: inputs are not JSON: {e}") from e


class SqlDecisions:
    def __init__(self, db: Database) -> None:
        self._db = db

    # --- cycles ---------------------------------------------------------------------------------------------
    def begin_cycle(self, *, holder: str | None = None, dry_run: bool = False) -> int:
        """A new cycle id, unique across restarts and controllers (it goes into idempotency keys)."""
        C = self._db.models.cycle
        now = self._db.now()
        with self._db.write("begin cycle") as s:
            row = C(started_at=now, finished_at=None, holder=holder, dry_run=dry_run, decisions=0, actions=0,
                    error=None)
            s.add(row)
            s.flush()
            cycle_id = int(row.id)
        return cycle_id

    def finish_cycle(self, cycle_id: int, *, decisions: int, actions: int, error: str | None = None) -> None:
        C = self._db.models.cycle
        now = self._db.now()
        with self._db.write("finish cycle") as s:
            s.execute(update(C).where(C.id == cycle_id)
                      .values(finished_at=now, decisions=decisions, actions=actions,
                              error=None if error is None else error[:MAX_TEXT])
                      .execution_options(synchronize_session=False))

    def last_cycle(self, *, finished: bool = True) -> CycleRecord | None:
        C = self._db.models.cycle
        stmt = select(C)
        if finished:
            stmt = stmt.where(C.finished_at.is_not(None))
        with self._db.read("read last cycle") as s:
            row = s.execute(stmt.order_by(C.id.desc()).limit(1)).scalar_one_or_none()
            return None if row is None else cycle_record(row)

    def cycles_after(self, cycle_id: int) -> list[CycleRecord]:
        """The cycles begun after ``cycle_id``, oldest first (finished or not): what a watcher counts to see that a
        number of whole cycles ran since a point it took with ``last_cycle(finished=False)``."""
        C = self._db.models.cycle
        with self._db.read("read cycles") as s:
            rows = s.execute(select(C).where(C.id > cycle_id).order_by(C.id)).scalars()
            return [cycle_record(r) for r in rows]

    # --- decisions ------------------------------------------------------------------------------------------
    def record_decisions(self, cycle_id: int, decisions: Sequence[NewDecision], *,
                         fencing: FencingToken | None = None) -> list[int]:
        """Store one cycle's decisions in ONE transaction (all or none); their ids, in order. With ``fencing``,
        only while that token still holds the lease (LeaseLostError otherwise, nothing written): a controller
        that lost the lease mid-cycle must not record what the new holder records too (a loss counted twice)."""
        return self.record_rows(cycle_id, decisions, (), fencing=fencing)

    def record_rows(self, cycle_id: int, with_ids: Sequence[NewDecision], without_ids: Sequence[NewDecision], *,
                    fencing: FencingToken | None = None) -> list[int]:
        """As :meth:`record_decisions`, both sequences in ONE transaction, returning the ids of ``with_ids``
        only: rows nothing refers to by id (holds; the journal refers to grows and shrinks) go in one plain
        multi-row INSERT. Ids in order need one statement per row on SQLite (RETURNING's order is not
        guaranteed there): a first cycle's 11,580 holds took 0.35 s with their ids, 0.1 s without."""
        texts = [_checked_inputs(d) for d in with_ids], [_checked_inputs(d) for d in without_ids]
        if not with_ids and not without_ids:
            return []
        now = self._db.now()
        table: Table = self._db.models.decision.__table__  # type: ignore[attr-defined]
        rows = [[dict(time=now, cycle_id=cycle_id, job_id=d.job_id, action=d.action, reason=d.reason,
                      message=d.message[:MAX_TEXT], inputs_text=text, current_nodes=d.current_nodes,
                      target_nodes=d.target_nodes, signal=d.signal, profile=d.profile, paused=d.paused,
                      dry_run=d.dry_run)
                 for d, text in zip(group, group_texts, strict=True)]
                for group, group_texts in zip((with_ids, without_ids), texts, strict=True)]
        # Core multi-row INSERTs (SQLAlchemy's insertmanyvalues) instead of an ORM object per row.
        stmt = insert(table).values(inputs=bindparam("inputs_text", type_=LongText))
        ids: list[int] = []
        with self._db.write("record decisions") as s:
            if fencing is not None:
                check_fencing(s, self._db.models, fencing, now)
            if rows[0]:
                returning = stmt.returning(table.c.id, sort_by_parameter_order=True)
                ids = [int(i) for i in s.execute(returning, rows[0]).scalars()]
            if rows[1]:
                s.execute(stmt, rows[1])
        return ids

    def list_decisions(self, flt: DecisionFilter | None = None) -> list[DecisionRecord]:
        """Newest first."""
        flt = flt or DecisionFilter()
        D = self._db.models.decision
        J = self._db.models.elastic_job
        stmt = select(D)
        if flt.job_id is not None:
            stmt = stmt.where(D.job_id == flt.job_id)
        if flt.since is not None:
            stmt = stmt.where(D.time >= require_aware(flt.since, "since"))
        if flt.until is not None:
            stmt = stmt.where(D.time < require_aware(flt.until, "until"))
        if flt.action is not None:
            stmt = stmt.where(D.action == flt.action)
        if flt.reason is not None:
            stmt = stmt.where(D.reason == flt.reason)
        if flt.user is not None:
            stmt = stmt.where(D.job_id.in_(select(J.job_id).where(J.user == flt.user)))
        stmt = stmt.order_by(D.time.desc(), D.id.desc())
        if flt.limit is not None:
            stmt = stmt.limit(flt.limit)
        with self._db.read("list decisions") as s:
            return [decision_record(r) for r in s.execute(stmt).scalars()]

    def last_decisions(self, job_id: int, n: int = 10) -> list[DecisionRecord]:
        return self.list_decisions(DecisionFilter(job_id=job_id, limit=n))

    def last_decisions_per_job(self, n: int = 1, job_ids: Iterable[int] | None = None) -> dict[int, list[
            DecisionRecord]]:
        """The last ``n`` decisions of each job (newest first), in one query (window function)."""
        if n < 1:
            raise StoreInputError(f"n must be >= 1, got {n}")
        D = self._db.models.decision
        rank = func.row_number().over(partition_by=D.job_id, order_by=(D.time.desc(), D.id.desc())).label("rank")
        inner = select(D.id, rank)
        if job_ids is not None:
            inner = inner.where(D.job_id.in_(list(job_ids)))
        ranked = inner.subquery()
        stmt = (select(D).join(ranked, ranked.c.id == D.id).where(ranked.c.rank <= n)
                .order_by(D.job_id, D.time.desc(), D.id.desc()))
        out: dict[int, list[DecisionRecord]] = {}
        with self._db.read("list last decisions per job") as s:
            for row in s.execute(stmt).scalars():
                out.setdefault(row.job_id, []).append(decision_record(row))
        return out

    def decision_counts(self, since: datetime, until: datetime | None = None) -> list[DecisionCount]:
        """Counts by (action, reason), most frequent first."""
        D = self._db.models.decision
        n = func.count().label("n")
        stmt = select(D.action, D.reason, n).where(D.time >= require_aware(since, "since"))
        if until is not None:
            stmt = stmt.where(D.time < require_aware(until, "until"))
        stmt = stmt.group_by(D.action, D.reason).order_by(n.desc(), D.action, D.reason)
        with self._db.read("count decisions") as s:
            return [DecisionCount(a, r, int(c)) for a, r, c in s.execute(stmt).all()]
