"""A Pollux-trace job that co-adapts its batch size to its allocation (it opted in to adaptive batch size).

At every shape and epoch the job runs the plan :func:`slurm_elastic.batchsize.choose_plan` picks (the model the
policy and the job library share), with

* the step time of the traces' measurements: ``step + accum * (step - sync)`` at the plan's per-GPU batch, as
  :class:`~.pollux.PolluxJobPerf` computes it for a fixed batch;
* the gradient statistics the job would have measured: the epoch's ``grad_sqr``/``grad_var`` at the job's
  submitted batch size (interpolated between validated sizes), normalised to the application's initial batch;
* the limits of the artifact: global batch within the validated sizes, per-GPU batch within the measured range.

Progress then follows the traces' truth at the chosen batch (the statistics interpolated at *that* batch), so a
wrong choice costs what it would cost the real job. ``throughput`` reports goodput (samples/s x the chosen plan's
statistical efficiency): what an opted-in job publishes, so the policy ranks its grows and shrinks by goodput.
"""

from __future__ import annotations

from slurm_elastic.batchsize import (
    AdaptiveState,
    BatchLimits,
    BatchPlan,
    GradStats,
    LinearStepModel,
    choose_plan,
    local_batch_candidates,
)
from slurm_elastic.sim.errors import PerfModelError
from slurm_elastic.sim.perfmodel.base import Shape
from slurm_elastic.sim.perfmodel.pollux import MAX_MEASURED_GPUS, PolluxApplication
from slurm_elastic.sim.perfmodel.throughput import canonical_placement


class AdaptiveBatchJobPerf:
    """:class:`~.base.JobPerf` of an opted-in job: the batch plan is chosen per shape and epoch."""

    def __init__(self, app: PolluxApplication, batch_size: int) -> None:
        self.app = app
        self.batch_size = batch_size
        self.limits = BatchLimits(
            init_batch=app.init_batch_size,
            max_batch=app.max_batch_size,
            max_local_batch=app.max_local_bsz,
            min_local_batch=app.min_local_bsz,
        )
        self._candidates = local_batch_candidates(self.limits)
        self._plans: dict[tuple[Shape, int], BatchPlan] = {}
        self._rates: dict[tuple[Shape, int], float] = {}
        self._max_gpus = self._largest_valid_size()

    @property
    def num_epochs(self) -> int:
        return self.app.max_epochs

    @property
    def max_gpus(self) -> int:
        return self._max_gpus

    def epoch_end(self, epoch: int) -> float:
        return self.app.epoch_end(epoch)

    def stats(self, epoch: int) -> GradStats:
        """What the job measures during ``epoch`` (at its submitted batch)."""
        sqr, var = self.app.grad_stats(self.batch_size, epoch)
        return GradStats(grad_sqr=max(sqr, 1e-12), grad_var=max(var, 0.0), init_batch=self.app.init_batch_size)

    def plan(self, shape: Shape, epoch: int) -> BatchPlan:
        key = (canonical_placement(shape), epoch)
        cached = self._plans.get(key)
        if cached is None:
            placement = key[0]

            def step_time(replicas: int, local: int, accum: int) -> float | None:
                try:
                    step, sync = self.app.table.lookup(placement, local)
                except PerfModelError:
                    return None
                return step + accum * (step - sync)

            cached = choose_plan(sum(placement), self.stats(epoch), self.limits, step_time,
                                 candidates=self._candidates)
            if cached is None:
                raise PerfModelError(f"{self.app.name}: no batch plan fits {sum(placement)} GPUs on {placement}")
            self._plans[key] = cached
        return cached

    def rate(self, shape: Shape, epoch: int) -> float:
        key = (canonical_placement(shape), epoch)
        cached = self._rates.get(key)
        if cached is None:
            plan = self.plan(shape, epoch)
            grad_sqr, grad_var = self.app.grad_stats(plan.global_batch, epoch)
            scale = plan.global_batch / self.app.init_batch_size
            gain = (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)
            cached = gain / plan.step_s
            self._rates[key] = cached
        return cached

    def utilization(self, shape: Shape, epoch: int = 0) -> float:
        plan = self.plan(shape, epoch)
        step, sync = self.app.table.lookup(canonical_placement(shape), plan.local_batch)
        return min(1.0, max(0.0, (step - sync) * (plan.accum_steps + 1) / plan.step_s))

    def throughput(self, shape: Shape, epoch: int = 0) -> float:
        """Goodput: samples/s at the plan times its statistical efficiency (what an opted-in job publishes)."""
        return self.plan(shape, epoch).goodput

    def adaptive_state(self, shape: Shape, epoch: int) -> AdaptiveState:
        """What the job has published, as the policy reads it: its limits, the epoch's statistics and the
        linear step model fitted to the step it runs now (compute per sample, all-reduce per node)."""
        placement = canonical_placement(shape)
        plan = self.plan(shape, epoch)
        step, sync = self.app.table.lookup(placement, plan.local_batch)
        nodes = len(placement)
        gpus_per_node = max(placement) if placement else 1
        model = LinearStepModel((step - sync) / plan.local_batch, sync / nodes if nodes > 1 else 0.0, gpus_per_node)
        return AdaptiveState(self.limits, "sqrt", self.stats(epoch), model)

    def _largest_valid_size(self) -> int:
        """Largest GPU count with a plan on a packed 1-GPU-per-node-agnostic count (within 64 GPUs)."""
        best = 0
        for replicas in range(1, MAX_MEASURED_GPUS + 1):
            if replicas * self.limits.min_local_batch > self.limits.max_batch:
                break
            best = replicas
        return best
