"""A job as the engine tracks it (sim/engine.py) and its elastic hook resizes it (sim/resizing.py): its spec and
performance model, where it stands in the queue, what it holds, and its progress at the start of the current
segment (constant shape)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from slurm_elastic.sim.cluster import Allocation, shape_of
from slurm_elastic.sim.perfmodel.base import JobPerf, Shape
from slurm_elastic.sim.scheduler import PendingJob, RunningJob
from slurm_elastic.sim.workload import JobSpec


@dataclass
class SimJob:
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
        self.shape = shape_of(alloc)
        self.gpus = sum(self.shape)
        self.running_view = RunningJob(self.index, self.gpus, self.run_start + self.time_limit) if alloc else None
