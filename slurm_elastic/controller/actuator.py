"""The one place that turns decisions into effects on Slurm, each journaled before it runs.

Grow: journal an intent with an idempotency key, then submit one extension job (the leader's script, as its
owner) whose comment carries the key, then record the extension and mark the action applied. A crash anywhere
in between leaves a dangling intent that reconcile resolves by looking for the key in Slurm: found means
applied, not found means aborted. Nothing is ever submitted twice for one key.

Shrink: journal the intent (with its plan and the grace deadline), write the resize notice and send the grace
signal, and come back on a later cycle once the job has acknowledged its checkpoint or the grace period is over;
then re-check the plan against the current snapshot (never below min, never the batch host) and carry it out:
cancel extension jobs (newest first), shrink a partly released extension in place, then release leader nodes with
``scontrol update NodeList=``. A shrink called off withdraws its notice.

Cancel: an extension job whose grow failed before it joined (a failed resume or prewarm) is cancelled under a
journaled ``cancel_extension`` action (controller/cancels.py), finished by reconcile after a crash.

Every resize is announced to the training processes first (slurm_elastic/resize.py, controller/notices.py): a
shrink's notice lasts its grace period; a grow's notice is written just before the extension job is submitted,
and the extension job's launcher starts its workers once the running ones have acknowledged (at most
``notice_grace_s`` later). A known acknowledgement time shortens a grow notice's deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from slurm_elastic.controller.cancels import cancel_extension, resolve_cancel
from slurm_elastic.controller.extension import build_request, prewarm_of, rendezvous_endpoint
from slurm_elastic.controller.notices import NoticeBoard, NoticeError
from slurm_elastic.controller.rulings import CancelExtension, CycleContext
from slurm_elastic.directives.spec import ElasticSpec
from slurm_elastic.policy import Decision
from slurm_elastic.policy.moldable import Mold
from slurm_elastic.resize import Notice, make_notice
from slurm_elastic.slurm.adapter import Molder, ResizeRefusedError, SlurmControl
from slurm_elastic.slurm.errors import SlurmError, SlurmJobNotFoundError, SlurmTransientError
from slurm_elastic.slurm.model import ClusterSnapshot, Job
from slurm_elastic.store.protocols import ActuatorStore
from slurm_elastic.store.records import ActionKind, ActionRecord, ActionState, FencingToken

log = logging.getLogger(__name__)

#: Test-only fault hook (tests/cluster/test_controller_e2e.py): called with a step name; a test makes it kill
#: the process to prove that reconcile recovers from a crash between intent and outcome.
FaultHook = Callable[[str], None]


def _no_fault(step: str) -> None:
    return None


@dataclass
class Actuator:
    slurm: SlurmControl
    store: ActuatorStore
    extension_env: Mapping[str, str]
    fault: FaultHook = _no_fault
    extension_qos: str = ""  # [extension] qos; "" = the leader's QOS
    notice_grace_s: float = 30.0  # [extension] notice_grace_s: how long a grow waits for the job's checkpoint
    notices: NoticeBoard = field(default_factory=NoticeBoard)
    _grow_notices: dict[int, Notice] = field(default_factory=dict)  # unit id -> its last grow notice
    _ack_s: dict[int, float] = field(default_factory=dict)  # unit id -> how long its last acknowledgement took

    # --- resize notices ------------------------------------------------------------------------------------
    def known_ack_s(self, unit_id: int, job: Job | None) -> float | None:
        """How long the job took to acknowledge its last notice, when the controller has seen one."""
        last = self._grow_notices.get(unit_id)
        if last is not None and job is not None:
            try:
                ack = self.notices.acknowledgement(job, unit_id, last.id)
            except NoticeError:
                ack = None
            if ack is not None:
                self._ack_s[unit_id] = max(0.0, round(ack.time - last.time, 3))
                del self._grow_notices[unit_id]
        return self._ack_s.get(unit_id)

    def grow_notice_s(self, unit_id: int, job: Job | None) -> float:
        """The grow notice's grace: ``notice_grace_s``, or 4x the job's known acknowledgement time (at least
        5 s) when that is shorter: the extension waits for the acknowledgement anyway, the deadline only bounds
        the wait when none comes."""
        known = self.known_ack_s(unit_id, job)
        if known is None:
            return self.notice_grace_s
        return min(self.notice_grace_s, max(MIN_NOTICE_S, 4 * known))

    def _post_notice(self, job: Job | None, unit_id: int, notice: Notice) -> str:
        """Write the notice; returns a note for the outcome text."""
        if job is None:
            return "; no resize notice: job not in the snapshot"
        try:
            self.notices.post(job, unit_id, notice)
        except NoticeError as e:
            log.info("job %s: no resize notice: %s", job.display_id, e)
            return f"; no resize notice: {e}"
        return f"; notice {notice.kind} due in {notice.deadline - notice.time:.0f}s"

    # --- grow ------------------------------------------------------------------------------------------
    def grow(self, d: Decision, snap: ClusterSnapshot, decision_id: int | None, ctx: CycleContext, *,
             spec: ElasticSpec) -> str:
        """``spec``: the unit's directives as controller/units.py read them (its ``--prewarm``)."""
        assert d.grow is not None
        unit = snap.job(d.unit_id)
        if unit is None:
            return "job gone before acting"
        plan = d.grow
        cycle_id, token, now = ctx.cycle_id, ctx.token, ctx.now
        key = f"grow:{d.unit_id}:{cycle_id}"
        gpus = sum(g.count for g in plan.gres_per_node if g.name == "gpu") * len(plan.nodes)
        known_ack = self.known_ack_s(d.unit_id, unit)
        notice_s = self.grow_notice_s(d.unit_id, unit)
        action_id = self.store.journal.record_intent(
            job_id=d.unit_id, kind=ActionKind.GROW, idempotency_key=key, decision_id=decision_id,
            cycle_id=cycle_id, nodes=len(plan.nodes), gpus=gpus, fencing=token,
            params={"nodes": list(plan.nodes), "from": d.current_nodes, "to": d.target_nodes,
                    "reason": str(d.reason), "time_limit_sub_s": plan.time_limit_sub_s,
                    "notice_s": notice_s, "last_ack_s": known_ack})
        self.fault("grow:after-intent")
        self.store.journal.mark_in_progress(action_id, fencing=token)
        try:
            script_owner = unit.het_job_id if unit.het_job_id is not None else unit.job_id
            script = self.slurm.batch_script(script_owner)
            prewarm = prewarm_of(spec)
            if prewarm is None:
                notice = make_notice("grow", notice_s, now=now.timestamp(), from_nodes=d.current_nodes,
                                     to_nodes=d.target_nodes, notice_id=key)
                notice_note = self._post_notice(unit, d.unit_id, notice)
                if not notice_note.startswith("; no "):
                    self._grow_notices[d.unit_id] = notice
            else:  # the leader is not disturbed until the new nodes are ready: their launcher posts the notice
                notice_note = f"; prewarm first (timeout {prewarm[1]}s), notice once the new nodes are ready"
            batch = snap.node(unit.batch_host) if unit.batch_host else None
            sub_min = _give_back_min(unit, plan.time_limit_sub_s)
            # The extension never outlives the leader: its limit is the leader's once the give-back is done.
            sized = replace(unit, time_limit_min=(unit.time_limit_min or 0) - sub_min) if sub_min else unit
            req = build_request(sized, plan.nodes, key, now,
                                rendezvous=rendezvous_endpoint(unit, batch.address if batch else None),
                                base_env=self.extension_env, qos=self.extension_qos, notice_grace_s=notice_s,
                                prewarm=prewarm, gres=plan.gres_per_node, partition=plan.partition)
            ext_id = self.slurm.submit_as(req.user, script, req.sbatch_args, env=req.env)
        except SlurmError as e:
            self.store.journal.mark_failed(action_id, _msg(e), transient=isinstance(e, SlurmTransientError))
            return f"grow failed: {_msg(e)}"
        self.fault("grow:after-submit")
        self.store.jobs.record_extension(job_id=ext_id, parent_job_id=d.unit_id, node_count=len(plan.nodes),
                                         state="PENDING", action_id=action_id, idempotency_key=key,
                                         nodelist=",".join(plan.nodes))
        note = self._give_back_time_limit(unit, sub_min)
        self.store.journal.mark_applied(action_id,
                                        f"extension job {ext_id} on {','.join(plan.nodes)}{note}{notice_note}")
        return f"extension job {ext_id} submitted{note}{notice_note}"

    def _give_back_time_limit(self, leader: Job, sub_min: int) -> str:
        """After the extension is submitted: lower the leader's time limit by ``sub_min`` (out of what shrinks
        added) and count it as given back. A failure is logged and leaves the grow applied.

        The count goes down before Slurm's limit does (and up again on failure): a crash in between leaves it
        too low, never too high, so later give-backs can never take more than shrinks added."""
        if sub_min <= 0:
            return ""
        self.store.jobs.add_time_limit(leader.job_id, -sub_min)
        try:
            new = self.slurm.shorten_time_limit(leader, sub_min)
        except SlurmError as e:
            self.store.jobs.add_time_limit(leader.job_id, sub_min)
            log.warning("job %s: giving back %d min of time limit after the grow failed: %s", leader.display_id,
                        sub_min, _msg(e))
            return f"; time limit give-back of -{sub_min}min failed: {_msg(e)}"
        return f"; time limit {leader.time_limit_min} -> {new} min (-{sub_min}min)"

    # --- shrink, phase 1: intent + grace signal ------------------------------------------------------------
    def start_shrink(self, d: Decision, decision_id: int | None, ctx: CycleContext,
                     snap: ClusterSnapshot | None = None) -> str:
        assert d.shrink is not None
        job = snap.job(d.unit_id) if snap is not None else None
        plan = d.shrink
        cycle_id, token, now = ctx.cycle_id, ctx.token, ctx.now
        key = f"shrink:{d.unit_id}:{cycle_id}"
        deadline = now + timedelta(seconds=d.grace_s)
        params: dict[str, Any] = {
            "from": d.current_nodes, "to": d.target_nodes, "reason": str(d.reason), **plan.to_dict(),
            "signal": d.signal, "grace_s": d.grace_s, "deadline": deadline.isoformat(),
            "last_ack_s": self.known_ack_s(d.unit_id, job),
        }
        # The GPUs it gives back (what status and the metrics count as reclaimed once it is applied): the
        # job's GPUs per node on each released node (extension jobs have the leader's GRES per node).
        gpus = job.gpus_per_node() * len(plan.released_nodes) if job is not None else 0
        action_id = self.store.journal.record_intent(
            job_id=d.unit_id, kind=ActionKind.SHRINK, idempotency_key=key, decision_id=decision_id,
            cycle_id=cycle_id, nodes=len(plan.released_nodes), gpus=gpus, fencing=token, params=params)
        self.fault("shrink:after-intent")
        # The job is warned (notice, signal) *before* the action is marked in progress: "in progress" is what
        # lets another controller carry the shrink out, so it must never be on record for an unwarned job. A
        # controller that dies, or loses the DB's reply to that mark, between the two leaves either a warned
        # job's shrink in progress or an intent that finish_shrink aborts (a later cycle warns anew).
        notice_note = ""
        if d.grace_s > 0:  # the notice's id is the action's key: finish_shrink looks for its acknowledgement
            notice_note = self._post_notice(job, d.unit_id, make_notice(
                "shrink", d.grace_s, now=now.timestamp(), from_nodes=d.current_nodes, to_nodes=d.target_nodes,
                notice_id=key, release=tuple(plan.released_nodes)))
        outcome = f"nodes go after {d.grace_s}s or at the acknowledgement{notice_note}" if d.grace_s > 0 \
            else "no grace period"
        if d.signal and d.grace_s > 0:
            try:
                self.slurm.signal(d.unit_id, d.signal)
            except SlurmJobNotFoundError as e:
                self.store.journal.abort(action_id, f"job gone before the grace signal: {_msg(e)}")
                return "job gone"
            except SlurmError as e:  # the shrink still waits out the grace; the failure is on record
                log.warning("grace signal %s to job %s failed: %s", d.signal, d.unit_id, _msg(e))
            outcome = f"SIG{d.signal} sent; {outcome}"
            self.fault("shrink:after-signal")
        self.store.journal.mark_in_progress(action_id, fencing=token)
        return outcome

    # --- shrink, phase 2: after the grace period ---------------------------------------------------------------
    def finish_shrink(self, action: ActionRecord, snap: ClusterSnapshot, *, min_nodes: int | None,
                      extension_ids: set[int], ctx: CycleContext) -> str | None:
        """Carry out a shrink whose grace period is over. None while the grace period still runs."""
        token, now = ctx.token, ctx.now
        p = action.params
        leader = snap.job(action.job_id)
        if action.state == ActionState.INTENT and action.attempts == 0 and p.get("signal") \
                and float(p.get("grace_s") or 0) > 0:
            # Never in progress: the controller died (or lost the DB) between the intent and the mark that
            # follows the grace signal, so the job may never have been warned. Take no node unwarned: withdraw
            # any notice (held workers train on); a later cycle decides (and signals) anew (docs/reliability.md).
            self._withdraw(leader, action)
            self.store.journal.abort(action.id, "the grace signal may not have been sent (crash after the intent)")
            return "aborted: grace signal not known to be sent"
        ack_note = self._shrink_ack(action, leader, now)
        if ack_note is None:
            return None
        if action.state == ActionState.INTENT:  # a transient failure put it back: another attempt
            self.store.journal.mark_in_progress(action.id, fencing=token)
        if leader is None or not leader.is_running:
            self.store.journal.abort(action.id, "job no longer running")
            return "job gone"
        after = _nodes_after(p, leader, snap, extension_ids)
        if min_nodes is not None and after < min_nodes:
            self.store.journal.abort(action.id, f"would leave {after} nodes < min {min_nodes}: the job changed")
            self._withdraw(leader, action)
            return "aborted: below min"
        try:
            for ext_id in p.get("cancel_extensions") or []:
                ext = snap.job(int(ext_id))
                if ext is not None and ext.state in {"PENDING", "RUNNING", "CONFIGURING", "SUSPENDED"}:
                    self.slurm.cancel(int(ext_id))
                self.store.jobs.update_extension(int(ext_id), state="CANCELLED", ended=True)
            part = p.get("shrink_extension")
            if part:
                ext = snap.job(int(part["job_id"]))
                if ext is not None and ext.is_running and len(part["keep_nodes"]) < len(ext.nodes):
                    self.slurm.shrink(ext, part["keep_nodes"])
            keep = p.get("leader_keep_nodes")
            if keep is not None and len(keep) < len(leader.nodes):
                self.slurm.shrink(leader, keep)
        except ResizeRefusedError as e:
            self.store.journal.abort(action.id, f"refused: {e}")
            self._withdraw(leader, action)
            return f"refused: {e}"
        except SlurmError as e:
            self.store.journal.mark_failed(action.id, _msg(e), transient=isinstance(e, SlurmTransientError))
            return f"shrink failed: {_msg(e)}"
        released = ",".join(p.get("released_nodes") or [])
        outcome = f"released {released}{ack_note}{self._extend_time_limit(action, leader)}"
        # The notice stays: the held workers leave their hold when the released nodes' peers die (their
        # heartbeat collective fails and torchrun restarts them); withdrawing it now could let them take a step
        # with a peer that is still dying. Acknowledged, it is pending for no one.
        self.store.journal.mark_applied(action.id, outcome)
        return outcome

    def _shrink_ack(self, action: ActionRecord, leader: Job | None, now: datetime) -> str | None:
        """None while the shrink must still wait: before its deadline, unless the job acknowledged the notice
        (then the note says after how long, and that time is remembered for the job)."""
        p = action.params
        deadline = datetime.fromisoformat(str(p["deadline"]))
        ack = None
        if leader is not None and float(p.get("grace_s") or 0) > 0:
            try:
                ack = self.notices.acknowledgement(leader, action.job_id, action.idempotency_key)
            except NoticeError:
                ack = None
        if ack is not None:
            grace = float(p.get("grace_s") or 0)
            took = max(0.0, round(ack.time - (deadline.timestamp() - grace), 3))
            self._ack_s[action.job_id] = took
            return f"; checkpoint acknowledged after {took:.1f}s"
        if now < deadline:
            return None
        return "; no acknowledgement: grace period over" if float(p.get("grace_s") or 0) > 0 else ""

    def _withdraw(self, leader: Job | None, action: ActionRecord) -> None:
        """Remove a called-off shrink's notice: workers holding after their checkpoint train on."""
        if leader is None:
            return
        try:
            self.notices.withdraw(leader, action.job_id, action.idempotency_key)
        except NoticeError as e:
            log.debug("job %s: notice not withdrawn: %s", leader.display_id, e)

    def _extend_time_limit(self, action: ActionRecord, leader: Job) -> str:
        """After the nodes are gone: raise the leader's time limit by the plan's ``time_limit_add_s``.

        Returns a note for the journal's message ('' when there is nothing to do). A failure is logged and
        recorded there; it never undoes the shrink, which has happened.
        """
        add_s = int(action.params.get("time_limit_add_s") or 0)
        if add_s <= 0:
            return ""
        if leader.time_limit_min is None:
            return "; time limit not extended: the job has no time limit"
        add_min = -(-add_s // 60)  # whole minutes, rounded up
        try:
            new = self.slurm.extend_time_limit(leader, add_min)
        except SlurmError as e:
            log.warning("job %s: extending the time limit by %d min after the shrink failed: %s",
                        leader.display_id, add_min, _msg(e))
            return f"; time limit extension by +{add_min}min failed: {_msg(e)}"
        # What a later grow may give back; counted after Slurm took it, so a crash leaves the count too low (safe).
        self.store.jobs.add_time_limit(leader.job_id, add_min)
        return f"; time limit {leader.time_limit_min} -> {new} min (+{add_min}min)"


    # --- cancel of an extension job (controller/cancels.py) -----------------------------------------------------
    def cancel_extension(self, c: CancelExtension, decision_id: int | None, ctx: CycleContext) -> str:
        """Journal, then scancel an extension job whose grow failed before it joined."""
        return cancel_extension(self.slurm, self.store, c, decision_id=decision_id, cycle_id=ctx.cycle_id,
                                token=ctx.token, fault=self.fault)

    def recover_extension(self, c: CancelExtension, token: FencingToken | None) -> str:
        """Journal, then scancel an extension job for one of reconcile's recoveries (no decision, no cycle)."""
        return cancel_extension(self.slurm, self.store, c, decision_id=None, cycle_id=None, token=token,
                                fault=self.fault)

    def resolve_cancel(self, action: ActionRecord, snap: ClusterSnapshot) -> str:
        """An open cancel after a crash or a transient refusal: finish it (reconcile)."""
        return resolve_cancel(self.slurm, self.store, action, snap)

    # --- moldable start ----------------------------------------------------------------------------------------
    def mold(self, m: Mold, snap: ClusterSnapshot, decision_id: int | None, ctx: CycleContext) -> str:
        """Reshape a waiting job to ``NumNodes=<size>-<request>`` with its time limit scaled (policy/moldable.py).

        Journaled intent -> in progress -> outcome under the key ``mold:<job id>`` (a job is molded once); the
        update sets absolute values, so :meth:`resolve_mold` may simply repeat it after a crash."""
        job = snap.job(m.candidate.job_id)
        if job is None or not job.is_pending:
            return "job no longer pending"
        add_min = -(-m.time_limit_add_s // 60)
        limit = None if add_min <= 0 or job.time_limit_min is None else job.time_limit_min + add_min
        gpus = m.nodes * m.candidate.gpus_per_node
        action_id = self.store.journal.record_intent(
            job_id=job.job_id, kind=ActionKind.MOLD, idempotency_key=mold_key(job.job_id), decision_id=decision_id,
            cycle_id=ctx.cycle_id, nodes=m.nodes, gpus=gpus, fencing=ctx.token,
            params={"from": m.candidate.request_nodes, "to": m.nodes, "reason": str(m.reason),
                    "time_limit_min": limit, "time_limit_was_min": job.time_limit_min,
                    "time_limit_add_min": add_min if limit is not None else 0})
        self.fault("mold:after-intent")
        self.store.journal.mark_in_progress(action_id, fencing=ctx.token)
        return self._do_mold(self.store.journal.get(action_id), job)

    def _do_mold(self, action: ActionRecord, job: Job) -> str:
        p = action.params
        limit = p.get("time_limit_min")
        try:
            self.slurm_molder().mold(job, int(p["to"]), int(p["from"]), None if limit is None else int(limit))
        except ResizeRefusedError as e:
            self.store.journal.abort(action.id, f"refused: {e}")
            return f"refused: {e}"
        except SlurmError as e:
            self.store.journal.mark_failed(action.id, _msg(e), transient=isinstance(e, SlurmTransientError))
            return f"mold failed: {_msg(e)}"
        note = "" if limit is None else f", time limit {p.get('time_limit_was_min')} -> {limit} min"
        outcome = f"NumNodes={p['to']}-{p['from']}{note}"
        self.store.journal.mark_applied(action.id, outcome)
        return outcome

    def resolve_mold(self, action: ActionRecord, snap: ClusterSnapshot) -> str:
        """An open mold after a crash: still pending, the update is repeated (absolute values); started smaller
        than it asked, it was applied; otherwise (started as asked, or gone) it is aborted."""
        job = snap.job(action.job_id)
        if action.state == ActionState.INTENT:
            self.store.journal.mark_in_progress(action.id)
        if job is not None and job.is_pending:
            return "reconciled: " + self._do_mold(action, job)
        if job is not None and job.is_running and len(job.nodes) < int(action.params.get("from", 0)):
            self.store.journal.mark_applied(action.id, f"reconciled: started on {len(job.nodes)} node(s)")
            return f"reconciled: started on {len(job.nodes)} node(s)"
        self.store.journal.abort(action.id, "reconciled: the job is no longer pending")
        return "reconciled: aborted, the job is no longer pending"

    def slurm_molder(self) -> Molder:
        if not isinstance(self.slurm, Molder):
            raise ResizeRefusedError("this Slurm backend cannot reshape a waiting job")
        return self.slurm


def mold_key(job_id: int) -> str:
    """The journal key of a job's moldable start: one per job."""
    return f"mold:{int(job_id)}"


MIN_NOTICE_S = 5.0


def _give_back_min(leader: Job, sub_s: int) -> int:
    """Whole minutes of a grow's time limit give-back; 0 for a job without a limit, or one it would end."""
    sub_min = sub_s // 60
    if leader.time_limit_min is None or leader.time_limit_min - sub_min < 1:
        return 0
    return sub_min


def _nodes_after(p: Mapping[str, Any], leader: Job, snap: ClusterSnapshot, extension_ids: set[int]) -> int:
    """Node count of the unit once the plan is done, from the *current* snapshot (trusted extensions only)."""
    keep = p.get("leader_keep_nodes")
    total = len(keep) if keep is not None else len(leader.nodes)
    cancelled = {int(x) for x in p.get("cancel_extensions") or []}
    part = p.get("shrink_extension")
    for ext_id in extension_ids - cancelled:
        job = snap.job(ext_id)
        if job is None or not job.is_running:
            continue
        total += len(part["keep_nodes"]) if part and int(part["job_id"]) == job.job_id else len(job.nodes)
    return total


def _msg(e: SlurmError) -> str:
    return getattr(e, "message", None) or str(e)
