"""Discrete-event engine: a cluster of N nodes x G GPUs replaying a workload under the base scheduler.

Time is simulated seconds on the trace's clock; nothing here reads a clock or draws a random number, so a run
is a pure function of (config, jobs, performance models, policy).

Events, in time order (at equal times: completions, then arrivals, then the scheduling cycle, so a cycle sees
everything that happened at its instant):

* **arrival** — the job joins the queue;
* **completion** — the job reaches its last epoch boundary; its GPUs are released at once;
* **cycle** — every ``interval`` seconds, at t = k * interval (k >= 1): the elastic policy (if any) is called,
  shrinks are applied, the base scheduler starts queued jobs, grows are applied. Jobs start only at cycles, as
  in the Pollux artifact (which schedules every 60 s) and as Slurm's periodic backfill does.

Without a policy a cycle is skipped when it cannot change anything (nothing arrived or ended since the last
one, and for backfill no running job has passed its expected end): results are identical to running every
cycle, and a two-month trace does not pay for 90,000 idle cycles.

Between events a running job advances at the rate its performance model gives for its current shape and epoch,
so its completion time is computed exactly when it starts or is resized, and re-computed after every change.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from enum import IntEnum

from slurm_elastic.policy.fragmentation import stranded_free
from slurm_elastic.policy.moldable import CountedFree, MoldCandidate, plan_molds
from slurm_elastic.sim.cluster import Allocation, Cluster
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.elastic import ElasticPolicy, ResizeOutcome, ResizeRequest
from slurm_elastic.sim.errors import PerfModelError, SimulationError, WorkloadError
from slurm_elastic.sim.perfmodel.base import JobPerf, Shape
from slurm_elastic.sim.records import JobRecord, SimResult, UsageInterval
from slurm_elastic.sim.resizing import ElasticHook
from slurm_elastic.sim.scheduler import PendingJob, plan
from slurm_elastic.sim.simjob import SimJob
from slurm_elastic.sim.workload import JobSpec

__all__ = ["JobRecord", "SimResult", "Simulation", "UsageInterval"]


class _Event(IntEnum):  # value = order among events at the same instant
    COMPLETE = 0
    ARRIVE = 1
    CYCLE = 2


def _walk(
    perf: JobPerf, shape: Shape, position: tuple[int, float], start: float, until: float
) -> tuple[int, float, float]:
    """Advance from (epoch, progress) at time ``start`` on ``shape`` until ``until`` or completion.

    Returns (epoch, progress, time reached); epoch == num_epochs means done at the returned time.
    """
    epoch, progress = position
    now = start
    while epoch < perf.num_epochs:
        boundary = perf.epoch_end(epoch)
        rate = perf.rate(shape, epoch)
        if not rate > 0:
            raise PerfModelError(f"non-positive progress rate {rate} on {shape} in epoch {epoch}")
        need = max(0.0, boundary - progress) / rate
        if now + need > until:
            return epoch, progress + rate * (until - now), until
        now += need
        progress = boundary
        epoch += 1
    return epoch, progress, now


def _cycle_at_or_after(t: float, interval: float) -> float:
    return math.ceil(t / interval - 1e-9) * interval


class Simulation(ElasticHook):
    """One run. Build it, call :meth:`run` once."""

    def __init__(
        self,
        config: SimConfig,
        jobs: Sequence[JobSpec],
        perf: Mapping[str, JobPerf],
        policy: ElasticPolicy | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.config = config
        self.cluster = Cluster(config.num_nodes, config.gpus_per_node, power=config.power, clock=lambda: self.now)
        self.policy = policy
        # Moldable start: SimConfig's switch, or the policy's own ``moldable_start`` key (the one the controller
        # reads; a production policy exposes it), so that a policy file switches it in both places.
        self._molding = policy is not None and (config.moldable_start or bool(getattr(policy, "moldable_start", False)))
        self._mold_if_faster = bool(getattr(policy, "mold_only_if_faster", False))
        self.on_progress = on_progress
        self.now = 0.0
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._jobs: list[SimJob] = []
        self._by_id: dict[str, SimJob] = {}
        self._pending: list[SimJob] = []  # priority order
        self._pending_views: list[PendingJob] = []  # the same, as the scheduler sees them
        self._earliest_end: float | None = None  # min expected end of running jobs; None = recompute
        self._running: dict[int, SimJob] = {}
        self._dirty = False
        self._next_cycle: float | None = None
        self._last_cycle: float | None = None
        self._done = 0
        self._usage: list[UsageInterval] = []
        self._queue: list[tuple[float, int]] = []
        self._outcomes: list[ResizeOutcome] = []
        self._stranded: list[tuple[float, int, int]] = []
        ordered = sorted(enumerate(jobs), key=lambda item: (item[1].submit_time, item[0]))
        for index, (_, spec) in enumerate(ordered):
            if spec.job_id in self._by_id:
                raise WorkloadError(f"job id {spec.job_id} appears twice")
            job_perf = perf.get(spec.job_id)
            if job_perf is None:
                raise WorkloadError(f"no performance model for job {spec.job_id}")
            job = self._make_job(index, spec, job_perf)
            self._jobs.append(job)
            self._by_id[spec.job_id] = job

    def _make_job(self, index: int, spec: JobSpec, perf: JobPerf) -> SimJob:
        cfg = self.config
        if spec.num_gpus < 1 or spec.num_gpus > self.cluster.total_gpus:
            raise WorkloadError(
                f"job {spec.job_id} asks for {spec.num_gpus} GPUs; the cluster has {self.cluster.total_gpus}"
            )
        if spec.num_gpus > perf.max_gpus:
            raise WorkloadError(
                f"job {spec.job_id}: its model covers at most {perf.max_gpus} GPUs, it asks {spec.num_gpus}"
            )
        # The limit a user would ask for: the runtime on a dedicated, packed allocation.
        packed = tuple([cfg.gpus_per_node] * (spec.num_gpus // cfg.gpus_per_node))
        if spec.num_gpus % cfg.gpus_per_node:
            packed += (spec.num_gpus % cfg.gpus_per_node,)
        try:
            epoch, _, finish = _walk(perf, packed, (0, 0.0), 0.0, math.inf)
        except PerfModelError as exc:
            raise WorkloadError(f"job {spec.job_id}: {exc}") from exc
        if epoch < perf.num_epochs:  # pragma: no cover - _walk always finishes with an infinite horizon
            raise SimulationError(f"job {spec.job_id} never finishes")
        limit = spec.time_limit if spec.time_limit is not None else (cfg.start_delay + finish) * cfg.walltime_factor
        max_nodes = min(spec.max_nodes or cfg.max_nodes or cfg.num_nodes, cfg.num_nodes)
        min_nodes = min(spec.min_nodes or cfg.min_nodes, max_nodes)
        return SimJob(
            index=index,
            spec=spec,
            perf=perf,
            time_limit=limit,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            pending_view=PendingJob(index, spec.num_gpus, limit),
        )

    # ----------------------------------------------------------------- events

    def _push(self, time: float, kind: _Event, job: int = -1, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time, int(kind), self._seq, job, version))

    def run(self) -> SimResult:
        if self._seq:
            raise SimulationError("a Simulation runs once")
        for job in self._jobs:
            self._push(job.spec.submit_time, _Event.ARRIVE, job.index)
        while self._heap:
            time, kind, _, index, version = heapq.heappop(self._heap)
            self.now = time
            if kind == _Event.COMPLETE:
                job = self._jobs[index]
                if job.state == "RUNNING" and job.version == version:
                    self._complete(job)
            elif kind == _Event.ARRIVE:
                job = self._jobs[index]
                job.state = "PENDING"
                self._pending.append(job)  # arrivals come in priority order
                self._pending_views.append(job.pending_view)
                self._queue.append((time, len(self._pending)))
                self._dirty = True
            elif time == self._next_cycle:  # otherwise superseded by an earlier cycle
                self._next_cycle = None
                self._cycle()
            self._sample_stranded()
            self._arm_cycle()
        return self._result()

    def _sample_stranded(self) -> None:
        """Record the fragmentation figure when it changed. A waiting job of ``g`` GPUs could use a partly used
        node with at least its smallest per-node piece free: ``g`` when it fits one node, else its remainder
        after whole nodes (``g % G``, or ``G`` when it divides evenly)."""
        g = self.cluster.gpus_per_node
        need = min((j.spec.num_gpus % g or g for j in self._pending), default=None)
        partial, stranded = stranded_free(self.cluster.free, g, need)
        last = self._stranded[-1] if self._stranded else None
        if last is None or last[1:] != (partial, stranded):
            if last is not None and last[0] == self.now:
                self._stranded[-1] = (self.now, partial, stranded)
            else:
                self._stranded.append((self.now, partial, stranded))

    def _arm_cycle(self) -> None:
        """Make sure a cycle is queued for the earliest time one could change something.

        A cycle armed for later (e.g. at a running job's expected end) is superseded when an event makes an
        earlier one necessary; the superseded event is dropped when it comes up.
        """
        when = self._cycle_needed_at()
        if when is None:
            return
        # Cycles fall on k * interval, k >= 1: like the artifact, the first one is one interval after t=0.
        when = max(when, self.now, self.config.interval)
        at = _cycle_at_or_after(when, self.config.interval)
        if self._last_cycle is not None and at <= self._last_cycle:
            at = self._last_cycle + self.config.interval
        if self._next_cycle is not None and self._next_cycle <= at:
            return
        self._next_cycle = at
        self._push(at, _Event.CYCLE)

    def _cycle_needed_at(self) -> float | None:
        """Earliest time a cycle could change something, or None if none can until the next event."""
        if self.policy is not None:
            return self.now if (self._pending or self._running) else None
        if not self._pending:
            return None
        if self._dirty:
            return self.now
        if self.config.scheduler == "backfill" and self._running:
            # Backfill trusts expected ends; once one passes, the reservation moves and more may fit.
            if self._earliest_end is None:
                self._earliest_end = min(job.run_start + job.time_limit for job in self._running.values())
            return self._earliest_end
        return None

    # ----------------------------------------------------------------- job lifecycle

    def _start(self, job: SimJob, alloc: Allocation) -> None:
        self.cluster.take(alloc)
        job.state = "RUNNING"
        if job.first_start is None:
            job.first_start = self.now
        job.run_start = self.now
        job.set_alloc(alloc)
        self._earliest_end = None
        job.seg_time = self.now
        job.seg_ready = self.now + self.config.start_delay + self.cluster.boot_s  # a powered-down node boots first
        job.gpus_seen.append(job.gpus)
        job.nodes_seen.append(len(alloc))
        self._running[job.index] = job
        self._schedule_completion(job)

    def _schedule_completion(self, job: SimJob) -> None:
        job.version += 1
        epoch, _, finish = _walk(job.perf, job.shape, (job.seg_epoch, job.seg_progress), job.seg_ready, math.inf)
        if epoch < job.perf.num_epochs:  # pragma: no cover - infinite horizon always finishes
            raise SimulationError(f"job {job.spec.job_id} never finishes")
        self._push(max(finish, self.now), _Event.COMPLETE, job.index, job.version)

    def _position(self, job: SimJob, at: float) -> tuple[int, float]:
        if at <= job.seg_ready:
            return job.seg_epoch, job.seg_progress
        epoch, progress, _ = _walk(job.perf, job.shape, (job.seg_epoch, job.seg_progress), job.seg_ready, at)
        return epoch, progress

    def _close_segment(self, job: SimJob) -> None:
        """Record the usage of the segment that ends now."""
        gpus = job.gpus
        ready = min(max(job.seg_ready, job.seg_time), self.now)
        if ready > job.seg_time:
            self._usage.append(UsageInterval(job.index, job.seg_time, ready, gpus, 0.0))
        if self.now > ready:
            busy = gpus * job.perf.utilization(job.shape, min(job.seg_epoch, job.perf.num_epochs - 1))
            self._usage.append(UsageInterval(job.index, ready, self.now, gpus, busy))

    def _complete(self, job: SimJob) -> None:
        self._close_segment(job)
        self.cluster.give_back(job.alloc)
        job.state = "DONE"
        job.end = self.now
        del self._running[job.index]
        self._earliest_end = None
        self._dirty = True
        self._done += 1
        if self.on_progress is not None:
            self.on_progress(self._done, len(self._jobs))

    # ----------------------------------------------------------------- scheduling cycle

    def _cycle(self) -> None:
        self._last_cycle = self.now
        grows: list[ResizeRequest] = []
        if self.policy is not None:
            requests = list(self.policy(self._snapshot(), self.now))
            grows = self._apply_shrinks(requests)
        self._admit()
        if grows:
            self._apply_grows(grows)
        self._dirty = False

    def _admit(self) -> None:
        if not self._pending:
            return
        running = [j.running_view for j in self._running.values() if j.running_view is not None]
        chosen = plan(self.config.scheduler, self._pending_views, running, self.cluster.free_total, self.now)
        for index in chosen:
            job = self._jobs[index]
            self._start(job, self.cluster.place(job.spec.num_gpus, self.config.placement))
        started = set(chosen)
        if self._molding:
            started |= self._mold()
        if not started:
            return
        self._pending = [j for j in self._pending if j.index not in started]
        self._pending_views = [j.pending_view for j in self._pending]
        self._queue.append((self.now, len(self._pending)))

    def _wait_estimate(self) -> Callable[[MoldCandidate], float | None]:
        """mold_only_if_faster: seconds until a candidate's GPUs are free, from the running jobs' expected ends
        (start + time limit, what Slurm's backfill plans with), as of now; None when they never are."""
        ends = sorted((job.run_start + job.time_limit, job.gpus) for job in self._running.values())
        free, now = self.cluster.free_total, self.now

        def wait(c: MoldCandidate) -> float | None:
            have = free
            for end, gpus in ends:
                if have >= c.request_gpus:
                    break
                have += gpus
                if have >= c.request_gpus:
                    return max(0.0, end - now)
            return 0.0 if have >= c.request_gpus else None

        return wait

    def _mold(self) -> set[int]:
        """Moldable start: after the base scheduler, start waiting jobs (in priority order) that fit on fewer
        whole nodes than they asked for, at least their min, on the most whole nodes that are free. The rule is
        the controller's (policy/moldable.py: plan_molds); the pool is the free GPUs in whole nodes."""
        g = self.cluster.gpus_per_node
        waiting = {job.index: job for job in self._pending if job.index not in self._running}
        candidates = [MoldCandidate(index, job.spec.job_id, "", -(-job.spec.num_gpus // g), job.spec.num_gpus // g,
                                    job.min_nodes, job.spec.num_gpus, g,
                                    time_limit_s=job.time_limit if self._mold_if_faster else None)
                      for index, job in waiting.items()]
        started: set[int] = set()
        wait = self._wait_estimate() if self._mold_if_faster else None
        for mold in plan_molds(candidates, CountedFree(lambda: self.cluster.free_total // g), wait):
            job = waiting[mold.candidate.job_id]
            job.time_limit *= mold.time_limit_factor
            job.molded = True
            self._start(job, self.cluster.place(mold.nodes * g, self.config.placement))
            started.add(job.index)
        return started

    # ----------------------------------------------------------------- result

    def _result(self) -> SimResult:
        records: list[JobRecord] = []
        unfinished: list[str] = []
        for job in self._jobs:
            if job.state != "DONE" or job.first_start is None or job.end is None:
                unfinished.append(job.spec.job_id)
                continue
            records.append(
                JobRecord(
                    job_id=job.spec.job_id,
                    submit_time=job.spec.submit_time,
                    requested_gpus=job.spec.num_gpus,
                    start_time=job.first_start,
                    end_time=job.end,
                    resizes=job.resizes,
                    min_nodes=job.min_nodes,
                    max_nodes=job.max_nodes,
                    max_gpus=job.perf.max_gpus,
                    gpus_seen=tuple(job.gpus_seen),
                    nodes_seen=tuple(job.nodes_seen),
                    molded=job.molded,
                )
            )
        return SimResult(
            config=self.config,
            jobs=tuple(records),
            usage=tuple(self._usage),
            queue_length=tuple(self._queue),
            stranded=tuple(self._stranded),
            resizes=tuple(self._outcomes),
            unfinished=tuple(unfinished),
            # the last job's end: the engine's clock may run on past it (a cycle armed before the queue emptied)
            power=self.cluster.power_report(max((r.end_time for r in records), default=self.now)),
        )
