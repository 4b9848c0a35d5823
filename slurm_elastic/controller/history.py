"""The journal as the policy's resize history, and what the store adds to the units (pure).

A resize happens when it is applied (after the grace period for a shrink), not when it is decided; a
shrink-to-admit names the pending jobs it was for, and what each was based on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from slurm_elastic.controller.units import UnitsResult
from slurm_elastic.policy import Action, AdmitBasis, ElasticUnit, Outcome, ResizeRecord
from slurm_elastic.store.records import ActionKind, ActionRecord, ActionState, ElasticJobRecord

log = logging.getLogger(__name__)

# A cancel_extension (controller/cancels.py) ends a grow that never joined: no resize (GROW_BACKOFF covers it).
_KIND_ACTION = {ActionKind.GROW: Action.GROW, ActionKind.SHRINK: Action.SHRINK}
_STATE_OUTCOME = {ActionState.APPLIED: Outcome.APPLIED, ActionState.FAILED: Outcome.FAILED,
                  ActionState.ABORTED: Outcome.FAILED, ActionState.INTENT: Outcome.INTENT,
                  ActionState.IN_PROGRESS: Outcome.INTENT}


#: How far back the policy's history reaches: the controller reads the journal of the last day each cycle (by the
#: actions' creation), and the simulator keeps as much (sim/journal.py), so both paths give decide() the same.
HISTORY_SPAN = timedelta(days=1)


def resize_history(actions: Sequence[ActionRecord], units: Mapping[int, ElasticUnit]) -> tuple[ResizeRecord, ...]:
    """The units' resizes among ``actions`` (the journal of the last day) as the policy's history."""
    records: list[ResizeRecord] = []
    for a in actions:
        if a.job_id not in units or a.kind not in _KIND_ACTION:
            continue
        # A resize happens when it is applied (after the grace period for a shrink), not when it is decided.
        records.extend(action_records(
            at=a.finished_at or a.created_at, unit_id=a.job_id, action=_KIND_ACTION[a.kind],
            from_nodes=int(a.params.get("from", 0)), to_nodes=int(a.params.get("to", 0)),
            outcome=_STATE_OUTCOME[a.state], reason=str(a.params.get("reason", "")),
            admits=[int(j) for j in a.params.get("admits") or []], bases=admit_bases(a)))
    return tuple(records)


def action_records(*, at: datetime, unit_id: int, action: Action, from_nodes: int, to_nodes: int, outcome: Outcome,
                   reason: str, admits: Iterable[int] = (), bases: Mapping[int, AdmitBasis] | None = None,
                   ) -> tuple[ResizeRecord, ...]:
    """One journaled resize as the policy's history (the controller's journal and the simulator's). A shrink that
    admits pending jobs names them, and what each was based on: one record each, so decide() backs off for a job
    that Slurm did not start after all, until something changes."""
    bases = bases or {}
    for_jobs: list[int | None] = [*admits] or [None]
    return tuple(ResizeRecord(at=at, unit_id=unit_id, action=action, from_nodes=from_nodes, to_nodes=to_nodes,
                              outcome=outcome, reason=reason, for_job=for_job,
                              admit_basis=bases.get(for_job) if for_job is not None else None)
                 for for_job in for_jobs)


def admit_bases(action: ActionRecord) -> dict[int, AdmitBasis]:
    """The admit bases a shrink-to-admit action recorded, by pending job. An entry that does not parse (a
    hand-edited or older journal) is skipped: decide() then backs off on time alone for that job."""
    out: dict[int, AdmitBasis] = {}
    for raw in action.params.get("admit_basis") or []:
        try:
            basis = AdmitBasis.from_dict(raw)
        except (KeyError, TypeError, ValueError):
            log.warning("action %d: unreadable admit_basis entry %r ignored", action.id, raw)
            continue
        out[basis.job_id] = basis
    return out


def with_time_limit_added(built: UnitsResult, known: Sequence[ElasticJobRecord]) -> UnitsResult:
    """The units with what the controller has added to their time limits (the store keeps it; a grow may give
    it back, see extend_time_limit_on_shrink)."""
    added = {r.job_id: r.time_limit_added_min * 60 for r in known if r.time_limit_added_min > 0}
    if not added:
        return built
    return replace(built, units=tuple(replace(u, time_limit_added_s=added[u.unit_id]) if u.unit_id in added else u
                                      for u in built.units))
