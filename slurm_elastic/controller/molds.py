"""Moldable start in the controller: which waiting jobs to reshape, and what a molded unit remembers.

Each cycle, after ``decide``: open mold actions left by a crash are resolved first (the actuator repeats the
absolute update or closes them), then the waiting jobs that :func:`~slurm_elastic.policy.moldable.mold_scope`
lets through have their directives read (the same cache as the units'), :func:`decide_molds` (pure) picks the
molds on the free whole nodes that this cycle's grows leave, each is recorded as a decision (``mold``,
MOLDABLE_START, for ``explain``) and, outside dry-run, carried out by the actuator.

A molded job keeps its request as its max: the journal's mold action (key ``mold:<job id>``) says what it asked
for, looked up once per job and process (:meth:`Molds.apply`); the first time the job is seen running, the
minutes the mold added to its time limit are counted like a shrink's, so a grow gives them back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from slurm_elastic.controller.actuator import Actuator, mold_key
from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.controller.rulings import CycleContext
from slurm_elastic.controller.units import SpecCache, UnitsResult, spec_for
from slurm_elastic.directives.spec import ElasticSpec
from slurm_elastic.policy import Decision, ElasticUnit, PolicyConfig
from slurm_elastic.policy.moldable import Mold, decide_molds, mold_scope, start_floors
from slurm_elastic.slurm.errors import SlurmError
from slurm_elastic.slurm.model import ClusterSnapshot, Job
from slurm_elastic.store.errors import StoreError
from slurm_elastic.store.protocols import ActuatorStore
from slurm_elastic.store.records import (
    ActionKind,
    ActionRecord,
    ActionState,
    ElasticJobRecord,
    NewDecision,
    stored_nodes,
)

log = logging.getLogger(__name__)

MOLD_ACTION = "mold"  # the decision's action (a waiting job is no unit: it has no grow/shrink/hold)


class Molds:
    def __init__(self, store: ActuatorStore, actuator: Actuator, specs: SpecCache) -> None:
        self.store = store
        self.actuator = actuator
        self.specs = specs
        self._requests: dict[int, int | None] = {}  # unit id -> what it asked for when molded (None: not molded)
        self._uncounted: dict[int, int] = {}  # molded unit seen running for the first time -> minutes to count
        self._shares: dict[int, int] = {}  # waiting job -> the round plan's share, from its victims' shrinks

    # --- the molded unit ---------------------------------------------------------------------------------------
    def apply(self, built: UnitsResult, known: Sequence[ElasticJobRecord]) -> UnitsResult:
        """The units, a molded one with its request as ``molded_request`` and as its max (unless ``--max-nodes``
        says otherwise: then only ``molded_request``, the size it grows back to first, policy/regrow.py); a molded
        unit seen running for the first time has its mold's added minutes counted (``known``: the records of
        the jobs seen before this cycle), in this cycle's units already (MOLDED_REGROW may grow it back at once)."""
        live = {u.unit_id for u in built.units}
        for gone in [j for j in self._requests if j not in live]:
            del self._requests[gone]
        seen = {r.job_id for r in known}
        unseen = [u for u in built.units if u.unit_id not in self._requests]
        found = self.store.journal.find_by_idempotency_keys([mold_key(u.unit_id) for u in unseen]) if unseen else {}
        for u in unseen:
            self._requests[u.unit_id] = self._molded_request(found.get(mold_key(u.unit_id)), u.unit_id,
                                                             first_seen=u.unit_id not in seen)
        units: list[ElasticUnit] = []
        for seen_unit in built.units:
            u = seen_unit
            if u.unit_id in self._uncounted:  # stored after this cycle: a grow back now gives the minutes back too
                u = replace(u, time_limit_added_s=u.time_limit_added_s + 60 * self._uncounted[u.unit_id])
            request = self._requests[u.unit_id]
            if request is None:
                units.append(u)
            elif u.spec.max_nodes is not None:
                units.append(replace(u, molded_request=request))
            else:
                units.append(replace(u, submitted_nodes=max(request, u.leader_nodes), molded_request=request))
        return replace(built, units=tuple(units))

    def _molded_request(self, action: ActionRecord | None, unit_id: int, *, first_seen: bool) -> int | None:
        if action is None or action.kind != ActionKind.MOLD or action.state != ActionState.APPLIED:
            return None
        add_min = int(action.params.get("time_limit_add_min") or 0)
        if first_seen and add_min > 0:  # counted once, by run(), after this cycle has recorded the job
            self._uncounted[unit_id] = add_min
        return int(action.params["from"])

    # --- the round plan's waiting jobs --------------------------------------------------------------------------
    def floors(self, snap: ClusterSnapshot, policy: PolicyConfig,
               read_script: Callable[[int], str | None]) -> dict[int, int]:
        """``PolicyInput.pending_min_nodes``: each waiting job that moldable start may reshape, at its
        ``#ELASTIC`` min (policy/moldable.py: start_floors, the simulator's function too). Not the controller's
        extension jobs, nor a job without directives or with ``--no-grow`` (it would not be molded: it enters
        the plan at its request). The directives are read through the units' cache, as :meth:`run` reads them."""

        def floor_of(job: Job) -> tuple[int, int] | None:
            if parse_tag(job.comment) is not None:
                return None
            spec, _, _ = spec_for(job, read_script, self.specs)
            return None if spec is None or not spec.grow else (spec.min_nodes, job.node_count)

        return start_floors(snap, policy, floor_of)

    # --- the cycle's molds -------------------------------------------------------------------------------------
    def run(self, snap: ClusterSnapshot, policy: PolicyConfig, decisions: Iterable[Decision], *,
            read_script: Callable[[int], str | None], ctx: CycleContext, dry_run: bool,
            record: Callable[[list[NewDecision]], list[int]]) -> dict[int, str]:
        """Resolve open molds, decide this cycle's, record and (outside dry-run) carry them out. Returns the
        outcome text by job id. One job's failure never stops the others."""
        acted: dict[int, str] = {}
        for unit_id, add_min in self._uncounted.items():
            self.store.jobs.add_time_limit(unit_id, add_min)
        self._uncounted.clear()
        if not dry_run:
            for action in self.store.journal.open_actions():
                if action.kind == ActionKind.MOLD:  # a mold finishes within its cycle: an open one is a crash's
                    acted[action.job_id] = self.actuator.resolve_mold(action, snap)
        waiting = [j for j in mold_scope(snap, policy) if parse_tag(j.comment) is None]  # no extension jobs
        decided = list(decisions)
        self._note_shares(decided, {j.job_id for j in waiting})
        if not waiting:
            return acted
        pending: list[tuple[Job, ElasticSpec]] = []
        for job in waiting:
            spec, _, _ = spec_for(job, read_script, self.specs)
            if spec is not None:
                pending.append((job, spec))
        taken = {n for d in decided if d.grow is not None for n in d.grow.nodes}
        taken |= _pending_extension_nodes(self.store, snap)
        skip = {j for d in decided if d.shrink is not None for j in d.shrink.admits}
        molded = self.store.journal.find_by_idempotency_keys([mold_key(job.job_id) for job, _ in pending])
        skip |= {job.job_id for job, _ in pending if mold_key(job.job_id) in molded}
        molds = decide_molds(snap, pending, policy, taken_nodes=taken, skip=skip)
        if not molds:
            return acted
        ids = record([_new_decision(m, policy, dry_run, self._shares.get(m.candidate.job_id)) for m in molds])
        for m, decision_id in zip(molds, ids, strict=True):
            c = m.candidate
            log.info("job %s: mold %d->%d (%s: %s)", c.display_id, c.request_nodes, m.nodes, m.reason, m.message)
            if dry_run:
                continue
            try:
                acted[c.job_id] = self.actuator.mold(m, snap, decision_id, ctx)
            except (SlurmError, StoreError) as e:
                acted[c.job_id] = f"error: {e}"
                log.error("molding job %s failed: %s", c.display_id, e)
        return acted

    def _note_shares(self, decided: Sequence[Decision], waiting: set[int]) -> None:
        """Remember each waiting job's share in the round plan (``admit_share`` of the shrinks that admit it), for
        its mold decision (``explain``); forget the jobs no longer waiting."""
        for d in decided:
            share = d.inputs.get("admit_share")
            if d.shrink is not None and isinstance(share, int):
                for job_id in d.shrink.admits:
                    self._shares[job_id] = share
        for gone in [j for j in self._shares if j not in waiting]:
            del self._shares[gone]


def _pending_extension_nodes(store: ActuatorStore, snap: ClusterSnapshot) -> set[str]:
    """Nodes that waiting extension jobs name (``--nodelist``, as the store recorded it): free now, but
    promised to a grow."""
    out: set[str] = set()
    for rec in store.jobs.extensions(active_only=True):
        job = snap.job(rec.job_id)
        if job is not None and job.is_pending:
            out.update(stored_nodes(rec.nodelist))
    return out


def _new_decision(m: Mold, policy: PolicyConfig, dry_run: bool, share: int | None) -> NewDecision:
    inputs: Mapping[str, object] = {**m.inputs, "basis": "queue",
                                    **({"plan_share": share} if share is not None else {})}
    return NewDecision(job_id=m.candidate.job_id, action=MOLD_ACTION, reason=str(m.reason), message=m.message,
                       inputs=dict(inputs), current_nodes=m.candidate.request_nodes, target_nodes=m.nodes,
                       signal=None, profile=policy.active_profile, paused=False, dry_run=dry_run)
