"""Which grows joined their job: the GPUs an admin reads as granted (``status``'s gpus_granted_today, the
``slurm_elastic_controller_gpus_granted_total`` counter) are those of applied grows whose extension joined.

A grow is applied once its extension job is submitted; it joins when its workers run for the job: for a unit
without ``--prewarm`` when the extension is seen RUNNING in two successive cycles (one that dies at once, its
script failing in the extension role, never joined); with ``--prewarm`` when its COLD_START is recorded (every new
node ready and joined, controller/coldstart.py). A grow whose prewarm failed, whose powered-down node
never came back, or whose extension never started grants nothing. The join is noted on the grow's journal entry
(``params["joined_at"]``, store/journal_sql.py ``note_joined``), once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from slurm_elastic.policy import ElasticUnit, Reason
from slurm_elastic.slurm.model import ClusterSnapshot
from slurm_elastic.store.errors import IllegalTransitionError
from slurm_elastic.store.journal_sql import JOINED_AT
from slurm_elastic.store.protocols import ControllerStore
from slurm_elastic.store.records import ActionKind, ActionState, DecisionFilter, ExtensionRecord

log = logging.getLogger(__name__)

LOOK_BACK = timedelta(days=1)


def has_joined(unit: ElasticUnit, rec: ExtensionRecord, snap: ClusterSnapshot, cold_started: set[int],
               seen_running: set[int]) -> bool:
    """Whether extension ``rec`` of ``unit`` has joined it (``seen_running``: extensions seen RUNNING in the
    previous cycle). Pure."""
    if unit.spec.prewarm is not None:
        return rec.job_id in cold_started
    job = snap.job(rec.job_id)
    return job is not None and job.state == "RUNNING" and rec.job_id in seen_running


@dataclass
class Joins:
    """The shell: notes each grow's join on its journal entry."""

    store: ControllerStore
    noted: set[int] | None = None  # grow actions whose join is on record (loaded from the journal once)
    running: set[int] = field(default_factory=set)  # extension jobs seen RUNNING in the last cycle

    def note(self, units: Mapping[int, ElasticUnit], snap: ClusterSnapshot, now: datetime) -> list[int]:
        """Note the joins seen in this snapshot; returns the grow actions noted."""
        if self.noted is None:
            self.noted = {a.id for a in self.store.journal.list_actions(since=now - LOOK_BACK,
                                                                         states=[ActionState.APPLIED])
                          if a.kind == ActionKind.GROW and JOINED_AT in a.params}
        candidates = [r for r in self.store.jobs.extensions(active_only=True)
                      if r.action_id is not None and r.action_id not in self.noted and r.parent_job_id in units]
        seen, self.running = self.running, {r.job_id for r in candidates
                                            if (j := snap.job(r.job_id)) is not None and j.state == "RUNNING"}
        if not candidates:
            return []
        cold: set[int] = set()
        if any(units[r.parent_job_id].spec.prewarm is not None for r in candidates):
            for d in self.store.decisions.list_decisions(DecisionFilter(reason=str(Reason.COLD_START),
                                                                        since=now - LOOK_BACK)):
                ext = d.inputs.get("extension_job")
                if isinstance(ext, int):
                    cold.add(ext)
        done: list[int] = []
        for rec in candidates:
            if rec.action_id is None or not has_joined(units[rec.parent_job_id], rec, snap, cold, seen):
                continue
            try:
                self.store.journal.note_joined(rec.action_id, now)
            except IllegalTransitionError as e:  # not an applied grow (yet): reconcile settles it first
                log.debug("extension %d: join not noted: %s", rec.job_id, e)
                continue
            self.noted.add(rec.action_id)
            done.append(rec.action_id)
        return done
