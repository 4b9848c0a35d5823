"""One controller cycle: the imperative shell around pure deciders (kueue's shape: facts in, decisions out, then
named write steps). :meth:`Controller._cycle` is the list of steps:

1. hold the lease, snapshot Slurm (refuse to act on an old one);
2. observe: build the elastic units (directives parsed once, units.py) and store what the cycle saw of each job;
3. the controller's deciders, each pure on the cycle's facts and followed by its write step (record, then the
   actuator's journaled cancels): failed resumes (power.py), failed or joined prewarms (coldstart.py), losses to
   Slurm (losses.py);
4. finish shrinks whose grace is over;
5. build the policy input (samples collected and stored, history, back-offs, power, shares, the waiting jobs'
   moldable floors for the round plan) and ``decide``;
6. record the decisions (every grow and shrink; a hold when it changed, else every hold_heartbeat_s);
7. moldable starts (molds.py: decide_molds, recorded, then the actuator);
8. act on the grows and shrinks (journaled; never in dry-run, never without the lease, never twice for a unit
   that has an action in flight).

Only the actuator (actuator.py, cancels.py) writes to Slurm, each write journaled first. One unit's failure never
stops the cycle. Reconcile (on start and periodically, :meth:`Controller.reconcile`) is in controller/reconcile.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from slurm_elastic.backoff import extension_ends
from slurm_elastic.controller.actuator import Actuator
from slurm_elastic.controller.admits import AdmitFollower
from slurm_elastic.controller.coldstart import ColdStarts
from slurm_elastic.controller.config import ControllerConfig
from slurm_elastic.controller.grants import Joins
from slurm_elastic.controller.history import HISTORY_SPAN, resize_history, with_time_limit_added
from slurm_elastic.controller.hold_filter import HoldFilter
from slurm_elastic.controller.lease import hold_lease, this_process
from slurm_elastic.controller.losses import LossRecorder
from slurm_elastic.controller.metrics import ControllerMetrics, cycle_metrics
from slurm_elastic.controller.molds import Molds
from slurm_elastic.controller.observe import Observer
from slurm_elastic.controller.pauses import paused_units, with_paused_jobs
from slurm_elastic.controller.ports import AgentCollector, Clock, ControllerStore, SlurmControl
from slurm_elastic.controller.power import ResumeFailures
from slurm_elastic.controller.progress import journal_since, with_progress
from slurm_elastic.controller.reconcile import is_known_key, reconcile_pass
from slurm_elastic.controller.rulings import CycleContext, Ruling
from slurm_elastic.controller.shares import AccountingCache
from slurm_elastic.controller.units import SpecCache, build_units
from slurm_elastic.errors import ConfigError
from slurm_elastic.policy import (
    Action,
    Decision,
    ElasticUnit,
    PolicyConfig,
    PolicyInput,
    Reason,
    decide,
    parse_config,
)
from slurm_elastic.policy.inputs import PolicyInputBuilder
from slurm_elastic.policy.model import ActionInProgress
from slurm_elastic.policy.wording import ago
from slurm_elastic.slurm.adapter import PowerConfigReader
from slurm_elastic.slurm.errors import SlurmError
from slurm_elastic.slurm.model import ClusterSnapshot
from slurm_elastic.slurm.openapi import gc_paused
from slurm_elastic.store.errors import StoreError
from slurm_elastic.store.records import (
    ActionKind,
    ActionRecord,
    FencingToken,
    NewDecision,
    stored_nodes,
)

log = logging.getLogger(__name__)

Collector = AgentCollector


@dataclass
class CycleSummary:
    cycle_id: int | None
    decisions: list[Decision] = field(default_factory=list)
    acted: dict[int, str] = field(default_factory=dict)  # unit id -> outcome text
    error: str | None = None
    skipped: str | None = None  # why the cycle did not run (no lease, stale snapshot, Slurm down)


@dataclass
class CycleFacts:
    """What a cycle knows before it decides: the snapshot, its elastic units, the leaders' node lists as last
    observed, Slurm's ResumeTimeout, and (once the shrinks whose grace is over are done) the open actions."""

    snap: ClusterSnapshot
    units: tuple[ElasticUnit, ...]
    by_id: dict[int, ElasticUnit]
    before: dict[int, tuple[str, ...]]
    resume_timeout: float | None
    open_actions: dict[int, ActionRecord] = field(default_factory=dict)


class Controller:
    def __init__(self, cfg: ControllerConfig, policy: PolicyConfig, *, slurm: SlurmControl, store: ControllerStore,
                 collector: AgentCollector, clock: Clock = lambda: datetime.now(tz=UTC),
                 actuator: Actuator | None = None, metrics: ControllerMetrics | None = None) -> None:
        self.cfg = cfg
        self.policy = policy
        self.slurm = slurm
        self.store = store
        self.collector = collector
        self.clock = clock
        self.actuator = actuator or Actuator(slurm, store, cfg.extension_env, extension_qos=cfg.extension_qos,
                                             notice_grace_s=cfg.notice_grace_s)
        self.losses = LossRecorder(store)  # extensions Slurm took away: preemption, node failure (losses.py)
        self.power = ResumeFailures(store)  # Slurm power saving: resume times, failed resumes (power.py)
        self.coldstart = ColdStarts(store, self.power.tracker)  # --prewarm grows: failures, phases (coldstart.py)
        self.joins = Joins(store)  # which grows joined their job (grants.py)
        self.holds = HoldFilter(cfg.hold_heartbeat_s)  # holds are stored by change (hold_filter.py)
        self.specs = SpecCache()
        self.molds = Molds(store, self.actuator, self.specs)  # moldable start (molds.py)
        self.admits = AdmitFollower(verify_s=max(60.0, 5 * cfg.interval_s))  # did shrink-to-admit work?
        self.accounting = AccountingCache(slurm, cfg.accounting_refresh_s)  # sshare weights, Slurm GPU limits
        self.observer = Observer(cfg, slurm, store, collector)  # jobs, samples, goodput, serving (observe.py)
        self._slurm_down_since: float | None = None
        self._db_down_since: float | None = None  # the state DB failed a lease step since then
        self._token: FencingToken | None = None
        self.process = this_process()  # recorded in the lease: a successor checks whether it still runs
        self.policy_version: int | None = None  # the stored policy version in force (None: file or defaults)
        self.metrics = metrics  # per-cycle series; the daemon's observe_cycle() adds timing, lease and totals

    # --- lease ------------------------------------------------------------------------------------------
    def _hold_lease(self) -> FencingToken | None:
        """The lease step of a cycle or reconcile pass; it is also where an unreachable state DB shows first."""
        try:
            lease = hold_lease(self.store.lease, self.cfg.holder_name, timedelta(seconds=self.cfg.lease_ttl_s),
                               process=self.process, stale_after=timedelta(seconds=self.cfg.lease_stale_after_s),
                               now=self.store.now)
        except StoreError:
            if self._db_down_since is None:
                self._db_down_since = time.monotonic()
            raise
        if self._db_down_since is not None:
            log.info("the state DB answers again after %.0fs", time.monotonic() - self._db_down_since)
            self._db_down_since = None
        if lease is None:
            if self._token is not None:
                log.warning("lease lost to another controller; standing by")
            self._token = None
            return None
        if self._token is None:
            log.info("holding the controller lease (epoch %d)", lease.epoch)
        self._token = lease.token()
        return self._token

    def refresh_policy(self) -> None:
        """Pick up a policy version stored with ``policy set``/``rollback`` since the last cycle. A version that
        no longer validates (stored by another release) is logged once and the running policy kept."""
        try:
            current = self.store.policies.current_policy()
        except StoreError as e:
            log.warning("cannot read the stored policy, keeping the running one: %s", e)
            return
        if current is None or current.version == self.policy_version:
            return
        self.policy_version = current.version
        try:
            self.policy = parse_config(current.toml_text, source=f"policy version {current.version}")
        except ConfigError as e:
            log.error("policy version %d refused, keeping the running policy: %s", current.version, e)
            return
        log.info("policy version %d by %s in force", current.version, current.author)

    # --- Slurm -----------------------------------------------------------------------------------------------
    def _snapshot(self) -> ClusterSnapshot | None:
        """A snapshot, or None while Slurm does not answer (logged once per outage, not once per cycle)."""
        try:
            snap = self.slurm.snapshot()
        except SlurmError as e:
            if self._slurm_down_since is None:
                self._slurm_down_since = time.monotonic()
                log.error("Slurm unavailable, not acting until it answers: %s", e)
            return None
        if self._slurm_down_since is not None:
            log.info("Slurm answers again after %.0fs", time.monotonic() - self._slurm_down_since)
            self._slurm_down_since = None
        return snap

    def _is_known_key(self, parent: int, key: str) -> bool:
        return is_known_key(self.store, parent, key)

    # --- the cycle -----------------------------------------------------------------------------------------
    def run_cycle(self) -> CycleSummary:
        try:
            token = self._hold_lease()
            if token is None:
                return CycleSummary(cycle_id=None, skipped="not the lease holder")
            self.refresh_policy()
            cycle_id = self.store.decisions.begin_cycle(holder=self.cfg.holder_name, dry_run=self.cfg.dry_run)
        except StoreError as e:  # DB locked, full or cut off: no lease and no journal, so no action
            self._token = None  # (docs/reliability.md); the lease must be won again, and may be another's by then
            log.error("cycle skipped, the state DB is unavailable: %s", e)
            return CycleSummary(cycle_id=None, error=str(e))
        summary = CycleSummary(cycle_id=cycle_id)
        try:
            self._cycle(summary, token)
        except (SlurmError, StoreError) as e:
            summary.error = str(e)
            log.error("cycle %d failed: %s", cycle_id, e)
        try:
            self.store.decisions.finish_cycle(cycle_id, decisions=len(summary.decisions),
                                              actions=len(summary.acted), error=summary.error or summary.skipped)
        except StoreError as e:
            log.error("cannot record the end of cycle %d: %s", cycle_id, e)
        return summary

    def _cycle(self, summary: CycleSummary, token: FencingToken) -> None:
        """The cycle, step by step: facts in, pure deciders, then the named write steps (only the actuator
        touches Slurm, each write journaled first)."""
        fresh = self._fresh_snapshot(summary)
        if fresh is None:
            return
        snap, now = fresh
        ctx = CycleContext(cycle_id=summary.cycle_id or 0, token=token, now=now)
        facts = self._observe(snap)  # units, and what the cycle saw of each job (stored by change)
        self._controller_deciders(facts, ctx, summary)  # failed resumes/prewarms, cold starts, losses
        facts.open_actions = self._finish_pending_shrinks(snap, facts.by_id, ctx, summary)  # grace over
        policy, inp = self._policy_input(facts, ctx.now)  # samples, history, back-offs, power, shares
        with gc_paused():  # pure, leaves no cyclic garbage; GC would only rescan the snapshot
            decisions = decide(inp, policy, ctx.now)
        summary.decisions = decisions
        if self.metrics is not None:
            cycle_metrics(self.metrics, snap, facts.units, inp.utilization, decisions, now=ctx.now,
                          has_spec=lambda job_id: getattr(self.store.jobs.get_job(job_id), "spec", None) is not None)
        ids = self._record_decisions(decisions, ctx)  # every grow and shrink; holds by change
        summary.acted.update(self.molds.run(  # waiting elastic jobs that can start now on fewer nodes
            snap, policy, decisions, read_script=self._read_script, ctx=ctx, dry_run=self.cfg.dry_run,
            record=lambda rows: self.store.decisions.record_decisions(ctx.cycle_id, rows, fencing=token)))
        if not self.cfg.dry_run:
            self._act(decisions, ids, facts, ctx, summary)  # grows and shrinks, journaled (actuator.py)

    # --- the steps -------------------------------------------------------------------------------------------
    def _fresh_snapshot(self, summary: CycleSummary) -> tuple[ClusterSnapshot, datetime] | None:
        """This cycle's snapshot and time; None (and why, in ``summary``) when Slurm is down or the snapshot is
        too old."""
        snap = self._snapshot()
        if snap is None:
            summary.skipped = "Slurm unavailable"
            return None
        now = self.clock()
        age = snap.age_seconds(now)
        if age > self.cfg.max_snapshot_age_s:
            limit = self.cfg.max_snapshot_age_s
            summary.skipped = f"snapshot {ago(age, limit)} old > max {limit:.0f}s"
            log.warning("not acting: %s", summary.skipped)
            return None
        return snap, now

    def _observe(self, snap: ClusterSnapshot) -> CycleFacts:
        """The units (directives parsed once, here: units.py) and the jobs' rows, stored by change."""
        with gc_paused():  # a unit per elastic job: GC would only rescan the snapshot (as the parse)
            built = build_units(snap, read_script=self._read_script, is_known_key=self._is_known_key,
                                cache=self.specs)
        known = self.store.jobs.list_jobs(active_only=True)  # as last observed, before this cycle updates them
        built = with_time_limit_added(built, known)
        built = self.molds.apply(built, known)  # a molded unit's max is its request
        units = {u.unit_id: u for u in built.units}
        before = {r.job_id: stored_nodes(r.nodelist) for r in known if r.job_id in units}
        with gc_paused():  # a row per unit on a first cycle: GC would rescan the snapshot for each batch of them
            self.observer.observe_jobs((*built.units, *built.booting), built.sources, built.not_elastic, snap, known)
        return CycleFacts(snap, built.units, units, before, self._resume_timeout())

    def _controller_deciders(self, facts: CycleFacts, ctx: CycleContext, summary: CycleSummary) -> None:
        """The controller's own deciders (pure, on this cycle's facts), each followed by its write step: an
        earlier one's records are facts for the next (a failed resume is not also a loss)."""
        snap, units, now, dry = facts.snap, facts.by_id, ctx.now, self.cfg.dry_run
        self._write_rulings(self.power.decide(units, snap, now, resume_timeout_s=facts.resume_timeout, dry_run=dry,
                                               backoff_s=self.policy.power_resume_backoff_s), ctx, summary)
        self._write_rulings(self.coldstart.decide(units, snap, now, dry_run=dry), ctx, summary)
        self.joins.note(units, snap, now)  # grows whose extension joined: the GPUs granted (grants.py)
        self._write_rulings(self.losses.decide(units, snap, now, previous_nodes=facts.before), ctx, summary)

    def _policy_input(self, facts: CycleFacts, now: datetime) -> tuple[PolicyConfig, PolicyInput]:
        """The policy in force (paused jobs held) and its input, built from this cycle's facts."""
        snap, units = facts.snap, facts.by_id
        recent = self.store.journal.list_actions(since=now - HISTORY_SPAN)  # newest first
        last_hour = [a for a in recent if a.created_at >= now - timedelta(hours=1)]
        for admitted in self.admits.follow(last_hour, snap, now):
            if self.metrics is not None:
                self.metrics.admits.labels(admitted.outcome).inc()
        policy = with_paused_jobs(self.policy, paused_units(facts.units, self.store.pauses.list_pauses()))
        builder = PolicyInputBuilder(policy, now, self.cfg.interval_s)
        m = self.metrics
        samples, measures = self.observer.measure(snap, facts.units, builder,
                                                  None if m is None else lambda n: m.scrape_errors.labels(n).inc())
        if any(u.spec.prewarm is not None for u in facts.units):  # measured cold starts: the restart cost
            for uid, cost in self.coldstart.restart_s(now).items():
                if uid in measures:
                    measures[uid] = replace(measures[uid], cold_start_s=cost)
        serving = self.observer.serving_loads(facts.units, builder)
        history = resize_history(recent, units) + self.losses.history(units, now)
        since = journal_since(facts.units, now, HISTORY_SPAN)  # a unit that started before the day read above
        lives = history if since is None else (resize_history(self.store.journal.list_actions(since=since), units)
                                               + self.losses.history(units, now))
        return policy, builder.build(
            snap, with_progress(facts.units, lives, now), samples=samples, measures=measures, history=history,
            in_progress=[ActionInProgress(unit_id, str(a.kind), a.created_at)
                         for unit_id, a in facts.open_actions.items()],
            extension_ends=extension_ends(self.store, now), account_shares=self.accounting.shares(),
            gpu_limits=self.accounting.gpu_limits(), extension_qos=self.cfg.extension_qos or None,
            serving=serving, power=self.power.state(now, policy.power_resume_backoff_s, facts.resume_timeout),
            pending_min_nodes=self.molds.floors(snap, policy, self._read_script))  # the plan's shares

    def _record_decisions(self, decisions: Sequence[Decision], ctx: CycleContext) -> list[int | None]:
        """Every grow and shrink; a hold when it changed, else every hold_heartbeat_s (hold_filter.py). Returns
        each decision's row id (None: a hold not stored)."""
        with gc_paused():  # a decision per unit, and a row for each that changed (as observe_jobs)
            new = [self._new_decision(d) for d in decisions]
            recorded = self.holds.record(self.store, ctx.cycle_id, new, ctx.now, fencing=ctx.token)
        if self.metrics is not None:
            self.metrics.holds_unchanged.inc(recorded.skipped)
        return list(recorded.ids)

    def _act(self, decisions: Sequence[Decision], ids: Sequence[int | None], facts: CycleFacts,
             ctx: CycleContext, summary: CycleSummary) -> None:
        """The policy's grows and shrinks through the actuator (journaled; one unit's failure never stops the
        cycle)."""
        snap, units = facts.snap, facts.by_id
        for d, decision_id in zip(decisions, ids, strict=True):
            if d.action == Action.HOLD or decision_id is None:
                continue
            try:
                if d.action == Action.GROW and d.grow is not None:
                    summary.acted[d.unit_id] = self.actuator.grow(d, snap, decision_id, ctx, spec=units[d.unit_id].spec)
                elif d.action == Action.SHRINK and d.shrink is not None:
                    summary.acted[d.unit_id] = self.actuator.start_shrink(d, decision_id, ctx, snap)
            except (SlurmError, StoreError) as e:  # one unit's failure never stops the cycle
                summary.acted[d.unit_id] = f"error: {e}"
                log.error("acting on job %s failed: %s", d.display_id, e)
            if d.unit_id in summary.acted and self.metrics is not None:
                self.metrics.actions.labels(str(d.action), outcome_class(summary.acted[d.unit_id])).inc()
            if d.unit_id in summary.acted:
                log.info("job %s: %s %d->%d (%s: %s) -> %s", d.display_id, d.action, d.current_nodes,
                         d.target_nodes, d.reason, d.message, summary.acted[d.unit_id])

    def _read_script(self, job_id: int) -> str | None:
        try:
            return self.slurm.batch_script(job_id)
        except SlurmError as e:
            log.warning("cannot read the batch script of job %d: %s", job_id, e)
            return None

    def _write_rulings(self, rulings: Sequence[Ruling], ctx: CycleContext, summary: CycleSummary) -> None:
        """The write step of the controller's deciders: record their decisions, then (outside dry-run) have the
        actuator carry out the cancels they ask for, each journaled first. One unit's failure never stops the
        cycle."""
        if not rulings:
            return
        ids = self.store.decisions.record_decisions(ctx.cycle_id, [v.decision for v in rulings], fencing=ctx.token)
        for v, decision_id in zip(rulings, ids, strict=True):
            d = v.decision
            log.log(logging.INFO if d.action == str(Action.HOLD) and d.reason == str(Reason.COLD_START)
                    else logging.WARNING, "job %d: %s %s->%s (%s: %s)", d.job_id, d.action, d.current_nodes,
                    d.target_nodes, d.reason, d.message)
            if self.metrics is not None:
                self.metrics.decisions.labels(d.action, d.reason).inc()
            self.holds.forget(d.job_id)
            if v.cancel is None or self.cfg.dry_run:
                continue
            try:
                summary.acted[d.job_id] = self.actuator.cancel_extension(v.cancel, decision_id, ctx)
            except (SlurmError, StoreError) as e:  # the open action is finished by reconcile
                summary.acted[d.job_id] = f"error: {e}"
                log.error("cancelling extension job %d of job %d failed: %s", v.cancel.extension_job, d.job_id, e)

    def _resume_timeout(self) -> float | None:
        """Slurm's ResumeTimeout, when the backend reads it (None: unknown; the policy then uses its estimate)."""
        if not isinstance(self.slurm, PowerConfigReader):
            return None
        try:
            return self.slurm.resume_timeout_s()
        except SlurmError as e:
            log.warning("cannot read ResumeTimeout: %s", e)
            return None

    def _finish_pending_shrinks(self, snap: ClusterSnapshot, units: Mapping[int, ElasticUnit],
                                ctx: CycleContext, summary: CycleSummary) -> dict[int, ActionRecord]:
        """Shrinks whose grace is over are carried out now; returns the actions still open, by unit."""
        still_open: dict[int, ActionRecord] = {}
        for action in self.store.journal.open_actions():
            if action.kind != ActionKind.SHRINK:
                still_open.setdefault(action.job_id, action)
                continue
            unit = units.get(action.job_id)
            ext_ids = {e.job_id for e in unit.extensions} if unit else set()
            try:
                outcome = self.actuator.finish_shrink(action, snap, min_nodes=unit.min_nodes if unit else None,
                                                      extension_ids=ext_ids, ctx=ctx)
            except (SlurmError, StoreError) as e:
                outcome = f"error: {e}"
            if outcome is None:
                still_open[action.job_id] = action
            else:
                summary.acted[action.job_id] = outcome
                log.info("job %d: shrink after grace -> %s", action.job_id, outcome)
        return still_open

    def _new_decision(self, d: Decision) -> NewDecision:
        inputs = dict(d.inputs)
        inputs["basis"] = str(d.basis)
        return NewDecision(job_id=d.unit_id, action=str(d.action), reason=str(d.reason), message=d.message,
                           inputs=inputs, current_nodes=d.current_nodes, target_nodes=d.target_nodes,
                           signal=d.signal, profile=d.profile, paused=d.reason == "PAUSED",
                           dry_run=self.cfg.dry_run)

    # --- reconcile (controller/reconcile.py) ------------------------------------------------------------
    def reconcile(self, older_than: timedelta = timedelta(seconds=0)) -> list[str]:
        """Bring the journal and Slurm back in agreement (after a crash, or drift). Returns what it did.
        A locked or full DB, or Slurm failing mid-way, ends this pass with one error line (like a cycle): what
        was done is journaled, the rest is picked up by the next pass."""
        try:
            token = self._hold_lease()
            if token is None:
                return []
            snap = self._snapshot()
            if snap is None:
                return []
            return reconcile_pass(snap, slurm=self.slurm, store=self.store, older_than=older_than,
                                  final_states=self.observer.final_states,
                                  cancel=lambda c: self.actuator.recover_extension(c, token))
        except (StoreError, SlurmError) as e:
            log.error("reconcile pass stopped, retried at the next one: %s", e)
            return []


def outcome_class(text: str) -> str:
    """The actuator's outcome text as a metric label: ok, failed or aborted."""
    low = text.lower()
    if low.startswith(("error", "grow failed", "shrink failed", "refused")):
        return "failed"
    if low.startswith(("aborted", "job gone")):
        return "aborted"
    return "ok"


