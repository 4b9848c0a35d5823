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
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Literal

from slurm_elastic.policy.fragmentation import stranded_free
from slurm_elastic.policy.moldable import CountedFree, MoldCandidate, plan_molds
from slurm_elastic.sim.cluster import Allocation, Cluster
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.elastic import (
    ElasticPolicy,
    JobView,
    NodeView,
    ResizeOutcome,
    ResizeRequest,
    SimClusterState,
)
from slurm_elastic.sim.errors import PerfModelError, SimulationError, WorkloadError
from slurm_elastic.sim.perfmodel.adaptive import AdaptiveBatchJobPerf
from slurm_elastic.sim.perfmodel.base import JobPerf, Shape
from slurm_elastic.sim.power import PowerReport
from slurm_elastic.sim.scheduler import PendingJob, RunningJob, plan
from slurm_elastic.sim.workload import JobSpec


class _Event(IntEnum):  # value = order among events at the same instant
    COMPLETE = 0
    ARRIVE = 1
    CYCLE = 2


@dataclass(frozen=True)
class UsageInterval:
    """A job held ``gpus`` GPUs over [start, end); ``busy_gpus`` of them computed.

    ``busy_gpus`` = gpus x the model's utilization, or 0 while the job (re)starts.
    """

    job: int
    start: float
    end: float
    gpus: int
    busy_gpus: float


@dataclass(frozen=True)
class JobRecord:
    """What happened to one job."""

    job_id: str
    submit_time: float
    requested_gpus: int
    start_time: float
    end_time: float
    resizes: int
    min_nodes: int
    max_nodes: int
    max_gpus: int  # the model's limit
    gpus_seen: tuple[int, ...]  # every GPU count the job ran at, in order
    nodes_seen: tuple[int, ...]  # node counts after each resize (first entry: at start)
    molded: bool = False  # started on fewer whole nodes than it asked for (SimConfig.moldable_start)

    @property
    def jct(self) -> float:
        return self.end_time - self.submit_time

    @property
    def wait(self) -> float:
        return self.start_time - self.submit_time


@dataclass(frozen=True)
class SimResult:
    config: SimConfig
    jobs: tuple[JobRecord, ...]
    usage: tuple[UsageInterval, ...]
    queue_length: tuple[tuple[float, int], ...]  # (time, pending jobs) at each change
    resizes: tuple[ResizeOutcome, ...]
    unfinished: tuple[str, ...]  # job ids that never completed (must be empty)
    power: PowerReport | None = None  # powered node-seconds and resumes, with SimConfig.power
    #: (time, free GPUs on partly used nodes, those no waiting job could use) at each change (policy/fragmentation)
    stranded: tuple[tuple[float, int, int], ...] = ()


@dataclass
class _Job:
    index: int
    spec: JobSpec
    perf: JobPerf
    time_limit: float
    min_nodes: int
    max_nodes: int
    pending_view: PendingJob
    state: Literal["FUTURE", "PENDING", "RUNNING", "DONE"] = "FUTURE"
    alloc: Allocation = ()
    shape: Shape = ()
    gpus: int = 0
    running_view: RunningJob | None = None
    first_start: float | None = None
    run_start: float = 0.0
    end: float | None = None
    # Progress at the start of the current segment (constant shape), and when progress resumes after a delay.
    seg_time: float = 0.0
    seg_progress: float = 0.0
    seg_epoch: int = 0
    seg_ready: float = 0.0
    version: int = 0
    resizes: int = 0
    last_resize: float | None = None
    gpus_seen: list[int] = field(default_factory=list)
    nodes_seen: list[int] = field(default_factory=list)
    molded: bool = False

    def set_alloc(self, alloc: Allocation) -> None:
        self.alloc = alloc
        self.shape = tuple(g for _, g in alloc)
        self.gpus = sum(self.shape)
        self.running_view = RunningJob(self.index, self.gpus, self.run_start + self.time_limit) if alloc else None


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


class Simulation:
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
        self._jobs: list[_Job] = []
        self._by_id: dict[str, _Job] = {}
        self._pending: list[_Job] = []  # priority order
        self._pending_views: list[PendingJob] = []  # the same, as the scheduler sees them
        self._earliest_end: float | None = None  # min expected end of running jobs; None = recompute
        self._running: dict[int, _Job] = {}
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

    def _make_job(self, index: int, spec: JobSpec, perf: JobPerf) -> _Job:
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
        return _Job(
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

    def _start(self, job: _Job, alloc: Allocation) -> None:
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

    def _schedule_completion(self, job: _Job) -> None:
        job.version += 1
        epoch, _, finish = _walk(job.perf, job.shape, (job.seg_epoch, job.seg_progress), job.seg_ready, math.inf)
        if epoch < job.perf.num_epochs:  # pragma: no cover - infinite horizon always finishes
            raise SimulationError(f"job {job.spec.job_id} never finishes")
        self._push(max(finish, self.now), _Event.COMPLETE, job.index, job.version)

    def _position(self, job: _Job, at: float) -> tuple[int, float]:
        if at <= job.seg_ready:
            return job.seg_epoch, job.seg_progress
        epoch, progress, _ = _walk(job.perf, job.shape, (job.seg_epoch, job.seg_progress), job.seg_ready, at)
        return epoch, progress

    def _close_segment(self, job: _Job) -> None:
        """Record the usage of the segment that ends now."""
        gpus = job.gpus
        ready = min(max(job.seg_ready, job.seg_time), self.now)
        if ready > job.seg_time:
            self._usage.append(UsageInterval(job.index, job.seg_time, ready, gpus, 0.0))
        if self.now > ready:
            busy = gpus * job.perf.utilization(job.shape, min(job.seg_epoch, job.perf.num_epochs - 1))
            self._usage.append(UsageInterval(job.index, ready, self.now, gpus, busy))

    def _complete(self, job: _Job) -> None:
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

    # ----------------------------------------------------------------- elastic hook

    def _snapshot(self) -> SimClusterState:
        holders: list[list[str]] = [[] for _ in range(self.cluster.num_nodes)]
        views: list[JobView] = []
        for job in sorted(self._running.values(), key=lambda j: j.index):
            for node, _ in job.alloc:
                holders[node].append(job.spec.job_id)
            epoch, progress = self._position(job, self.now)
            total = job.perf.epoch_end(job.perf.num_epochs - 1)
            restarting = self.now < job.seg_ready
            now_epoch = min(epoch, job.perf.num_epochs - 1)
            views.append(
                JobView(
                    job_id=job.spec.job_id,
                    state="RUNNING",
                    submit_time=job.spec.submit_time,
                    start_time=job.first_start,
                    requested_gpus=job.spec.num_gpus,
                    num_nodes=len(job.alloc),
                    num_gpus=job.gpus,
                    nodes=tuple(n for n, _ in job.alloc),
                    gpus_per_node=job.shape,
                    min_nodes=job.min_nodes,
                    max_nodes=job.max_nodes,
                    gpu_util=0.0 if restarting else job.perf.utilization(job.shape, now_epoch),
                    throughput=0.0 if restarting else job.perf.throughput(job.shape, now_epoch),
                    adaptive=job.perf.adaptive_state(job.shape, now_epoch)
                    if isinstance(job.perf, AdaptiveBatchJobPerf) else None,
                    progress=min(1.0, progress / total) if total > 0 else 1.0,
                    resizes=job.resizes,
                    last_resize_time=job.last_resize,
                    restarting_until=job.seg_ready if restarting else None,
                    user=job.spec.user,
                    account=job.spec.account,
                    application=job.spec.application,
                    time_limit=job.time_limit,
                )
            )
        for job in self._pending:
            views.append(
                JobView(
                    job_id=job.spec.job_id,
                    state="PENDING",
                    submit_time=job.spec.submit_time,
                    start_time=None,
                    requested_gpus=job.spec.num_gpus,
                    num_nodes=0,
                    num_gpus=0,
                    nodes=(),
                    gpus_per_node=(),
                    min_nodes=job.min_nodes,
                    max_nodes=job.max_nodes,
                    gpu_util=0.0,
                    throughput=0.0,
                    progress=0.0,
                    resizes=0,
                    last_resize_time=None,
                    restarting_until=None,
                    user=job.spec.user,
                    account=job.spec.account,
                    application=job.spec.application,
                    time_limit=job.time_limit,
                )
            )
        g = self.cluster.gpus_per_node
        nodes = tuple(NodeView(i, g, self.cluster.free[i], tuple(holders[i]), self.cluster.power_state(i))
                      for i in range(self.cluster.num_nodes))
        return SimClusterState(
            now=self.now,
            gpus_per_node=g,
            total_gpus=self.cluster.total_gpus,
            free_gpus=self.cluster.free_total,
            nodes=nodes,
            jobs=tuple(views),
        )

    def _reject(self, req: ResizeRequest, job: _Job | None, code: str, message: str) -> None:
        current = len(job.alloc) if job is not None else 0
        self._outcomes.append(ResizeOutcome(self.now, req.job_id, current, req.target_nodes, "rejected", code, message))

    def _validate(self, req: ResizeRequest, seen: set[str]) -> _Job | None:
        job = self._by_id.get(req.job_id)
        if job is None:
            self._reject(req, None, "unknown_job", f"no job {req.job_id}")
            return None
        if req.job_id in seen:
            self._reject(req, job, "duplicate", "one resize per job per cycle")
            return None
        seen.add(req.job_id)
        if job.state != "RUNNING":
            self._reject(req, job, "not_running", f"job is {job.state.lower()}")
            return None
        if not job.min_nodes <= req.target_nodes <= job.max_nodes:
            self._reject(
                req,
                job,
                "out_of_bounds",
                f"target {req.target_nodes} nodes outside {job.min_nodes}..{job.max_nodes}",
            )
            return None
        return job

    def _apply_shrinks(self, requests: Sequence[ResizeRequest]) -> list[ResizeRequest]:
        """Apply every valid shrink now; return the grow requests for after admission."""
        seen: set[str] = set()
        grows: list[ResizeRequest] = []
        for req in requests:
            job = self._validate(req, seen)
            if job is None or req.target_nodes == len(job.alloc):
                continue
            if req.target_nodes > len(job.alloc):
                grows.append(req)
                continue
            self._resize(req, job, job.alloc[: req.target_nodes])
        return grows

    def _apply_grows(self, grows: Sequence[ResizeRequest]) -> None:
        for req in grows:
            job = self._by_id[req.job_id]
            if job.state != "RUNNING":
                self._reject(req, job, "not_running", f"job is {job.state.lower()}")
                continue
            wanted = req.target_nodes - len(job.alloc)
            free_nodes = self.cluster.whole_free_nodes()
            if len(free_nodes) < wanted:
                self._reject(req, job, "no_free_nodes", f"needs {wanted} whole free nodes, {len(free_nodes)} free")
                continue
            extra = tuple((node, self.cluster.gpus_per_node) for node in free_nodes[:wanted])
            self._resize(req, job, job.alloc + extra)

    def _resize(self, req: ResizeRequest, job: _Job, new_alloc: Allocation) -> None:
        new_shape = tuple(g for _, g in new_alloc)
        epoch, progress = self._position(job, self.now)
        if sum(new_shape) > job.perf.max_gpus:
            self._reject(req, job, "model_range", f"{sum(new_shape)} GPUs exceeds the model's {job.perf.max_gpus}")
            return
        try:
            job.perf.rate(new_shape, min(epoch, job.perf.num_epochs - 1))
        except PerfModelError as exc:
            self._reject(req, job, "model_range", str(exc))
            return
        old_nodes = len(job.alloc)
        self._close_segment(job)
        self.cluster.give_back(job.alloc)
        self.cluster.take(new_alloc)
        if req.time_limit_add_s:  # before set_alloc: the running view carries the expected end
            job.time_limit += req.time_limit_add_s
            self._earliest_end = None
        job.set_alloc(new_alloc)
        job.seg_time = self.now
        job.seg_epoch, job.seg_progress = epoch, progress
        job.seg_ready = self.now + self.config.resize_cost + self.cluster.boot_s
        job.resizes += 1
        job.last_resize = self.now
        job.gpus_seen.append(job.gpus)
        job.nodes_seen.append(len(new_alloc))
        self._outcomes.append(
            ResizeOutcome(self.now, job.spec.job_id, old_nodes, len(new_alloc), "applied", "applied", req.reason)
        )
        self._schedule_completion(job)

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
