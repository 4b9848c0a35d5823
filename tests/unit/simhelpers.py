"""Builders shared by the simulator tests (not a test module)."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_elastic.sim.perfmodel.base import Shape
from slurm_elastic.sim.workload import JobSpec


@dataclass
class LinearPerf:
    """Runs ``runtime`` seconds on ``gpus`` GPUs, scales linearly with GPUs, 50% GPU utilization."""

    runtime: float
    gpus: int
    limit: int = 64

    @property
    def num_epochs(self) -> int:
        return 1

    @property
    def max_gpus(self) -> int:
        return self.limit

    def epoch_end(self, epoch: int) -> float:
        return 1.0

    def rate(self, shape: Shape, epoch: int) -> float:
        return sum(shape) / self.gpus / self.runtime

    def utilization(self, shape: Shape, epoch: int = 0) -> float:
        return 0.5

    def throughput(self, shape: Shape, epoch: int = 0) -> float:
        return self.rate(shape, 0)


def job(job_id: str, submit: float, gpus: int) -> JobSpec:
    return JobSpec(job_id=job_id, submit_time=submit, num_gpus=gpus, duration=1.0)
