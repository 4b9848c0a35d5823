"""Adaptive batch size: statistical efficiency from the gradient noise scale, and the goodput-best batch plan.

Pure and standard-library only (no clock, no I/O; importing it pulls in nothing else of the project): the
policy, the simulator and the job-side library (``slurm_elastic.goodput.batch_plan``) share it, so the batch a
job reads at a restart is the one the policy ranked it by. The model is AdaptDL's / Pollux's (OSDI'21,
section 3.1), derived here:

* A job tuned at global batch ``B0`` (``init_batch``) measures, over its recent steps, ``grad_sqr`` = |E g|^2
  and ``grad_var`` = the variance of one gradient *at batch B0* (AdaptDL's ``adaptdl/torch/gns.py`` estimates
  both from the per-replica and the all-reduced gradient norms). The gradient noise scale, in samples, is
  ``noise_scale = B0 * grad_var / grad_sqr``.
* One SGD step at batch ``M = S * B0`` makes as much progress as ``gain(M) = (var + sqr) / (var / S + sqr)``
  steps at ``B0`` (the variance of the mean gradient shrinks as 1/S; AdaScale's gain ratio). Per sample that is
  the **statistical efficiency** ``E(M) = gain / S = (noise_scale + B0) / (noise_scale + M)``: 1 at ``B0``,
  falling towards ``(noise_scale + B0) / M`` once ``M`` is well above the noise scale.
* **Goodput** at a plan = throughput (samples/s) x E(M): samples/s as if trained at ``B0``. The best plan for
  ``R`` replicas picks the per-replica (micro-)batch ``b`` and the accumulation steps ``a`` (``a`` extra
  micro-steps per optimizer step, ``M = R * b * (a + 1)``) that maximise it, with ``B0 <= M <= max_batch``
  (``M`` may fall below ``B0`` only when ``R * min_local_batch`` exceeds it: then no plan) and
  ``min_local_batch <= b <= max_local_batch`` (the per-GPU memory limit).
* Throughput needs the time of one optimizer step, a callable ``step_time(replicas, b, a)``: the simulator
  passes the Pollux traces' measured step and sync times; the job library and the policy pass
  :class:`LinearStepModel`, fitted to the compute and step times the job publishes.

Learning rate at batch ``M`` (:func:`lr_factor`): ``sqrt`` scales it by ``sqrt(M / B0)`` (AdaptDL's
``SqrtScale``); ``adascale`` by ``gain(M)`` (AdaptDL's ``AdaScale``: the lr grows with the progress one step
makes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class BatchModelError(ValueError):
    """Invalid statistics, limits or arguments (a caller's mistake, or a job's bad report)."""

# (replicas, per-replica batch, extra accumulation steps) -> seconds of one optimizer step; None: not possible.
StepTime = Callable[[int, int, int], "float | None"]

LR_RULES = ("sqrt", "adascale")


@dataclass(frozen=True)
class GradStats:
    """Gradient statistics at the job's initial batch ``init_batch`` (see the module doc)."""

    grad_sqr: float
    grad_var: float
    init_batch: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.grad_sqr) and self.grad_sqr > 0):
            raise BatchModelError(f"grad_sqr must be finite and > 0, not {self.grad_sqr!r}")
        if not (math.isfinite(self.grad_var) and self.grad_var >= 0):
            raise BatchModelError(f"grad_var must be finite and >= 0, not {self.grad_var!r}")
        if self.init_batch < 1:
            raise BatchModelError(f"init_batch must be >= 1, not {self.init_batch!r}")

    @property
    def noise_scale(self) -> float:
        """The gradient noise scale in samples: ``B0 * var / sqr``."""
        return self.init_batch * self.grad_var / self.grad_sqr

    def gain(self, batch: float) -> float:
        """Progress of one step at ``batch`` in steps at ``init_batch`` (AdaScale's gain ratio)."""
        scale = batch / self.init_batch
        return (self.grad_var + self.grad_sqr) / (self.grad_var / scale + self.grad_sqr)

    def efficiency(self, batch: float) -> float:
        """Statistical efficiency per sample at ``batch``: ``(noise_scale + B0) / (noise_scale + batch)``."""
        return self.gain(batch) * self.init_batch / batch


@dataclass(frozen=True)
class BatchLimits:
    """What the job allows: its initial (tuned) batch, the largest global batch, the per-GPU micro-batch range."""

    init_batch: int
    max_batch: int
    max_local_batch: int
    min_local_batch: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.init_batch <= self.max_batch:
            raise BatchModelError(f"need 1 <= init_batch ({self.init_batch}) <= max_batch ({self.max_batch})")
        if not 1 <= self.min_local_batch <= self.max_local_batch:
            raise BatchModelError(
                f"need 1 <= min_local_batch ({self.min_local_batch}) <= max_local_batch ({self.max_local_batch})"
            )


@dataclass(frozen=True)
class BatchPlan:
    """One choice: per-replica micro-batch, extra accumulation steps and what the model expects of it."""

    replicas: int
    local_batch: int
    accum_steps: int  # extra micro-steps per optimizer step (0: none), as AdaptDL counts them
    global_batch: int
    step_s: float
    throughput: float  # samples per second
    efficiency: float
    goodput: float  # throughput x efficiency


@dataclass(frozen=True)
class LinearStepModel:
    """A stated step-time model: each micro-step computes ``overhead_s + compute_s_per_sample * b`` seconds and
    one optimizer step adds one gradient all-reduce of ``sync_s_per_node * nodes`` (none on one node), the same
    linear-sync assumption the speedup rule makes (policy/speedup.py)."""

    compute_s_per_sample: float
    sync_s_per_node: float
    gpus_per_node: int
    overhead_s: float = 0.0

    def __call__(self, replicas: int, local_batch: int, accum_steps: int) -> float | None:
        if replicas < 1 or local_batch < 1 or accum_steps < 0:
            return None
        nodes = math.ceil(replicas / max(1, self.gpus_per_node))
        micro = self.overhead_s + self.compute_s_per_sample * local_batch
        sync = self.sync_s_per_node * nodes if nodes > 1 else 0.0
        return (accum_steps + 1) * micro + sync


def local_batch_candidates(limits: BatchLimits, points_per_doubling: int = 4) -> tuple[int, ...]:
    """Per-replica batches to try: a geometric grid (``points_per_doubling`` per factor 2) over the allowed range,
    both ends included."""
    lo, hi = limits.min_local_batch, limits.max_local_batch
    out = {lo, hi}
    step = 2.0 ** (1.0 / max(1, points_per_doubling))
    x = float(lo)
    while x < hi:
        out.add(min(hi, int(round(x))))
        x *= step
    return tuple(sorted(out))


def choose_plan(
    replicas: int,
    stats: GradStats | None,
    limits: BatchLimits,
    step_time: StepTime,
    *,
    candidates: Sequence[int] | None = None,
    max_accum_steps: int = 64,
) -> BatchPlan | None:
    """The plan with the most goodput on ``replicas`` GPUs (ties: the smaller global batch, then fewer
    accumulation steps); None when no plan
    fits the limits. Without ``stats`` (nothing measured yet) every batch counts as efficient as ``init_batch``
    would be only at ``init_batch`` itself: the plan keeps the global batch nearest above ``init_batch``."""
    if replicas < 1:
        raise BatchModelError(f"replicas must be >= 1, not {replicas}")
    best: BatchPlan | None = None
    best_key: tuple[float, float, int] | None = None
    for b in candidates if candidates is not None else local_batch_candidates(limits):
        if not limits.min_local_batch <= b <= limits.max_local_batch:
            continue
        for a in range(max_accum_steps + 1):
            batch = replicas * b * (a + 1)
            if batch > limits.max_batch:
                break
            if batch < limits.init_batch:
                continue
            step = step_time(replicas, b, a)
            if step is None or not step > 0:
                continue
            throughput = batch / step
            eff = stats.efficiency(batch) if stats is not None else 1.0
            goodput = throughput * eff
            # Without statistics: the smallest global batch at or above init_batch, then the fastest.
            key = (goodput, -batch, -a) if stats is not None else (-batch, throughput, -a)
            if best_key is None or key > best_key:
                best_key = key
                best = BatchPlan(replicas, b, a, batch, step, throughput, eff, goodput)
    return best


class GradNoiseEstimator:
    """Running estimate of :class:`GradStats` from gradient norms at two batch sizes (McCandlish et al. 2018,
    appendix A.1, as AdaptDL's gns.py does it): with ``|G_s|^2`` the squared norm of a gradient over
    ``B_s`` samples (one replica's, or one micro-batch's) and ``|G_b|^2`` over ``B_b > B_s`` (the all-reduced or
    accumulated one), ``|G|^2 ~ (B_b |G_b|^2 - B_s |G_s|^2) / (B_b - B_s)`` and the per-sample variance
    ``S ~ (|G_s|^2 - |G_b|^2) / (1 / B_s - 1 / B_b)``. Each step's pair is noisy (either may come out negative),
    so both are exponentially averaged (``smoothing`` per step, bias-corrected) before :meth:`stats` divides
    ``S`` by ``init_batch``."""

    def __init__(self, init_batch: int, smoothing: float = 0.9) -> None:
        if init_batch < 1 or not 0.0 <= smoothing < 1.0:
            raise BatchModelError("need init_batch >= 1 and 0 <= smoothing < 1")
        self.init_batch = init_batch
        self.smoothing = smoothing
        self._sqr = 0.0
        self._var = 0.0
        self._weight = 0.0

    def update(self, small_sqnorm: float, small_batch: int, big_sqnorm: float, big_batch: int) -> None:
        if not 0 < small_batch < big_batch:
            raise BatchModelError(f"need 0 < small_batch ({small_batch}) < big_batch ({big_batch})")
        if not (math.isfinite(small_sqnorm) and math.isfinite(big_sqnorm)):
            return  # a diverged step says nothing about the noise
        sqr = (big_batch * big_sqnorm - small_batch * small_sqnorm) / (big_batch - small_batch)
        var = (small_sqnorm - big_sqnorm) / (1.0 / small_batch - 1.0 / big_batch)
        k = self.smoothing
        self._sqr = k * self._sqr + (1 - k) * sqr
        self._var = k * self._var + (1 - k) * var
        self._weight = k * self._weight + (1 - k)

    def stats(self) -> GradStats | None:
        """The smoothed statistics, or None before any step or while ``|G|^2`` is not yet positive."""
        if self._weight <= 0:
            return None
        sqr, var = self._sqr / self._weight, self._var / self._weight
        if not sqr > 0:
            return None
        return GradStats(grad_sqr=sqr, grad_var=max(0.0, var) / self.init_batch, init_batch=self.init_batch)


def lr_factor(rule: str, global_batch: int, stats: GradStats | None, init_batch: int) -> float:
    """Learning-rate multiplier at ``global_batch`` against the lr tuned at ``init_batch``: ``sqrt`` or
    ``adascale`` (needs ``stats``; without them it falls back to ``sqrt``)."""
    if rule not in LR_RULES:
        raise BatchModelError(f"lr rule must be one of {', '.join(LR_RULES)}, not {rule!r}")
    if global_batch < 1 or init_batch < 1:
        raise BatchModelError("global_batch and init_batch must be >= 1")
    if rule == "adascale" and stats is not None:
        return stats.gain(global_batch)
    return math.sqrt(global_batch / init_batch)


@dataclass(frozen=True)
class AdaptiveState:
    """The latest opt-in, statistics and step-time fit read from a job's gradstats records."""

    limits: BatchLimits
    lr_rule: str
    stats: GradStats | None
    step_model: LinearStepModel | None


def read_state(records: Iterable[Mapping[str, Any]], gpus_per_node: int) -> AdaptiveState | None:
    """The state the records (oldest first) leave; None when the job never opted in. Bad records are skipped.
    The step-time fit: compute seconds per sample from the latest report, all-reduce seconds per node from the
    latest report at more than one node (0 until there is one)."""
    limits: BatchLimits | None = None
    rule = "sqrt"
    stats: GradStats | None = None
    per_sample: float | None = None
    sync_per_node = 0.0
    for rec in records:
        try:
            if isinstance(rec.get("opt_in"), Mapping):
                o = rec["opt_in"]
                limits = BatchLimits(int(o["init_batch"]), int(o["max_batch"]), int(o["max_local_batch"]),
                                     int(o.get("min_local_batch", 1)))
                rule = str(o.get("lr_rule", "sqrt")) if o.get("lr_rule", "sqrt") in LR_RULES else "sqrt"
                continue
            if "grad_sqr" not in rec:
                continue
            s = GradStats(float(rec["grad_sqr"]), float(rec["grad_var"]), int(rec["init_batch"]))
            nodes, local, accum = int(rec["nodes"]), int(rec["local_batch"]), int(rec["accum_steps"])
            compute, step = float(rec["compute_s"]), float(rec["step_s"])
            if nodes < 1 or local < 1 or accum < 0 or not 0 < compute <= step or not math.isfinite(step):
                continue
        except (KeyError, TypeError, ValueError):
            continue
        stats = s
        per_sample = compute / (local * (accum + 1))
        if nodes > 1:
            sync_per_node = (step - compute) / nodes
    if limits is None:
        return None
    if stats is not None and stats.init_batch != limits.init_batch:
        stats = None  # statistics of another configuration
    model = LinearStepModel(per_sample, sync_per_node, gpus_per_node) if per_sample is not None else None
    return AdaptiveState(limits, rule, stats, model)


def goodput_at(state: AdaptiveState, nodes: int, gpus_per_node: int) -> BatchPlan | None:
    """The goodput-best plan on ``nodes`` x ``gpus_per_node`` GPUs from a job's published state; None without
    statistics or a step-time fit, or when no plan fits (what the policy ranks an opted-in unit by)."""
    if state.stats is None or state.step_model is None or nodes < 1 or gpus_per_node < 1:
        return None
    return choose_plan(nodes * gpus_per_node, state.stats, state.limits, state.step_model)
