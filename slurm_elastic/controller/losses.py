"""Slurm-side losses: extension jobs that Slurm takes away without the controller asking
(preemption, node failure), recorded as decisions so that cooldown and explain see them.

An extension job can run in a preemptible QOS (``[extension] qos = "scavenger"``): a higher-priority job then
makes Slurm preempt it (``PreemptMode=REQUEUE`` on a ``--no-requeue`` job ends it in state ``PREEMPTED``,
measured on the test cluster). A node under an extension can die: Slurm marks it ``DOWN`` after
``SlurmdTimeout`` and ends a job whose batch host it was with ``NODE_FAIL``. In both cases the elastic unit
shrank, and nobody decided it. This module makes that shrink a decision on record:

* :func:`find_losses` (pure) compares the store's extension records with the snapshot: an extension in state
  ``PREEMPTED`` (reason ``PREEMPTED_BY_SLURM``) or ``NODE_FAIL`` (``NODE_FAILURE``), or still running on a node
  that is ``DOWN`` (``NODE_FAILURE``: with ``--no-kill`` a multi-node extension outlives a lost node). A node
  that is only ``NOT_RESPONDING`` is not a loss yet: ``SlurmdTimeout`` is the site's ruling on when a silent
  node is dead, and the job on it keeps running if it answers again.
* :class:`LossRecorder` has the cycle record each loss exactly once as a ``shrink`` decision with
  ``current -> target`` node counts and inputs naming the extension job, its nodes, the lost nodes and the Slurm
  state. "Once" holds across cycles and restarts: the decisions table is the record, keyed by (extension job,
  lost node).
* :meth:`LossRecorder.history` turns those decisions back into :class:`~slurm_elastic.policy.ResizeRecord`\\ s
  (applied shrinks) for the policy, so a loss starts the unit's cooldown like any resize: the unit does not
  regrow into the same contention at once. The journal is left alone: nothing was done to Slurm, so there is
  nothing to reconcile, and GPU totals (``reclaimed``) count only what the controller gave back.

The pure policy never decides these; the shell records them. A lost extension is not also a script failure:
``PREEMPTED`` and ``NODE_FAIL`` are excluded from the grow back-off (:data:`SLURM_LOSS_STATES`), whose job is
to stop resubmitting an extension that dies on its own; the cooldown is the only wait after a loss.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from slurm_elastic.controller.rulings import Ruling
from slurm_elastic.policy import Action, ElasticUnit, Outcome, Reason, ResizeRecord
from slurm_elastic.slurm.model import ClusterSnapshot, Node
from slurm_elastic.store.protocols import ControllerStore
from slurm_elastic.store.records import ActionKind, DecisionFilter, ExtensionRecord, NewDecision, stored_nodes

log = logging.getLogger(__name__)

#: Final job states in which Slurm, not the controller or the job itself, ended an extension job.
SLURM_LOSS_STATES: Mapping[str, Reason] = {"PREEMPTED": Reason.PREEMPTED_BY_SLURM,
                                           "NODE_FAIL": Reason.NODE_FAILURE}
LOSS_REASONS: tuple[Reason, ...] = (Reason.PREEMPTED_BY_SLURM, Reason.NODE_FAILURE)
#: Node base states in which Slurm has given a node up (a job on it is lost).
DEAD_NODE_STATES = frozenset({"DOWN", "FAIL", "FAILING"})
#: Extension records that ended longer ago than this are not looked at again (a loss is seen within a cycle or
#: a reconcile of its end; this only bounds the query).
LOOKBACK = timedelta(hours=1)
#: History reaches back this far (the longest cooldown the policy schema allows is one day).
HISTORY_SPAN = timedelta(days=1)


@dataclass(frozen=True)
class Loss:
    """One extension job (or some of its nodes) that Slurm took from a unit."""

    unit_id: int
    extension_job: int
    reason: Reason
    slurm_state: str  # the extension job's state, as the snapshot (or, once it left squeue, the store) has it
    nodes: tuple[str, ...]  # the extension's nodes
    lost_nodes: tuple[str, ...]  # the nodes the unit lost with it
    node_states: Mapping[str, str]  # lost node -> its Slurm state with flags ("DOWN+NOT_RESPONDING"), if listed
    counted: int  # how many of lost_nodes the unit's current size (from the snapshot) still counts


def _node_state(node: Node | None) -> str:
    if node is None:
        return "GONE"
    return "+".join((node.state, *node.state_flags))


def _is_dead(node: Node | None) -> bool:
    return node is None or node.state in DEAD_NODE_STATES


def find_losses(unit: ElasticUnit, records: Iterable[ExtensionRecord], snap: ClusterSnapshot,
                already: Iterable[tuple[int, str]] = ()) -> list[Loss]:
    """The losses of ``unit`` among its extension ``records`` not yet in ``already`` ((extension, node) pairs
    recorded before), ordered by extension job id. Pure."""
    seen = set(already)
    out: list[Loss] = []
    for rec in sorted(records, key=lambda r: r.job_id):
        if rec.parent_job_id != unit.unit_id:
            continue
        job = snap.job(rec.job_id)
        state = job.state if job is not None else rec.state
        recorded = stored_nodes(rec.nodelist)
        nodes = tuple(job.nodes) if job is not None and job.nodes else recorded
        running = job is not None and job.is_running
        if state in SLURM_LOSS_STATES:
            reason = SLURM_LOSS_STATES[state]
            lost = nodes or recorded
        elif running:
            # With --no-kill an extension outlives one of its nodes; Slurm may already have dropped the dead
            # node from the job's node list, so look at the nodes it was submitted on too.
            reason = Reason.NODE_FAILURE
            lost = tuple(n for n in dict.fromkeys((*nodes, *recorded)) if _is_dead(snap.node(n)))
        else:
            continue
        lost = tuple(n for n in lost if (rec.job_id, n) not in seen)
        if not lost:
            continue
        counted = sum(1 for n in lost if running and job is not None and n in job.nodes)
        out.append(Loss(unit_id=unit.unit_id, extension_job=rec.job_id, reason=reason, slurm_state=state,
                        nodes=nodes, lost_nodes=lost, node_states={n: _node_state(snap.node(n)) for n in lost},
                        counted=counted))
    return out


def find_leader_losses(unit: ElasticUnit, previous_nodes: Sequence[str], snap: ClusterSnapshot,
                       released_by_us: Iterable[str] = (), already: Iterable[tuple[int, str]] = ()) -> list[Loss]:
    """Nodes the leader job itself lost since the last cycle (``previous_nodes``: its node list then). A job
    submitted with ``--no-kill`` outlives a failed non-batch node: Slurm drops the node from the job (measured
    on 22.05: ``NodeList`` and ``NumNodes`` shrink, the job stays RUNNING). A node counts as lost when it left
    the job's node list, the controller did not release it (``released_by_us``: our shrinks' nodes) and Slurm
    has given it up (``DOWN``/``FAIL``, or gone). Keyed by (leader job, node), like extension losses. Pure."""
    job = unit.job
    if not job.is_running:
        return []
    seen, ours = set(already), set(released_by_us)
    lost = tuple(n for n in previous_nodes
                 if n not in job.nodes and n not in ours and _is_dead(snap.node(n)) and (job.job_id, n) not in seen)
    if not lost:
        return []
    return [Loss(unit_id=unit.unit_id, extension_job=job.job_id, reason=Reason.NODE_FAILURE, slurm_state=job.state,
                 nodes=tuple(job.nodes), lost_nodes=lost, node_states={n: _node_state(snap.node(n)) for n in lost},
                 counted=0)]


def loss_decisions(unit: ElasticUnit, losses: Sequence[Loss]) -> list[NewDecision]:
    """One shrink decision per loss, the node counts chained: the first goes from the unit's size before any of
    these losses, the last ends at its size now (what the snapshot counts). Pure."""
    after = unit.current_nodes - sum(loss.counted for loss in losses)
    current = after + sum(len(loss.lost_nodes) for loss in losses)
    out: list[NewDecision] = []
    for loss in losses:
        target = current - len(loss.lost_nodes)
        what = ("preempted by Slurm" if loss.reason == Reason.PREEMPTED_BY_SLURM
                else f"lost with node(s) {','.join(loss.lost_nodes)}")
        who = (f"the leader job {loss.extension_job} (--no-kill) lost node(s) {','.join(loss.lost_nodes)} and "
               f"goes on on {','.join(loss.nodes)}" if loss.extension_job == unit.job.job_id else
               f"extension job {loss.extension_job} ({','.join(loss.nodes) or '?'}) {what}")
        out.append(NewDecision(
            job_id=unit.unit_id, action=str(Action.SHRINK), reason=str(loss.reason),
            message=(f"{who}: Slurm state {loss.slurm_state}; the unit runs on {target} node(s); counts as a "
                     f"resize (cooldown)"),
            inputs={"extension_job": loss.extension_job, "extension_nodes": list(loss.nodes),
                    "lost_nodes": list(loss.lost_nodes), "slurm_state": loss.slurm_state,
                    "node_states": dict(loss.node_states), "from_nodes": current, "to_nodes": target,
                    "basis": "slurm", "recorded_by": "controller (not the policy)"},
            current_nodes=current, target_nodes=target))
        current = target
    return out


class LossRecorder:
    """The shell around :func:`find_losses`: reads the store for the decisions to record, gives back history."""

    def __init__(self, store: ControllerStore) -> None:
        self.store = store

    def _recorded(self, unit_id: int, since: datetime) -> set[tuple[int, str]]:
        """(extension job, node) pairs already recorded as lost for the unit since ``since``."""
        out: set[tuple[int, str]] = set()
        # a failed resume (controller/power.py) is recorded as RESUME_FAILED, not again as a loss
        for reason in (*LOSS_REASONS, Reason.RESUME_FAILED):
            for d in self.store.decisions.list_decisions(DecisionFilter(job_id=unit_id, reason=str(reason),
                                                                        since=since)):
                ext = d.inputs.get("extension_job")
                if isinstance(ext, int):
                    out.update((ext, str(n)) for n in _as_list(d.inputs.get("lost_nodes")))
        return out

    def decide(self, units: Mapping[int, ElasticUnit], snap: ClusterSnapshot, now: datetime, *,
               previous_nodes: Mapping[int, Sequence[str]] | None = None) -> list[Ruling]:
        """The losses not recorded before, as shrink decisions for the cycle to record (also in dry-run: the loss
        happened in Slurm whatever the controller does). ``previous_nodes`` are the leaders' node lists as last
        observed (the store's job records before this cycle updates them), for leader node losses. Recorded
        under the lease's fencing token, a controller that lost the lease since its check records nothing: the
        new holder, which reads after taking the lease, records the loss once."""
        by_unit: dict[int, list[ExtensionRecord]] = {}
        for rec in self.store.jobs.extensions(active_only=False, ended_since=now - LOOKBACK):
            if rec.parent_job_id in units:
                by_unit.setdefault(rec.parent_job_id, []).append(rec)
        leader_suspects = {uid: prev for uid, prev in (previous_nodes or {}).items()
                           if uid in units and find_leader_losses(units[uid], prev, snap)}
        out: list[Ruling] = []
        for unit_id in sorted(set(by_unit) | set(leader_suspects)):
            unit = units[unit_id]
            records = by_unit.get(unit_id, [])
            if not find_losses(unit, records, snap) and unit_id not in leader_suspects:
                continue  # the common case: nothing lost, no query of the decisions table
            already = self._recorded(unit_id, since=now - HISTORY_SPAN)
            losses = find_losses(unit, records, snap, already)
            if unit_id in leader_suspects:
                losses += find_leader_losses(unit, leader_suspects[unit_id], snap,
                                             self._released_by_us(unit_id, now), already)
            out.extend(Ruling(d) for d in loss_decisions(unit, losses))
        return out

    def _released_by_us(self, unit_id: int, now: datetime) -> set[str]:
        out: set[str] = set()
        for a in self.store.journal.list_actions(job_id=unit_id, since=now - HISTORY_SPAN):
            if a.kind == ActionKind.SHRINK:
                out.update(str(n) for n in a.params.get("released_nodes") or [])
        return out

    def history(self, units: Mapping[int, ElasticUnit], now: datetime) -> tuple[ResizeRecord, ...]:
        """Recorded losses of ``units`` as applied shrinks, so each starts the unit's cooldown."""
        out: list[ResizeRecord] = []
        for reason in LOSS_REASONS:
            for d in self.store.decisions.list_decisions(DecisionFilter(reason=str(reason),
                                                                        since=now - HISTORY_SPAN)):
                if d.job_id in units:
                    out.append(ResizeRecord(at=d.time, unit_id=d.job_id, action=Action.SHRINK,
                                            from_nodes=d.current_nodes or 0, to_nodes=d.target_nodes or 0,
                                            outcome=Outcome.APPLIED, reason=str(reason)))
        return tuple(sorted(out, key=lambda r: (r.at, r.unit_id)))


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, (list, tuple)) else []
