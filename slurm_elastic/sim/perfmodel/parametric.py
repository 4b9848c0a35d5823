"""Speedup model for traces without an application (Philly, ITP, sacct).

Such a trace says only how long a job ran on how many GPUs. To replay it at another size (an elastic resize,
or a placement over more nodes) we need a speedup curve; we use the shape of the Pollux throughput model
(OSDI'21, section 4.1) with its terms in their simplest, linear form. At a fixed global batch, one step on
``r`` GPUs over ``k`` nodes takes, in units of the single-GPU step:

    compute(r)   = c0 + c1 / r                 # per-step overhead + the batch's work split over r GPUs
    sync(r, k)   = 0                           if r == 1
                 = a_r + b_r * (r - 2)         if k == 1   (intra-node all-reduce)
                 = a_n + b_n * (r - 2)         if k >= 2   (inter-node all-reduce)
    step(r, k)   = compute(r) + sync(r, k)
    utilization  = compute(r) / step(r, k)     # what the agent would report

The six parameters are fitted (non-negative least squares, :mod:`.fit`) to each measured application at each
global batch the Pollux workloads use, and stored in :mod:`.speedup_table`. Each trace job draws one fitted
set (an application uniformly, then one of its batch sizes uniformly) from a seeded RNG, and its total work is
set so that it runs exactly its trace duration on its trace size packed onto whole nodes:

    rate(shape) = step(r0, k0) / (duration * step(r, k))    [fraction of the job per second]
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_elastic.sim.errors import PerfModelError
from slurm_elastic.sim.perfmodel.base import Shape

# A parametric job can use any size the cluster has; the engine bounds it by the cluster.
_UNBOUNDED_GPUS = 1 << 30


@dataclass(frozen=True)
class SpeedupParams:
    source: str  # "<application>@<global batch>" the parameters were fitted to
    c0: float
    c1: float
    a_r: float
    b_r: float
    a_n: float
    b_n: float

    def compute_time(self, gpus: int) -> float:
        return self.c0 + self.c1 / gpus

    def sync_time(self, gpus: int, nodes: int) -> float:
        if gpus <= 1:
            return 0.0
        if nodes <= 1:
            return self.a_r + self.b_r * (gpus - 2)
        return self.a_n + self.b_n * (gpus - 2)

    def step_time(self, gpus: int, nodes: int) -> float:
        return self.compute_time(gpus) + self.sync_time(gpus, nodes)


def draw_params(table: Sequence[SpeedupParams], rng: random.Random) -> SpeedupParams:
    """One parameter set: an application uniformly, then one of its fitted batch sizes uniformly."""
    if not table:
        raise PerfModelError("empty speedup parameter table")
    by_app: dict[str, list[SpeedupParams]] = {}
    for params in table:
        by_app.setdefault(params.source.split("@", 1)[0], []).append(params)
    app = rng.choice(sorted(by_app))
    return rng.choice(by_app[app])


class ParametricJobPerf:
    """:class:`~slurm_elastic.sim.perfmodel.base.JobPerf` for a job known only by (duration, GPUs)."""

    def __init__(self, params: SpeedupParams, duration: float, ref_gpus: int, gpus_per_node: int) -> None:
        if duration <= 0 or ref_gpus < 1 or gpus_per_node < 1:
            raise PerfModelError(f"need duration > 0 and >= 1 GPU, not {duration} s on {ref_gpus} GPUs")
        self.params = params
        self.duration = duration
        ref_nodes = -(-ref_gpus // gpus_per_node)
        self._ref_step = params.step_time(ref_gpus, ref_nodes)
        if not self._ref_step > 0:
            raise PerfModelError(f"{params.source}: non-positive step time at {ref_gpus} GPUs")

    @property
    def num_epochs(self) -> int:
        return 1

    @property
    def max_gpus(self) -> int:
        return _UNBOUNDED_GPUS

    def epoch_end(self, epoch: int) -> float:
        return 1.0

    def rate(self, shape: Shape, epoch: int) -> float:
        gpus, nodes = sum(shape), sum(1 for g in shape if g)
        if gpus < 1:
            raise PerfModelError("empty shape")
        return self._ref_step / (self.duration * self.params.step_time(gpus, nodes))

    def utilization(self, shape: Shape, epoch: int = 0) -> float:
        gpus, nodes = sum(shape), sum(1 for g in shape if g)
        step = self.params.step_time(gpus, nodes)
        return min(1.0, max(0.0, self.params.compute_time(gpus) / step)) if step > 0 else 0.0

    def throughput(self, shape: Shape, epoch: int = 0) -> float:
        """Steps per single-GPU step time at the fixed global batch (relative samples/s)."""
        gpus, nodes = sum(shape), sum(1 for g in shape if g)
        if gpus < 1:
            raise PerfModelError("empty shape")
        return 1.0 / self.params.step_time(gpus, nodes)
