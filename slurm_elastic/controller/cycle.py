"""One controller cycle: the imperative shell around the pure policy.

A cycle: hold the lease -> snapshot Slurm (refuse to act on an old one) -> finish shrinks whose grace is over ->
build the elastic units -> collect agent metrics and store one sample per unit -> decide (pure) -> record the
decisions (every grow and shrink; a hold when it changed, else every hold_heartbeat_s: hold_filter.py) -> act on
the rest (journaled; never in dry-run, never without the lease, never twice for a unit that has an action in
flight). One unit's failure never stops the cycle.

Reconcile (on start and periodically, :meth:`Controller.reconcile`) is in controller/reconcile.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from slurm_elastic.controller.actuator import Actuator, CycleContext
from slurm_elastic.controller.admits import AdmitFollower
from slurm_elastic.controller.backoff import extension_ends
from slurm_elastic.controller.coldstart import ColdStarts
from slurm_elastic.controller.collect import CollectResult, merge_job
from slurm_elastic.controller.config import ControllerConfig
from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.controller.goodput import GoodputReader, StoreJournal
from slurm_elastic.controller.gradstats import GradStatsReader
from slurm_elastic.controller.grants import Joins
from slurm_elastic.controller.hold_filter import HoldFilter
from slurm_elastic.controller.lease import hold_lease, this_process
from slurm_elastic.controller.losses import LossRecorder
from slurm_elastic.controller.metrics import ControllerMetrics
from slurm_elastic.controller.molds import Molds
from slurm_elastic.controller.pauses import paused_units, with_paused_jobs
from slurm_elastic.controller.ports import AgentCollector, Clock, ControllerStore, SlurmControl
from slurm_elastic.controller.power import ResumeFailures, note_powered_down
from slurm_elastic.controller.progress import journal_since, with_progress
from slurm_elastic.controller.reconcile import ACTIVE, FinalStates, is_known_key, reconcile_pass
from slurm_elastic.controller.serving import ServingReader
from slurm_elastic.controller.shares import AccountingCache
from slurm_elastic.controller.units import SpecCache, UnitsResult, build_units
from slurm_elastic.controller.verdicts import Verdict
from slurm_elastic.errors import ConfigError
from slurm_elastic.policy import (
    Action,
    AdmitBasis,
    Decision,
    ElasticUnit,
    JobUtilization,
    Outcome,
    PolicyConfig,
    Reason,
    ResizeRecord,
    decide,
    parse_config,
)
from slurm_elastic.policy.inputs import PolicyInputBuilder, UnitMeasure
from slurm_elastic.policy.model import ActionInProgress, ExtensionEnd, ServingLoad
from slurm_elastic.policy.wording import ago
from slurm_elastic.slurm.adapter import PowerConfigReader
from slurm_elastic.slurm.errors import SlurmError
from slurm_elastic.slurm.model import ClusterSnapshot
from slurm_elastic.slurm.openapi import gc_paused
from slurm_elastic.store.errors import StoreError
from slurm_elastic.store.records import (
    ActionKind,
    ActionRecord,
    ActionState,
    AgentScrape,
    ElasticJobRecord,
    FencingToken,
    JobObservation,
    NewDecision,
    NewSample,
    SampleRecord,
    SpecSource,
)

log = logging.getLogger(__name__)

Collector = AgentCollector
# A cancel_extension (controller/cancels.py) ends a grow that never joined: no resize (GROW_BACKOFF covers it).
_KIND_ACTION = {ActionKind.GROW: Action.GROW, ActionKind.SHRINK: Action.SHRINK}
_STATE_OUTCOME = {ActionState.APPLIED: Outcome.APPLIED, ActionState.FAILED: Outcome.FAILED,
                  ActionState.ABORTED: Outcome.FAILED, ActionState.INTENT: Outcome.INTENT,
                  ActionState.IN_PROGRESS: Outcome.INTENT}


@dataclass
class CycleSummary:
    cycle_id: int | None
    decisions: list[Decision] = field(default_factory=list)
    acted: dict[int, str] = field(default_factory=dict)  # unit id -> outcome text
    error: str | None = None
    skipped: str | None = None  # why the cycle did not run (no lease, stale snapshot, Slurm down)


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
        self.final_states = FinalStates()  # sacct's word on jobs that left squeue (reconcile.py)
        self.accounting = AccountingCache(slurm, cfg.accounting_refresh_s)  # sshare weights, Slurm GPU limits
        self.goodput = GoodputReader(StoreJournal(store))  # jobs' published throughput (docs/goodput.md)
        self.gradstats = GradStatsReader()  # opted-in jobs' adaptive-batch state (docs/goodput.md)
        self.serving = ServingReader(store.demand)  # serving units' load and latency (docs/serving.md)
        self._last_sample: dict[int, datetime] = {}
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
        snap = self._snapshot()
        if snap is None:
            summary.skipped = "Slurm unavailable"
            return
        now = self.clock()
        age = snap.age_seconds(now)
        if age > self.cfg.max_snapshot_age_s:
            limit = self.cfg.max_snapshot_age_s
            summary.skipped = f"snapshot {ago(age, limit)} old > max {limit:.0f}s"
            log.warning("not acting: %s", summary.skipped)
            return
        ctx = CycleContext(cycle_id=summary.cycle_id or 0, token=token, now=now)
        with gc_paused():  # a unit per elastic job: GC would only rescan the snapshot (as the parse)
            built = build_units(snap, read_script=self._read_script, is_known_key=self._is_known_key,
                                cache=self.specs)
        known = self.store.jobs.list_jobs(active_only=True)  # as last observed, before this cycle updates them
        built = _with_time_limit_added(built, known)
        built = self.molds.apply(built, known)  # a molded unit's max is its request
        units = {u.unit_id: u for u in built.units}
        before = {r.job_id: tuple(n for n in (r.nodelist or "").split(",") if n) for r in known if r.job_id in units}
        with gc_paused():  # a row per unit on a first cycle: GC would rescan the snapshot for each batch of them
            self._observe_jobs((*built.units, *built.booting), built.sources, built.not_elastic, snap, known)
        resume_timeout = self._resume_timeout()
        # The controller's own deciders (pure, on this cycle's facts), each followed by its write step.
        self._write_verdicts(self.power.decide(units, snap, now, resume_timeout_s=resume_timeout,
                                               dry_run=self.cfg.dry_run, backoff_s=self.policy.power_resume_backoff_s),
                             ctx, summary)
        self._write_verdicts(self.coldstart.decide(units, snap, now, dry_run=self.cfg.dry_run), ctx, summary)
        self.joins.note(units, snap, now)  # grows whose extension joined: the GPUs granted (grants.py)
        self._write_verdicts(self.losses.decide(units, snap, now, previous_nodes=before), ctx, summary)
        open_by_unit = self._finish_pending_shrinks(snap, units, ctx, summary)
        recent = self.store.journal.list_actions(since=now - timedelta(days=1))  # newest first
        last_hour = [a for a in recent if a.created_at >= now - timedelta(hours=1)]
        for admitted in self.admits.follow(last_hour, snap, now):
            if self.metrics is not None:
                self.metrics.admits.labels(admitted.outcome).inc()
        policy = with_paused_jobs(self.policy, paused_units(built.units, self.store.pauses.list_pauses()))
        builder = PolicyInputBuilder(policy, now, self.cfg.interval_s)
        samples, measures = self._measure(snap, built.units, builder)
        if any(u.spec.prewarm is not None for u in built.units):  # measured cold starts: the restart cost
            for uid, cost in self.coldstart.restart_s(now).items():
                if uid in measures:
                    measures[uid] = replace(measures[uid], cold_start_s=cost)
        serving = self._serving_loads(built.units, builder)
        history = self._history(recent, units) + self.losses.history(units, now)
        since = journal_since(built.units, now, timedelta(days=1))  # a unit that started before the day read above
        lives = history if since is None else (self._history(self.store.journal.list_actions(since=since), units)
                                               + self.losses.history(units, now))
        inp = builder.build(
            snap, with_progress(built.units, lives, now), samples=samples, measures=measures, history=history,
            in_progress=[ActionInProgress(unit_id, str(a.kind), a.created_at) for unit_id, a in open_by_unit.items()],
            extension_ends=self._extension_ends(now), account_shares=self.accounting.shares(),
            gpu_limits=self.accounting.gpu_limits(), extension_qos=self.cfg.extension_qos or None,
            serving=serving, power=self.power.state(now, policy.power_resume_backoff_s, resume_timeout))
        with gc_paused():  # pure, leaves no cyclic garbage; GC would only rescan the snapshot
            decisions = decide(inp, policy, now)
        summary.decisions = decisions
        if self.metrics is not None:
            self._cycle_metrics(self.metrics, snap, built.units, inp.utilization, decisions, now=now)
        with gc_paused():  # a decision per unit, and a row for each that changed (as _observe_jobs)
            new = [self._new_decision(d) for d in decisions]
            recorded = self.holds.record(self.store, summary.cycle_id or 0, new, now, fencing=token)
        if self.metrics is not None:
            self.metrics.holds_unchanged.inc(recorded.skipped)
        summary.acted.update(self.molds.run(  # waiting elastic jobs that can start now on fewer nodes
            snap, policy, decisions, read_script=self._read_script, ctx=ctx, dry_run=self.cfg.dry_run,
            record=lambda rows: self.store.decisions.record_decisions(summary.cycle_id or 0, rows, fencing=token)))
        if self.cfg.dry_run:
            return
        for d, decision_id in zip(decisions, recorded.ids, strict=True):
            if d.action == Action.HOLD or decision_id is None:
                continue
            try:
                if d.action == Action.GROW and d.grow is not None:
                    summary.acted[d.unit_id] = self.actuator.grow(d, snap, decision_id, ctx)
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

    def _cycle_metrics(self, m: ControllerMetrics, snap: ClusterSnapshot, units: tuple[ElasticUnit, ...],
                       utilization: Mapping[int, JobUtilization], decisions: list[Decision], *,
                       now: datetime) -> None:
        for d in decisions:
            m.decisions.labels(str(d.action), str(d.reason)).inc()
        m.jobs((u.unit_id, u.job.user, u.job.partition, u.current_nodes,
                utilization[u.unit_id].mean_util if u.unit_id in utilization else None) for u in units)
        waits: dict[str, list[float]] = {}
        for j in snap.jobs:
            if j.is_pending and j.submit_time is not None and parse_tag(j.comment) is None:
                waits.setdefault(j.partition, []).append(max(0.0, (now - j.submit_time).total_seconds()))
        m.pending(waits)
        m.finished((j for j in snap.jobs if parse_tag(j.comment) is None),  # extension jobs are their parent's
                   lambda job_id: getattr(self.store.jobs.get_job(job_id), "spec", None) is not None)

    def _read_script(self, job_id: int) -> str | None:
        try:
            return self.slurm.batch_script(job_id)
        except SlurmError as e:
            log.warning("cannot read the batch script of job %d: %s", job_id, e)
            return None

    def _observe_jobs(self, units: tuple[ElasticUnit, ...], sources: Mapping[int, str],
                      not_elastic: Mapping[int, str], snap: ClusterSnapshot,
                      known: Sequence[ElasticJobRecord]) -> None:
        """Store what the cycle saw; ``known`` are the active records read before (what is not live has
        ended; jobs first stored now are running, so they are never among those)."""
        # One transaction, by change: a cycle in which no unit changed writes no row (store/jobs_sql.py).
        self.store.jobs.observe_jobs([job_observation(u, sources.get(u.unit_id)) for u in units])
        for job_id, reason in not_elastic.items():
            bad = snap.job(job_id)
            if bad is not None and self.store.jobs.get_job(job_id) is None:
                self.store.jobs.upsert_job(JobObservation(
                    job_id=bad.job_id, user=bad.user, partition=bad.partition, state=bad.state,
                    current_nodes=len(bad.nodes), min_nodes=len(bad.nodes), max_nodes=len(bad.nodes),
                    account=bad.account, qos=bad.qos, name=bad.name, spec_source=SpecSource.BATCH_SCRIPT,
                    spec_error=reason))
                log.info("job %s: directives ignored: %s", bad.display_id, reason)
        live = {j.job_id for j in snap.jobs if j.state in ACTIVE}
        # From 23.02 on finished jobs are not in squeue --all at all: how they ended comes from sacct.
        unseen = [r.job_id for r in known if r.job_id not in live and snap.job(r.job_id) is None]
        final = self.final_states.read(self.slurm, unseen)
        for rec in known:
            if rec.job_id not in live:
                gone = snap.job(rec.job_id)
                self.store.jobs.mark_job_ended(rec.job_id, gone.state if gone else final.get(rec.job_id, "ENDED"))

    def _unit_parts(self, unit: ElasticUnit) -> list[tuple[int, str]]:
        """(Slurm job id, node) for every node of the unit: the leader's and each running extension's."""
        parts = [(unit.job.job_id, n) for n in unit.job.nodes]
        for e in unit.running_extensions:
            parts.extend((e.job_id, n) for n in e.nodes)
        return parts

    def _measure(self, snap: ClusterSnapshot, units: tuple[ElasticUnit, ...], builder: PolicyInputBuilder
                 ) -> tuple[dict[int, list[SampleRecord]], dict[int, UnitMeasure]]:
        """The I/O behind the units' utilization: ask the metrics source (every agent, or Prometheus: the
        collector chosen at start), store one sample per unit, read back each unit's samples of its window and,
        where its settings use it, the goodput the job published."""
        # A node Slurm has switched off (or is booting) runs no agent: asking it would only record a failure.
        agents = {n.name: self.cfg.agents.url_for(n.name, n.address) for n in snap.nodes if not n.is_powered_off}
        note_powered_down(self.store, snap)  # their agents show as powered down, not stale (power.py)
        result = self.collector(agents) if units else CollectResult({}, {})
        self.store.agents.record_scrapes(  # one transaction for every node's scrape
            [AgentScrape(node, result.url(node, agents), version=report.agent_version,
                         gpu_count=result.gpu_count(node)) for node, report in result.reports.items()]
            + [AgentScrape(node, result.url(node, agents), error=err) for node, err in result.errors.items()])
        for node in result.errors:
            if self.metrics is not None:
                self.metrics.scrape_errors.labels(node).inc()
        new: list[NewSample] = []
        measures: dict[int, UnitMeasure] = {}
        for u in units:
            merged = merge_job(u.unit_id, self._unit_parts(u), result.reports)
            measures[u.unit_id] = UnitMeasure(merged.gpus_allocated, merged.gpus_in_use)
            # Partial coverage stores nothing: a silent agent must make metrics stale, not skew them.
            if merged.coverage < 1.0 or merged.util_mean_percent is None or merged.last_sample_at is None:
                continue
            at = datetime.fromtimestamp(merged.last_sample_at, tz=UTC)
            if self._last_sample.get(u.unit_id) is not None and at <= self._last_sample[u.unit_id]:
                continue  # the agent has nothing newer
            self._last_sample[u.unit_id] = at
            new.append(NewSample(job_id=u.unit_id, time=at, util_mean=merged.util_mean_percent,
                                 util_max=merged.util_max_percent or merged.util_mean_percent,
                                 gpus_alloc=merged.gpus_allocated, gpus_in_use=merged.gpus_in_use,
                                 sample_count=merged.sample_count))
        if new:
            self.store.samples.add_samples(new)
        samples: dict[int, list[SampleRecord]] = {}
        for u in units:
            reads = builder.reads(u)
            rows = samples[u.unit_id] = self.store.samples.samples(u.unit_id, since=reads.since)
            if rows and reads.goodput and (found := self.goodput.read_unit(u, builder.now)) is not None:
                measures[u.unit_id] = replace(measures[u.unit_id], throughput=found.samples,
                                              restart_s=found.restart_s)
            if rows and reads.goodput:
                per_node = measures[u.unit_id].gpus_allocated // max(1, u.current_nodes)
                adaptive = self.gradstats.read_unit(u, builder.now, per_node)
                if adaptive is not None:
                    measures[u.unit_id] = replace(measures[u.unit_id], adaptive=adaptive)
        self.gradstats.forget({p for u in units if (p := self.gradstats.path_for(u)) is not None})
        return samples, measures

    def _serving_loads(self, units: Sequence[ElasticUnit], builder: PolicyInputBuilder) -> dict[int, ServingLoad]:
        """What the serving units published over their long window, with their demand forecast."""
        loads: dict[int, ServingLoad] = {}
        for u in units:
            since = builder.reads(u).serving_since
            if since is not None and (found := self.serving.read_unit(u, builder.settings(u), builder.now,
                                                                       since)) is not None:
                loads[u.unit_id] = found
        self.serving.forget([u for u in units if u.spec.serving])
        return loads

    def _write_verdicts(self, verdicts: Sequence[Verdict], ctx: CycleContext, summary: CycleSummary) -> None:
        """The write step of the controller's deciders: record their decisions, then (outside dry-run) have the
        actuator carry out the cancels they ask for, each journaled first. One unit's failure never stops the
        cycle."""
        if not verdicts:
            return
        ids = self.store.decisions.record_decisions(ctx.cycle_id, [v.decision for v in verdicts], fencing=ctx.token)
        for v, decision_id in zip(verdicts, ids, strict=True):
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

    def _extension_ends(self, now: datetime) -> list[ExtensionEnd]:
        """The grows that ended within the grow back-off's look-back, failed ones marked (controller/backoff.py)."""
        return extension_ends(self.store, now)

    def _history(self, actions: Sequence[ActionRecord], units: Mapping[int, ElasticUnit]) -> tuple[ResizeRecord, ...]:
        """The units' resizes among ``actions`` (the journal of the last day) as the policy's history."""
        records: list[ResizeRecord] = []
        for a in actions:
            if a.job_id not in units or a.kind not in _KIND_ACTION:
                continue
            # A resize happens when it is applied (after the grace period for a shrink), not when it is decided.
            # A shrink-to-admit names the pending jobs it was for, and what each was based on: one record each,
            # so decide() backs off for a job that Slurm did not start after all, until something changes.
            admits: list[int | None] = [int(j) for j in a.params.get("admits") or []] or [None]
            bases = _admit_bases(a)
            records.extend(ResizeRecord(at=a.finished_at or a.created_at, unit_id=a.job_id,
                                        action=_KIND_ACTION[a.kind], from_nodes=int(a.params.get("from", 0)),
                                        to_nodes=int(a.params.get("to", 0)), outcome=_STATE_OUTCOME[a.state],
                                        reason=str(a.params.get("reason", "")), for_job=for_job,
                                        admit_basis=bases.get(for_job) if for_job is not None else None)
                           for for_job in admits)
        return tuple(records)

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
            if self._hold_lease() is None:
                return []
            snap = self._snapshot()
            if snap is None:
                return []
            return reconcile_pass(snap, slurm=self.slurm, store=self.store, older_than=older_than,
                                  final_states=self.final_states)
        except (StoreError, SlurmError) as e:
            log.error("reconcile pass stopped, retried at the next one: %s", e)
            return []


def job_observation(u: ElasticUnit, source: str | None) -> JobObservation:
    """What a cycle stores of a unit (its elastic_jobs row); ``source``: where its spec came from (units.py)."""
    j = u.job
    return JobObservation(
        job_id=j.job_id, user=j.user, partition=j.partition, state=j.state, current_nodes=u.current_nodes,
        min_nodes=u.min_nodes, max_nodes=u.max_nodes, het_job_id=j.het_job_id, het_offset=j.het_job_offset,
        account=j.account, qos=j.qos, name=j.name, spec=u.spec.to_normalized(),
        spec_source=SpecSource.ADMIN_COMMENT if source == "admin_comment" else SpecSource.BATCH_SCRIPT,
        nodelist=",".join(j.nodes), gpus_per_node=j.gpus_per_node(), submit_time=j.submit_time)


def outcome_class(text: str) -> str:
    """The actuator's outcome text as a metric label: ok, failed or aborted."""
    low = text.lower()
    if low.startswith(("error", "grow failed", "shrink failed", "refused")):
        return "failed"
    if low.startswith(("aborted", "job gone")):
        return "aborted"
    return "ok"


def _admit_bases(action: ActionRecord) -> dict[int, AdmitBasis]:
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


def _with_time_limit_added(built: UnitsResult, known: Sequence[ElasticJobRecord]) -> UnitsResult:
    """The units with what the controller has added to their time limits (the store keeps it; a grow may give
    it back, see extend_time_limit_on_shrink)."""
    added = {r.job_id: r.time_limit_added_min * 60 for r in known if r.time_limit_added_min > 0}
    if not added:
        return built
    return replace(built, units=tuple(replace(u, time_limit_added_s=added[u.unit_id]) if u.unit_id in added else u
                                      for u in built.units))
