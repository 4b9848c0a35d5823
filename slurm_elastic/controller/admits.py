"""Did the pending job a shrink-to-admit was for actually start?

The policy can only predict that freeing nodes lets a pending job start; Slurm decides. After the shrink is
applied, each admitted job is followed: it started (good: logged with how long it took), or it still waits
after ``verify_s`` (Slurm chose otherwise: a reservation, a limit, another job backfilled onto the nodes).
The second case is logged once as a warning; the policy itself backs off for that job until something changes
(``decide`` reads the journal's ``admits`` and ``admit_basis``), at most ``admit_backoff_s``, so nodes are not
taken again for a job Slurm will not start.
Outcomes are counted in ``slurm_elastic_controller_admits{outcome=started|not_started|gone}``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from slurm_elastic.slurm.model import ClusterSnapshot
from slurm_elastic.store.records import ActionKind, ActionRecord, ActionState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdmitOutcome:
    action_id: int
    unit_id: int
    job_id: int
    outcome: str  # started | not_started | gone
    after_s: float
    detail: str


@dataclass
class AdmitFollower:
    """Follows the admitted jobs of applied shrink-to-admit actions; reports each (action, job) once."""

    verify_s: float = 60.0
    _done: set[tuple[int, int]] = field(default_factory=set)

    def follow(self, actions: Iterable[ActionRecord], snap: ClusterSnapshot, now: datetime) -> list[AdmitOutcome]:
        out: list[AdmitOutcome] = []
        actions = list(actions)
        live = {a.id for a in actions}
        self._done = {k for k in self._done if k[0] in live}  # forget actions that left the look-back
        for a in actions:
            if a.kind != ActionKind.SHRINK or a.state != ActionState.APPLIED or a.finished_at is None:
                continue
            for raw in a.params.get("admits") or []:
                job_id = int(raw)
                key = (a.id, job_id)
                if key in self._done:
                    continue
                after = (now - a.finished_at).total_seconds()
                job = snap.job(job_id)
                if job is None or job.state not in {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING"}:
                    result = AdmitOutcome(a.id, a.job_id, job_id, "gone", after,
                                          f"ended as {job.state if job else 'unknown'} before it started")
                elif job.is_running or job.state in {"CONFIGURING", "COMPLETING"}:
                    started = job.start_time
                    took = (started - a.finished_at).total_seconds() if started is not None else after
                    result = AdmitOutcome(a.id, a.job_id, job_id, "started", max(0.0, took),
                                          f"started on {','.join(job.nodes)}")
                elif after >= self.verify_s:
                    result = AdmitOutcome(a.id, a.job_id, job_id, "not_started", after,
                                          f"still pending ({job.state_reason or 'no reason'})")
                else:
                    continue
                self._done.add(key)
                out.append(result)
                _log(result)
        return out


def _log(r: AdmitOutcome) -> None:
    if r.outcome == "started":
        log.info("shrink-to-admit (action %d, job %d): job %d %s %.0fs after the nodes were released",
                 r.action_id, r.unit_id, r.job_id, r.detail, r.after_s)
    elif r.outcome == "not_started":
        log.warning("shrink-to-admit (action %d, job %d): job %d did not start within %.0fs: %s; Slurm chose "
                    "otherwise, no further shrink for it until a job on its partitions ends or its request "
                    "changes", r.action_id, r.unit_id, r.job_id, r.after_s, r.detail)
    else:
        log.info("shrink-to-admit (action %d, job %d): job %d %s", r.action_id, r.unit_id, r.job_id, r.detail)
