"""Reconcile (on start and periodically): bring the journal and Slurm back in agreement after a crash or drift.

Resolve dangling grow intents by looking for their idempotency key in Slurm (found: applied; absent: aborted --
never resubmitted blindly), finish dangling extension cancels (controller/cancels.py), cancel extension jobs
whose leader is gone, and close the store's records of extension jobs Slurm no longer runs. The controller
(controller/cycle.py) holds the lease and takes the snapshot; :func:`reconcile_pass` does the rest.

Its three recovery cancels (a duplicate of a grow's extension, an orphan, an extension pending on a dead node) are
Slurm writes like any other: each goes through ``cancel``, the actuator's journaled ``cancel_extension`` (reasons
DUPLICATE_EXTENSION, ORPHAN_EXTENSION, PENDING_ON_DEAD_NODE), so a crash between its intent and its scancel is
finished by the next pass, and a repeated pass neither cancels twice nor opens a second row (one key per job).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import timedelta

from slurm_elastic.controller.cancels import resolve_cancel
from slurm_elastic.controller.extension import orphaned_extensions, parse_tag
from slurm_elastic.controller.ports import ControllerStore, SlurmControl
from slurm_elastic.controller.rulings import CancelExtension
from slurm_elastic.policy.capacity import is_resumable_node
from slurm_elastic.slurm.adapter import FinalStateReader
from slurm_elastic.slurm.errors import SlurmError
from slurm_elastic.slurm.model import ClusterSnapshot, Job, Node
from slurm_elastic.store.records import ActionKind, ActionState, stored_nodes

log = logging.getLogger(__name__)

ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "SUSPENDED", "COMPLETING"}


class FinalStates:
    """sacct's final states of jobs that left squeue unseen (the cycle and reconcile both ask); a failing sacct
    is said once per outage."""

    def __init__(self) -> None:
        self.failing = False

    def read(self, slurm: SlurmControl, job_ids: Sequence[int]) -> dict[int, str]:
        """{} without accounting (the records then close as ENDED, and a Slurm-side loss among them goes
        unrecorded: said once per outage)."""
        if not job_ids or not isinstance(slurm, FinalStateReader):
            return {}
        try:
            states = slurm.final_states(job_ids)
        except SlurmError as e:
            if not self.failing:
                log.warning("sacct unreadable (%s): extension jobs that left squeue unseen close as ENDED; a "
                            "preemption or node failure among them is not recorded", e)
            self.failing = True
            return {}
        self.failing = False
        return states


def is_known_key(store: ControllerStore, parent: int, key: str) -> bool:
    """Whether the journal holds a grow of ``parent`` with this idempotency key (an extension job is ours)."""
    rec = store.journal.find_by_idempotency_key(key)
    return rec is not None and rec.job_id == parent and rec.kind == ActionKind.GROW


#: The actuator's journaled cancel (Actuator.recover_extension under the pass's lease): returns its outcome.
Cancel = Callable[[CancelExtension], str]


def reconcile_pass(snap: ClusterSnapshot, *, slurm: SlurmControl, store: ControllerStore, older_than: timedelta,
                   final_states: FinalStates, cancel: Cancel) -> list[str]:
    """One pass on a fresh snapshot, under the lease. Returns what it did."""
    done: list[str] = []
    by_key: dict[str, list[Job]] = {}
    for j in snap.jobs:
        tag = parse_tag(j.comment)
        if tag is not None:
            by_key.setdefault(tag.key, []).append(j)
    for action in store.journal.dangling(older_than=older_than):
        if action.kind == ActionKind.CANCEL_EXTENSION:  # a crash between the intent and the outcome
            done.append(f"action {action.id}: {resolve_cancel(slurm, store, action, snap)}")
            continue
        if action.kind != ActionKind.GROW:
            continue  # shrinks are finished by the cycle after their grace period
        found = [j for j in by_key.get(action.idempotency_key, []) if j.user == _owner(snap, action.job_id, j)]
        if found:
            ext = min(found, key=lambda j: j.job_id)
            for dup in found:
                if dup.job_id != ext.job_id and dup.state in ACTIVE:  # never keep two for one key
                    outcome = cancel(CancelExtension(action.job_id, dup.job_id, "DUPLICATE_EXTENSION", dup.nodes,
                                                     recovery=True))
                    done.append(f"duplicate extension {dup.job_id} of action {action.id}: {outcome}")
            if action.state == ActionState.INTENT:
                store.journal.mark_in_progress(action.id)
            store.jobs.record_extension(job_id=ext.job_id, parent_job_id=action.job_id,
                                        node_count=ext.node_count, state=ext.state, action_id=action.id,
                                        idempotency_key=action.idempotency_key,
                                        nodelist=",".join(ext.nodes))
            store.journal.mark_applied(action.id, f"reconciled: extension job {ext.job_id} found")
            done.append(f"action {action.id}: found extension {ext.job_id}")
        else:
            store.journal.abort(action.id, "reconciled: no extension job carries its key")
            done.append(f"action {action.id}: aborted (nothing in Slurm)")
    live_leaders = {j.job_id for j in snap.jobs if j.is_running and parse_tag(j.comment) is None}
    for orphan in orphaned_extensions(snap.jobs, live_leaders, lambda parent, key: is_known_key(store, parent, key)):
        tag = parse_tag(orphan.comment)
        leader_rec = store.jobs.get_job(tag.parent) if tag else None
        if leader_rec is None or leader_rec.user != orphan.user:
            # Only the leader's owner's jobs are its extensions: a copied key on someone else's job is not
            # ours to cancel.
            continue
        outcome = cancel(CancelExtension(leader_rec.job_id, orphan.job_id, "ORPHAN_EXTENSION", orphan.nodes,
                                         recovery=True))
        done.append(f"orphan extension {orphan.job_id} of job {leader_rec.job_id}: {outcome}")
    active = list(store.jobs.extensions(active_only=True))
    final = final_states.read(slurm, [rec.job_id for rec in active if snap.job(rec.job_id) is None])
    for rec in active:
        job = snap.job(rec.job_id)
        if job is None or job.state not in ACTIVE:
            # A job that left squeue (MinJobAge) unseen ends as sacct has it, so a loss (PREEMPTED,
            # NODE_FAIL) while the controller was away is still recorded by the next cycle (losses.py).
            state = job.state if job is not None else final.get(rec.job_id, "ENDED")
            store.jobs.update_extension(rec.job_id, state=state, ended=True)
        elif job.is_pending and (dead := unusable_nodes(snap, rec.nodelist)):
            # Pinned (--nodelist) to a node that died before it started: it would pend forever and hold
            # the job's growth; cancel it so a later cycle can grow onto a live node (docs/reliability.md).
            outcome = cancel(CancelExtension(rec.parent_job_id, rec.job_id, "PENDING_ON_DEAD_NODE",
                                             stored_nodes(rec.nodelist), recovery=True))
            done.append(f"extension {rec.job_id} of job {rec.parent_job_id} pending on unusable node(s) {dead}: "
                        f"{outcome}")
        elif job.state != rec.state:
            store.jobs.update_extension(rec.job_id, state=job.state, nodelist=",".join(job.nodes))
    for line in done:
        log.info("reconcile: %s", line)
    return done


def unusable_nodes(snap: ClusterSnapshot, nodelist: str | None) -> str:
    """The nodes of ``nodelist`` that are gone, down, drained or not responding (comma-separated), or "". A node
    Slurm's power saving resumes for the job (powered down, or powering up) is not: ResumeTimeout decides
    whether it comes back (controller/power.py)."""
    names = list(stored_nodes(nodelist))
    return ",".join(n for n in names if (node := snap.node(n)) is None
                    or not (node.is_available or _booting(node)))


def _booting(node: Node) -> bool:
    if is_resumable_node(node):
        return True
    return ("POWERING_UP" in node.state_flags and node.state not in {"DOWN", "FAIL", "FAILING"}
            and "DRAIN" not in node.state_flags)


def _owner(snap: ClusterSnapshot, leader_id: int, fallback: object) -> str | None:
    leader = snap.job(leader_id)
    return leader.user if leader else getattr(fallback, "user", None)
