"""Elastic jobs (one row per elastic unit: a job, or a het component by its raw id) and their extension jobs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Table, bindparam, delete, insert, or_, select, update

from slurm_elastic.store.database import Database, require_aware
from slurm_elastic.store.errors import StoreInputError
from slurm_elastic.store.models import ElasticJobColumns, ExtensionJobColumns
from slurm_elastic.store.records import ElasticJobRecord, ExtensionRecord, JobObservation, SpecSource

MAX_TEXT = 16000


def job_record(row: ElasticJobColumns) -> ElasticJobRecord:
    return ElasticJobRecord(
        job_id=row.job_id, het_job_id=row.het_job_id, het_offset=row.het_offset, user=row.user,
        account=row.account, partition=row.partition, qos=row.qos, name=row.name, spec=row.spec,
        spec_source=SpecSource(row.spec_source), spec_error=row.spec_error, current_nodes=row.current_nodes,
        min_nodes=row.min_nodes, max_nodes=row.max_nodes, nodelist=row.nodelist, gpus_per_node=row.gpus_per_node,
        state=row.state, paused=row.paused, submit_time=row.submit_time, first_seen=row.first_seen,
        last_seen=row.last_seen, ended_at=row.ended_at, time_limit_added_min=row.time_limit_added_min or 0,
    )


def extension_record(row: ExtensionJobColumns) -> ExtensionRecord:
    return ExtensionRecord(
        job_id=row.job_id, parent_job_id=row.parent_job_id, node_count=row.node_count, nodelist=row.nodelist,
        state=row.state, action_id=row.action_id, idempotency_key=row.idempotency_key, created_at=row.created_at,
        updated_at=row.updated_at, ended_at=row.ended_at,
    )


_CHUNK = 500  # job ids per IN (...) read: under every backend's limit on bound parameters


#: The columns an observation sets, besides submit_time (which only a reused job id may change) and last_seen.
_OBSERVED = ("het_job_id", "het_offset", "user", "account", "partition", "qos", "name", "spec", "spec_source",
             "spec_error", "current_nodes", "min_nodes", "max_nodes", "nodelist", "gpus_per_node", "state")


def _values(obs: JobObservation) -> tuple[Any, ...]:
    """The observation's values of :data:`_OBSERVED`, in that order (compared with a stored row's as a tuple)."""
    return (obs.het_job_id, obs.het_offset, obs.user, obs.account, obs.partition, obs.qos, obs.name, obs.spec,
            SpecSource(obs.spec_source).value, None if obs.spec_error is None else obs.spec_error[:MAX_TEXT],
            obs.current_nodes, obs.min_nodes, obs.max_nodes, obs.nodelist, obs.gpus_per_node, obs.state)


def _fields(obs: JobObservation, now: datetime) -> dict[str, Any]:
    """The columns an observation sets (besides submit_time, which only a reused job id may change)."""
    return {**dict(zip(_OBSERVED, _values(obs), strict=True)), "last_seen": now}


def _reused(stored: datetime | None, seen: datetime | None) -> bool:
    """A stored row whose submit time differs from what Slurm says: the job id was reused."""
    return stored is not None and seen is not None and stored != seen


def _check(obs: JobObservation) -> None:
    if not (0 <= obs.min_nodes <= obs.max_nodes) or obs.current_nodes < 0:
        raise StoreInputError(f"job {obs.job_id}: nodes must satisfy 0 <= min <= max and current >= 0, got "
                              f"min={obs.min_nodes} current={obs.current_nodes} max={obs.max_nodes}")
    if not obs.user or not obs.partition:
        raise StoreInputError(f"job {obs.job_id}: user and partition are required")


class SqlJobs:
    def __init__(self, db: Database) -> None:
        self._db = db

    def upsert_job(self, obs: JobObservation) -> ElasticJobRecord:
        """Record what was seen of an elastic unit this cycle. A row whose submit time differs is a reused job
        id (Slurm restarted with a fresh state): it is replaced, not merged."""
        _check(obs)
        now = self._db.now()
        J = self._db.models.elastic_job
        fields = _fields(obs, now)
        with self._db.write("record elastic job") as s:
            row = s.get(J, obs.job_id, with_for_update=True)
            reused = row is not None and _reused(row.submit_time, obs.submit_time)
            if row is None or reused:
                if row is not None:
                    s.delete(row)
                    s.flush()
                row = J(job_id=obs.job_id, paused=False, first_seen=now, submit_time=obs.submit_time,
                        ended_at=None, **fields)
                s.add(row)
            else:
                for k, v in fields.items():
                    setattr(row, k, v)
                if obs.submit_time is not None:
                    row.submit_time = obs.submit_time
            s.flush()
            return job_record(row)

    def observe_jobs(self, observations: Sequence[JobObservation]) -> int:
        """Record what a cycle saw of its elastic units in ONE transaction, by change: a unit seen for the first
        time (or a reused job id) is inserted, one whose fields changed is updated, an unchanged one is not
        written at all, so a cycle in which nothing changed writes nothing (``last_seen`` is then the time of
        the row's last change; an active row is one the controller still sees). The rules of
        :meth:`upsert_job` per row. Returns the number of rows written."""
        for obs in observations:
            _check(obs)
        by_id = {obs.job_id: obs for obs in observations}
        if not by_id:
            return 0
        now = self._db.now()
        table: Table = self._db.models.elastic_job.__table__  # type: ignore[attr-defined]
        inserts: list[dict[str, Any]] = []
        updates: list[dict[str, Any]] = []
        replaced: list[int] = []
        with self._db.write("record elastic jobs") as s:
            stored: dict[int, tuple[datetime | None, tuple[Any, ...]]] = {}  # job id -> (submit time, _OBSERVED)
            cols = [table.c[name] for name in _OBSERVED]
            ids = sorted(by_id)
            for i in range(0, len(ids), _CHUNK):
                chunk = select(table.c.job_id, table.c.submit_time, *cols).where(table.c.job_id.in_(ids[i:i + _CHUNK]))
                for job_id, submit_time, *values in s.execute(chunk):
                    stored[job_id] = (submit_time, tuple(values))
            for job_id, obs in by_id.items():
                found = stored.get(job_id)
                if found is None or _reused(found[0], obs.submit_time):
                    if found is not None:
                        replaced.append(job_id)
                    inserts.append(dict(job_id=job_id, paused=False, first_seen=now, submit_time=obs.submit_time,
                                        ended_at=None, **_fields(obs, now)))
                    continue
                submit = obs.submit_time if obs.submit_time is not None else found[0]
                if submit != found[0] or _values(obs) != found[1]:
                    updates.append(dict(row_id=job_id, submit_time=submit, **_fields(obs, now)))
            if replaced:
                s.execute(delete(table).where(table.c.job_id.in_(replaced)))
            if inserts:
                s.execute(insert(table), inserts)
            if updates:
                s.execute(update(table).where(table.c.job_id == bindparam("row_id")), updates)
        return len(inserts) + len(updates)

    def mark_job_ended(self, job_id: int, state: str) -> bool:
        """The unit left Slurm's queue (or reached a final state); False if it is not known."""
        now = self._db.now()
        J = self._db.models.elastic_job
        with self._db.write("mark elastic job ended") as s:
            row = s.get(J, job_id, with_for_update=True)
            if row is None:
                return False
            row.state = state
            row.last_seen = now
            if row.ended_at is None:
                row.ended_at = now
            return True

    def add_time_limit(self, job_id: int, delta_min: int) -> int:
        """Count ``delta_min`` more minutes (negative: fewer) as added to the job's time limit by the controller;
        never below 0. Returns the new count; 0 for a job not recorded (nothing to give back later)."""
        J = self._db.models.elastic_job
        with self._db.write("record time limit change") as s:
            row = s.get(J, job_id, with_for_update=True)
            if row is None:
                return 0
            row.time_limit_added_min = max(0, (row.time_limit_added_min or 0) + int(delta_min))
            return int(row.time_limit_added_min)

    def get_job(self, job_id: int) -> ElasticJobRecord | None:
        with self._db.read("read elastic job") as s:
            row = s.get(self._db.models.elastic_job, job_id)
            return None if row is None else job_record(row)

    def list_jobs(self, *, active_only: bool = True, user: str | None = None) -> list[ElasticJobRecord]:
        J = self._db.models.elastic_job
        stmt = select(J)
        if active_only:
            stmt = stmt.where(J.ended_at.is_(None))
        if user is not None:
            stmt = stmt.where(J.user == user)
        with self._db.read("list elastic jobs") as s:
            return [job_record(r) for r in s.execute(stmt.order_by(J.job_id)).scalars()]

    # --- extension jobs -------------------------------------------------------------------------------------
    def record_extension(self, *, job_id: int, parent_job_id: int, node_count: int, state: str,
                         action_id: int | None = None, idempotency_key: str | None = None,
                         nodelist: str | None = None) -> ExtensionRecord:
        """Record an extension job (after sbatch returned its id, or when reconcile finds it in Slurm).
        Recording the same job id again updates it."""
        if node_count < 0:
            raise StoreInputError(f"extension job {job_id}: node_count must be >= 0, got {node_count}")
        now = self._db.now()
        E = self._db.models.extension_job
        with self._db.write("record extension job") as s:
            row = s.get(E, job_id, with_for_update=True)
            if row is None:
                row = E(job_id=job_id, parent_job_id=parent_job_id, node_count=node_count, nodelist=nodelist,
                        state=state, action_id=action_id, idempotency_key=idempotency_key, created_at=now,
                        updated_at=now, ended_at=None)
                s.add(row)
            else:
                if row.parent_job_id != parent_job_id:
                    raise StoreInputError(f"extension job {job_id} belongs to {row.parent_job_id}, "
                                          f"not {parent_job_id}")
                row.node_count, row.state, row.updated_at = node_count, state, now
                row.nodelist = nodelist if nodelist is not None else row.nodelist
                row.action_id = action_id if action_id is not None else row.action_id
                row.idempotency_key = idempotency_key if idempotency_key is not None else row.idempotency_key
            s.flush()
            return extension_record(row)

    def update_extension(self, job_id: int, *, state: str, ended: bool = False,
                         nodelist: str | None = None) -> ExtensionRecord | None:
        now = self._db.now()
        E = self._db.models.extension_job
        with self._db.write("update extension job") as s:
            row = s.get(E, job_id, with_for_update=True)
            if row is None:
                return None
            row.state, row.updated_at = state, now
            if nodelist is not None:
                row.nodelist = nodelist
            if ended and row.ended_at is None:
                row.ended_at = now
            s.flush()
            return extension_record(row)

    def get_extension(self, job_id: int) -> ExtensionRecord | None:
        with self._db.read("read extension job") as s:
            row = s.get(self._db.models.extension_job, job_id)
            return None if row is None else extension_record(row)

    def find_extension_by_key(self, idempotency_key: str) -> ExtensionRecord | None:
        E = self._db.models.extension_job
        with self._db.read("find extension job by key") as s:
            row = s.execute(select(E).where(E.idempotency_key == idempotency_key)
                            .order_by(E.job_id).limit(1)).scalar_one_or_none()
            return None if row is None else extension_record(row)

    def extensions(self, parent_job_id: int | None = None, *, active_only: bool = True,
                   ended_since: datetime | None = None) -> list[ExtensionRecord]:
        """Extension jobs, newest first (shrink takes back the newest first). ``ended_since``: the active ones
        and those that ended at or after it (ignored with ``active_only``)."""
        E = self._db.models.extension_job
        stmt = select(E)
        if parent_job_id is not None:
            stmt = stmt.where(E.parent_job_id == parent_job_id)
        if active_only:
            stmt = stmt.where(E.ended_at.is_(None))
        elif ended_since is not None:
            stmt = stmt.where(or_(E.ended_at.is_(None), E.ended_at >= require_aware(ended_since, "ended_since")))
        with self._db.read("list extension jobs") as s:
            return [extension_record(r) for r in s.execute(stmt.order_by(E.created_at.desc(),
                                                                          E.job_id.desc())).scalars()]
