"""The simulator's journal of resizes: the policy's history as the controller reads it from its own journal.

The controller gives ``decide`` every resize of its units journaled in the last day (controller/cycle.py,
controller/history.py ``HISTORY_SPAN``), not only each unit's last one, and the rules read more than the last:
the cooldown and the serving rules a unit's last resize and last grow, the admit back-off the last shrink-to-admit
for each pending job, ``admit_victim_interval_s`` a unit's last shrink-to-admit (often not its last resize), the
victim order "most recently grown" only grows of that day. So the simulator keeps the same: each decided resize
as the controller journals it (``action_records``: one record per pending job a shrink admits), settled to applied
or failed once the engine had its chance, until it is older than the span or its unit ends.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from slurm_elastic.controller.history import HISTORY_SPAN, action_records
from slurm_elastic.policy import Decision, Outcome, ResizeRecord


@dataclass
class Entry:
    """One journaled resize: when it was decided and its records in the policy's history."""

    created: datetime
    records: tuple[ResizeRecord, ...]


class SimJournal:
    """Per unit, its resizes of the last ``HISTORY_SPAN``, oldest first."""

    def __init__(self) -> None:
        self._units: dict[int, list[Entry]] = {}

    def record(self, d: Decision, t: datetime) -> Entry:
        """The intent of decision ``d`` (a grow or a shrink), journaled at ``t`` (as the actuator's intent)."""
        shrink = d.shrink
        entry = Entry(t, action_records(
            at=t, unit_id=d.unit_id, action=d.action, from_nodes=d.current_nodes, to_nodes=d.target_nodes,
            outcome=Outcome.INTENT, reason=str(d.reason), admits=shrink.admits if shrink is not None else (),
            bases={b.job_id: b for b in shrink.admit_basis} if shrink is not None else None))
        self._units.setdefault(d.unit_id, []).append(entry)
        return entry

    @staticmethod
    def settle(entry: Entry, outcome: Outcome, at: datetime) -> None:
        """The resize was applied (at ``at``) or failed: its records say so from now on."""
        entry.records = tuple(replace(r, outcome=outcome, at=at) for r in entry.records)

    def forget(self, unit_id: int) -> None:
        """The unit ended: the controller's history reads only running units."""
        self._units.pop(unit_id, None)

    def history(self, now: datetime) -> tuple[ResizeRecord, ...]:
        """Every record of the resizes decided in the last ``HISTORY_SPAN`` (older ones are dropped)."""
        since = now - HISTORY_SPAN
        out: list[ResizeRecord] = []
        for entries in self._units.values():
            if entries and entries[0].created < since:
                entries[:] = [e for e in entries if e.created >= since]
            for e in entries:
                out.extend(e.records)
        return tuple(out)
