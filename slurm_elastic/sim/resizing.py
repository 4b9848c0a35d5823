"""The engine's elastic hook: the cluster state a policy sees, and applying its resize requests.

A mixin of :class:`~slurm_elastic.sim.engine.Simulation` (the rules are in :mod:`slurm_elastic.sim.elastic`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from slurm_elastic.sim.cluster import Allocation, Cluster, shape_of
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.elastic import (
    JobView,
    NodeView,
    ResizeOutcome,
    ResizeRequest,
    SimClusterState,
)
from slurm_elastic.sim.errors import PerfModelError
from slurm_elastic.sim.perfmodel.adaptive import AdaptiveBatchJobPerf
from slurm_elastic.sim.simjob import SimJob


class ElasticHook:
    """Builds the policy's view and applies resizes; the engine owns the state named below."""

    config: SimConfig
    cluster: Cluster
    now: float
    _running: dict[int, SimJob]
    _pending: list[SimJob]
    _by_id: dict[str, SimJob]
    _outcomes: list[ResizeOutcome]
    _earliest_end: float | None

    if TYPE_CHECKING:
        def _position(self, job: SimJob, at: float) -> tuple[int, float]: ...
        def _close_segment(self, job: SimJob) -> None: ...
        def _schedule_completion(self, job: SimJob) -> None: ...

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
                    gpus_per_node=tuple(g for _, g in job.alloc),
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

    def _reject(self, req: ResizeRequest, job: SimJob | None, code: str, message: str) -> None:
        current = len(job.alloc) if job is not None else 0
        self._outcomes.append(ResizeOutcome(self.now, req.job_id, current, req.target_nodes, "rejected", code, message))

    def _validate(self, req: ResizeRequest, seen: set[str]) -> SimJob | None:
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
            if req.gpus:  # GPU-granular: one more entry of req.gpus GPUs on a partly used node
                node = self.cluster.partial_node(req.gpus, req.node, {n for n, _ in job.alloc}) if wanted == 1 else None
                if node is None:
                    self._reject(req, job, "no_free_gpus", f"no node has {req.gpus} free GPUs for +1 entry")
                    continue
                self._resize(req, job, job.alloc + ((node, req.gpus),))
                continue
            free_nodes = self.cluster.whole_free_nodes()
            if len(free_nodes) < wanted:
                self._reject(req, job, "no_free_nodes", f"needs {wanted} whole free nodes, {len(free_nodes)} free")
                continue
            extra = tuple((node, self.cluster.gpus_per_node) for node in free_nodes[:wanted])
            self._resize(req, job, job.alloc + extra)

    def _resize(self, req: ResizeRequest, job: SimJob, new_alloc: Allocation) -> None:
        new_shape = shape_of(new_alloc)
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
