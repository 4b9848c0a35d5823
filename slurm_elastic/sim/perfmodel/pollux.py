"""Progress of a Pollux-trace job: measured step times plus the artifact's statistical-efficiency model.

Per application (numbers from the Pollux artifact):

* ``init_batch`` is the smallest validated global batch, ``max_batch`` the largest; the per-GPU batch range is
  the measured one (yolov3 capped at 8).
* Epoch ``e`` ends at the ``progress`` of row ``e`` of ``validation-<bsz>.csv``, minimum over batch sizes; the
  job is done after ``max_epochs`` epochs.
* A job at global batch ``B`` on ``r`` GPUs runs ``atomic`` samples per GPU per micro-step and ``accum``
  extra accumulation micro-steps (the artifact's rule, reproduced in :meth:`PolluxApplication.local_config`).
  One optimizer step takes ``step + accum * (step - sync)`` seconds, where ``step, sync`` are the measured
  times for the placement at ``atomic`` (see :mod:`.throughput`).
* One step makes ``gain = (var + sqr) / (var / scale + sqr)`` units of progress, ``scale = B' / init_batch``,
  ``B' = r * atomic * (accum + 1)``, with ``sqr``/``var`` the epoch's gradient statistics interpolated
  linearly between the two nearest validated batch sizes.
* The agent's GPU utilization is the computing share of a step: ``(accum + 1) * (step - sync)`` over the step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from slurm_elastic.sim.errors import PerfModelError
from slurm_elastic.sim.perfmodel.appdata import AppMeasurements, ValidationRow
from slurm_elastic.sim.perfmodel.base import Shape
from slurm_elastic.sim.perfmodel.throughput import StepTimeTable, canonical_placement

# Epochs until done, per application (the artifact's targets).
APP_EPOCHS: Mapping[str, int] = {
    "bert": 2,
    "cifar10": 100,
    "deepspeech2": 80,
    "imagenet": 90,
    "ncf": 10,
    "yolov3": 50,
}
# Per-GPU batch limits that differ from the measured range.
_MAX_LOCAL_BSZ: Mapping[str, int] = {"yolov3": 8}
# The largest job the measurements cover (16 nodes x 4 GPUs in scalability.csv).
MAX_MEASURED_GPUS = 64
_EPS = 1e-8


class PolluxApplication:
    """One application's measurements and the artifact's derived constants."""

    def __init__(self, measurements: AppMeasurements, max_epochs: int | None = None) -> None:
        self.name = measurements.name
        self.measurements = measurements
        self.table = StepTimeTable(measurements)
        self.validation: Mapping[int, tuple[ValidationRow, ...]] = measurements.validation
        self._sizes = sorted(self.validation)
        self.init_batch_size = self._sizes[0]
        self.max_batch_size = self._sizes[-1]
        local = [p.local_bsz for p in measurements.placements]
        self.min_local_bsz = min(local)
        self.max_local_bsz = _MAX_LOCAL_BSZ.get(self.name, max(local))
        epochs = max_epochs if max_epochs is not None else APP_EPOCHS.get(self.name)
        if epochs is None:
            epochs = min(len(rows) for rows in self.validation.values())
        short = [b for b, rows in self.validation.items() if len(rows) < epochs]
        if epochs < 1 or short:
            raise PerfModelError(f"{self.name}: validation files for batch {short} have fewer than {epochs} epochs")
        self.max_epochs = epochs
        self._epoch_end = tuple(min(rows[e].progress for rows in self.validation.values()) for e in range(epochs))

    def epoch_end(self, epoch: int) -> float:
        return self._epoch_end[epoch]

    def local_config(self, num_replicas: int, batch_size: int) -> tuple[int, int]:
        """(atomic per-GPU batch, extra accumulation steps) at a fixed global batch, the artifact's way."""
        local_bsz = math.ceil(batch_size / num_replicas - _EPS)
        accum = math.ceil(local_bsz / self.max_local_bsz - _EPS) - 1
        if num_replicas == 1 and batch_size > self.init_batch_size:
            accum = max(1, accum)  # the artifact always accumulates on a single GPU above the initial batch
        atomic = math.ceil(local_bsz / (accum + 1) - _EPS)
        count = num_replicas * (accum + 1)
        atomic = min(atomic, int(self.max_batch_size / count))
        return atomic, accum

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during ``epoch`` at a global batch, interpolated between validated sizes."""
        lower = upper = None
        for size in self._sizes:
            if size <= batch_size:
                lower = size
            if size >= batch_size:
                upper = size
                break
        if lower is None or upper is None:
            raise PerfModelError(
                f"{self.name}: global batch {batch_size:g} outside the validated {self._sizes[0]}..{self._sizes[-1]}"
            )
        lo, hi = self.validation[lower][epoch], self.validation[upper][epoch]
        if lower == upper:
            return lo.grad_sqr, lo.grad_var
        w = (batch_size - lower) / (upper - lower)
        return lo.grad_sqr + w * (hi.grad_sqr - lo.grad_sqr), lo.grad_var + w * (hi.grad_var - lo.grad_var)


class PolluxJobPerf:
    """:class:`~.base.JobPerf` of one job: an application at a fixed global batch."""

    def __init__(self, app: PolluxApplication, batch_size: int) -> None:
        self.app = app
        self.batch_size = batch_size
        self._rates: dict[tuple[Shape, int], float] = {}
        self._steps: dict[Shape, tuple[float, float, float]] = {}
        self._max_gpus = self._largest_valid_size()

    @property
    def num_epochs(self) -> int:
        return self.app.max_epochs

    @property
    def max_gpus(self) -> int:
        return self._max_gpus

    def epoch_end(self, epoch: int) -> float:
        return self.app.epoch_end(epoch)

    def step_breakdown(self, shape: Shape) -> tuple[float, float, float]:
        """(optimizer step seconds, computing seconds in it, effective global batch) on ``shape``."""
        key = canonical_placement(shape)
        cached = self._steps.get(key)
        if cached is None:
            replicas = sum(key)
            atomic, accum = self.app.local_config(replicas, self.batch_size)
            step, sync = self.app.table.lookup(key, atomic)
            compute = step - sync
            total = step + compute * accum
            cached = (total, compute * (accum + 1), float(replicas * atomic * (accum + 1)))
            if total <= 0:
                raise PerfModelError(f"{self.app.name}: non-positive step time on {key}")
            self._steps[key] = cached
        return cached

    def rate(self, shape: Shape, epoch: int) -> float:
        key = (canonical_placement(shape), epoch)
        cached = self._rates.get(key)
        if cached is None:
            total, _, batch = self.step_breakdown(key[0])
            grad_sqr, grad_var = self.app.grad_stats(batch, epoch)
            scale = batch / self.app.init_batch_size
            gain = (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)
            cached = gain / total
            self._rates[key] = cached
        return cached

    def utilization(self, shape: Shape, epoch: int = 0) -> float:
        total, compute, _ = self.step_breakdown(shape)
        return min(1.0, max(0.0, compute / total))

    def throughput(self, shape: Shape, epoch: int = 0) -> float:
        """Samples per second: the effective global batch over the optimizer step time (no statistical
        efficiency: that is what a training loop can count)."""
        total, _, batch = self.step_breakdown(shape)
        return batch / total

    def _largest_valid_size(self) -> int:
        """Largest GPU count whose per-GPU batch stays in the measured range (and within 64 GPUs)."""
        best = 0
        for replicas in range(1, MAX_MEASURED_GPUS + 1):
            atomic, accum = self.app.local_config(replicas, self.batch_size)
            batch = replicas * atomic * (accum + 1)
            if atomic < self.app.min_local_bsz or not self.app.init_batch_size <= batch <= self.app.max_batch_size:
                break
            best = replicas
        return best
