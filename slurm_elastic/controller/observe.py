"""The I/O that gathers a cycle's facts besides the snapshot: what the cycle saw of each job (stored by change),
the agents' samples (one per unit), the goodput and adaptive-batch files, the serving units' loads.

The controller (controller/cycle.py) owns one :class:`Observer`; nothing here decides anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from slurm_elastic.controller.collect import CollectResult, merge_job
from slurm_elastic.controller.config import ControllerConfig
from slurm_elastic.controller.goodput import GoodputReader, StoreJournal
from slurm_elastic.controller.gradstats import GradStatsReader
from slurm_elastic.controller.ports import AgentCollector, ControllerStore, SlurmControl
from slurm_elastic.controller.power import note_powered_down
from slurm_elastic.controller.reconcile import ACTIVE, FinalStates
from slurm_elastic.controller.serving import ServingReader
from slurm_elastic.policy import ElasticUnit
from slurm_elastic.policy.inputs import PolicyInputBuilder, UnitMeasure
from slurm_elastic.policy.model import ServingLoad
from slurm_elastic.slurm.model import ClusterSnapshot
from slurm_elastic.store.records import (
    AgentScrape,
    ElasticJobRecord,
    JobObservation,
    NewSample,
    SampleRecord,
    SpecSource,
)

log = logging.getLogger(__name__)


class Observer:
    def __init__(self, cfg: ControllerConfig, slurm: SlurmControl, store: ControllerStore,
                 collector: AgentCollector) -> None:
        self.cfg = cfg
        self.slurm = slurm
        self.store = store
        self.collector = collector
        self.final_states = FinalStates()  # sacct's word on jobs that left squeue (reconcile.py)
        self.goodput = GoodputReader(StoreJournal(store))  # jobs' published throughput (docs/goodput.md)
        self.gradstats = GradStatsReader()  # opted-in jobs' adaptive-batch state (docs/goodput.md)
        self.serving = ServingReader(store.demand)  # serving units' load and latency (docs/serving.md)
        self._last_sample: dict[int, datetime] = {}

    def observe_jobs(self, units: tuple[ElasticUnit, ...], sources: Mapping[int, str],
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

    def unit_parts(self, unit: ElasticUnit) -> list[tuple[int, str]]:
        """(Slurm job id, node) for every node of the unit: the leader's and each running extension's."""
        parts = [(unit.job.job_id, n) for n in unit.job.nodes]
        for e in unit.running_extensions:
            parts.extend((e.job_id, n) for n in e.nodes)
        return parts

    def measure(self, snap: ClusterSnapshot, units: tuple[ElasticUnit, ...], builder: PolicyInputBuilder,
                scrape_error: Callable[[str], None] | None = None
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
            if scrape_error is not None:  # the metrics' count of failed scrapes, per node
                scrape_error(node)
        new: list[NewSample] = []
        measures: dict[int, UnitMeasure] = {}
        for u in units:
            merged = merge_job(u.unit_id, self.unit_parts(u), result.reports)
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

    def serving_loads(self, units: Sequence[ElasticUnit], builder: PolicyInputBuilder) -> dict[int, ServingLoad]:
        """What the serving units published over their long window, with their demand forecast."""
        loads: dict[int, ServingLoad] = {}
        for u in units:
            since = builder.reads(u).serving_since
            if since is not None and (found := self.serving.read_unit(u, builder.settings(u), builder.now,
                                                                       since)) is not None:
                loads[u.unit_id] = found
        self.serving.forget([u for u in units if u.spec.serving])
        return loads


def job_observation(u: ElasticUnit, source: str | None) -> JobObservation:
    """What a cycle stores of a unit (its elastic_jobs row); ``source``: where its spec came from (units.py)."""
    j = u.job
    return JobObservation(
        job_id=j.job_id, user=j.user, partition=j.partition, state=j.state, current_nodes=u.current_nodes,
        min_nodes=u.min_nodes, max_nodes=u.max_nodes, het_job_id=j.het_job_id, het_offset=j.het_job_offset,
        account=j.account, qos=j.qos, name=j.name, spec=u.spec.to_normalized(),
        spec_source=SpecSource.ADMIN_COMMENT if source == "admin_comment" else SpecSource.BATCH_SCRIPT,
        nodelist=",".join(j.nodes), gpus_per_node=j.gpus_per_node(), submit_time=j.submit_time)
