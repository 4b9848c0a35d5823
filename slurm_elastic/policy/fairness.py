"""Finish-time fairness (Themis, Shockwave): how much later than under rigid Slurm a job is set to finish.

For a running unit, ``rho = projected JCT / rigid-equivalent JCT``:

* **rigid-equivalent JCT** = its wait + the progress it made so far, in seconds at its requested size + what is
  left of its work at its requested size. That is the JCT it would get had it run at its request since it
  started. Its actual wait stands in for the rigid wait: elasticity usually shortens waits, so this is the
  conservative side (a job is judged against a rigid run that started when it did).
* **projected JCT** = the time since submission + what is left at ``nodes`` (plus one restart when ``nodes``
  is not its current size).

Progress so far is the service attained (GPU-seconds held, ``ElasticUnit.attained_gpu_s``) over the requested
GPUs: linear scaling, which credits a job grown above its request a little more than it gained, and debits a
shrunk one a little more than it lost on sublinear scaling (the protective side for the victim). What is left
comes from the time limit (``Job.remaining_seconds``, which shrinks extend); a job without a time limit is
assumed to run as long again as it has run (the median-residual assumption of Tiresias and of least-attained
service), at least ``MIN_HORIZON_S``.

Relative speeds come from a :class:`SpeedModel`: the unit's published throughput by size when it has two or
more trusted sizes, else the linear-sync model of its GPU utilization (policy/speedup.py), the same model the
speedup_growth rule reads. Pure: no clock, ``now`` is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from slurm_elastic.policy.model import ElasticUnit

MIN_HORIZON_S = 600.0  # a job with no time limit is assumed to have at least this long left


@dataclass(frozen=True)
class SpeedModel:
    """Speed at ``n`` nodes relative to the speed at ``base`` nodes (1.0 there).

    ``points``: measured (nodes, throughput) pairs, sorted by nodes, used when there are two or more: linear
    between them, proportional below the smallest (linear scaling down, the victim's protective side) and by the
    last step's marginal efficiency above the largest (concave: no better than the last step). Otherwise the
    linear-sync model at utilization ``util`` (0..1): a step at ``m`` nodes takes ``u * n / m + (1 - u) * m / n``
    of the time it takes at ``n = base``.
    """

    base: int
    util: float
    points: tuple[tuple[int, float], ...] = ()

    @property
    def source(self) -> str:
        return "throughput" if len(self.points) >= 2 else "utilization model"

    def speed(self, nodes: int) -> float:
        if nodes <= 0:
            return 0.0
        if len(self.points) >= 2:
            return self._measured(nodes) / self._measured(self.base)
        n, u = max(1, self.base), min(1.0, max(0.0, self.util))
        return 1.0 / (u * n / nodes + (1.0 - u) * nodes / n)

    def _measured(self, nodes: int) -> float:
        pts = self.points
        lo_n, lo_tp = pts[0]
        if nodes <= lo_n:
            return lo_tp * nodes / lo_n
        for (a_n, a_tp), (b_n, b_tp) in zip(pts, pts[1:], strict=False):
            if nodes <= b_n:
                return a_tp + (b_tp - a_tp) * (nodes - a_n) / (b_n - a_n)
        (a_n, a_tp), (b_n, b_tp) = pts[-2], pts[-1]
        slope = max(0.0, min((b_tp - a_tp) / (b_n - a_n), b_tp / b_n))  # concave, at most linear
        return b_tp + slope * (nodes - b_n)


@dataclass(frozen=True)
class Fairness:
    """Finish-time fairness of a unit now and at ``nodes`` (see the module docstring)."""

    rho: float  # at its current size
    rigid_jct_s: float
    projected_jct_s: float  # at its current size
    remaining_s: float  # at its current size (time limit, else the horizon assumption)
    remaining_source: str  # "time limit" or "as long again as it ran"
    requested_nodes: int
    restart_s: float
    current: int
    speeds: SpeedModel
    elapsed_s: float
    _memo: dict[int, float] = field(default_factory=dict, compare=False, repr=False)  # nodes -> rho_at

    def rho_at(self, nodes: int) -> float:
        """rho if the unit ran at ``nodes`` from now on (one restart when that is a change)."""
        if nodes == self.current:
            return self.rho
        hit = self._memo.get(nodes)
        if hit is not None:
            return hit
        speed = self.speeds.speed(nodes)
        if speed <= 0:
            value = float("inf")
        else:
            left = self.remaining_s * self.speeds.speed(self.current) / speed + self.restart_s
            value = (self.elapsed_s + left) / self.rigid_jct_s
        self._memo[nodes] = value
        return value

    def normalized_speed(self, nodes: int) -> float:
        """Speed at ``nodes`` over its speed at the requested size (Pollux's and Sia's normalized goodput)."""
        ref = self.speeds.speed(self.requested_nodes)
        return self.speeds.speed(nodes) / ref if ref > 0 else 0.0


def finish_fairness(unit: ElasticUnit, speeds: SpeedModel, now: datetime, restart_s: float) -> Fairness | None:
    """The unit's :class:`Fairness`; None when it has not started (no start or submit time)."""
    job = unit.job
    if job.start_time is None or job.submit_time is None:
        return None
    current = unit.current_nodes
    requested = unit.requested_nodes or unit.submitted_nodes or current
    requested = max(1, requested)
    elapsed = max(0.0, (now - job.submit_time).total_seconds())
    wait = max(0.0, (job.start_time - job.submit_time).total_seconds())
    ran = max(0.0, elapsed - wait)
    gpn = job.gpus_per_node()
    if unit.attained_gpu_s is not None and gpn > 0:
        progress = unit.attained_gpu_s / (requested * gpn)
    else:
        progress = ran * min(1.0, current / requested) if gpn <= 0 else ran
    remaining = job.remaining_seconds(now)
    if remaining is None:
        left, source = max(ran, MIN_HORIZON_S), "as long again as it ran"
    else:
        left, source = max(0.0, remaining), "time limit"
    at_request = speeds.speed(requested)
    left_rigid = left * speeds.speed(current) / at_request if at_request > 0 else left
    rigid = max(1.0, wait + progress + left_rigid)
    projected = elapsed + left
    return Fairness(
        rho=projected / rigid, rigid_jct_s=rigid, projected_jct_s=projected, remaining_s=left,
        remaining_source=source, requested_nodes=requested, restart_s=restart_s, current=current, speeds=speeds,
        elapsed_s=elapsed,
    )


def fairness_value(x: float, power: float) -> float:
    """Sia's per-job objective term: normalized goodput ``x`` raised to ``power`` (< 0), over ``power`` so that
    it rises with ``x``; concave, steepest for the jobs furthest below their requested speed. -inf at x = 0."""
    if x <= 0:
        return float("-inf")
    return float(x**power / power)
