"""Retention: delete rows older than the configured ages. Journal rows in an open state (intent,
in_progress) are never deleted, whatever their age, and neither are the decisions they point to: reconcile
needs both."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, select

from slurm_elastic.store.database import Database
from slurm_elastic.store.records import OPEN_STATES, TERMINAL_STATES, PruneResult, Retention


def _count(result: object) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


class SqlRetention:
    def __init__(self, db: Database) -> None:
        self._db = db

    def prune(self, retention: Retention) -> PruneResult:
        """One transaction per table, so a long delete on one does not hold locks on the others."""
        now = self._db.now()
        m = self._db.models
        open_states = [s.value for s in OPEN_STATES]
        out: dict[str, int] = {}

        def cutoff(age_s: int | None) -> datetime | None:
            return None if age_s is None else now - timedelta(seconds=age_s)

        if (c := cutoff(retention.samples_s)) is not None:
            with self._db.write("prune samples") as s:
                out["samples"] = _count(s.execute(delete(m.sample).where(m.sample.time < c)
                                                  .execution_options(synchronize_session=False)))
        if (c := cutoff(retention.decisions_s)) is not None:
            keep = select(m.action.decision_id).where(m.action.state.in_(open_states),
                                                      m.action.decision_id.is_not(None))
            with self._db.write("prune decisions") as s:
                out["decisions"] = _count(s.execute(
                    delete(m.decision).where(m.decision.time < c, m.decision.id.not_in(keep))
                    .execution_options(synchronize_session=False)))
        if (c := cutoff(retention.actions_s)) is not None:
            with self._db.write("prune actions") as s:
                out["actions"] = _count(s.execute(
                    delete(m.action).where(m.action.state.in_([t.value for t in TERMINAL_STATES]),
                                           m.action.updated_at < c)
                    .execution_options(synchronize_session=False)))
        if (c := cutoff(retention.jobs_s)) is not None:
            with self._db.write("prune ended jobs") as s:
                out["extensions"] = _count(s.execute(
                    delete(m.extension_job).where(m.extension_job.ended_at < c)
                    .execution_options(synchronize_session=False)))
                out["jobs"] = _count(s.execute(
                    delete(m.elastic_job).where(m.elastic_job.ended_at < c)
                    .execution_options(synchronize_session=False)))
        if (c := cutoff(retention.cycles_s)) is not None:
            with self._db.write("prune cycles") as s:
                out["cycles"] = _count(s.execute(delete(m.cycle).where(m.cycle.started_at < c)
                                                 .execution_options(synchronize_session=False)))
        if (c := cutoff(retention.demand_s)) is not None:
            with self._db.write("prune serving demand") as s:
                out["demand"] = _count(s.execute(delete(m.demand).where(m.demand.slot < c)
                                                 .execution_options(synchronize_session=False)))
        return PruneResult(**out)
