"""Reading the measured signals: is a unit's utilization usable, and what does its throughput say about scaling.

Both are pure functions of one unit's :class:`JobUtilization` and settings. Stale or missing metrics make a
:class:`MetricsGate` that blocks every metric-driven resize: a silent agent must never look like an idle job.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from slurm_elastic.policy.config import UnitSettings
from slurm_elastic.policy.model import JobUtilization, ThroughputSample
from slurm_elastic.policy.reasons import Reason
from slurm_elastic.policy.wording import ago


@dataclass(frozen=True)
class MetricsGate:
    """Why the utilization can not be used (``reason``), or None when it can (``mean`` is then set)."""

    reason: Reason | None
    message: str
    mean: float | None = None


def utilization_gate(util: JobUtilization | None, s: UnitSettings, now: datetime) -> MetricsGate:
    if util is None or util.mean_util is None or util.samples <= 0:
        return MetricsGate(Reason.NO_METRICS, "no utilization reported")
    if util.last_sample_at is None:
        return MetricsGate(Reason.STALE_METRICS, "utilization has no sample time")
    age = (now - util.last_sample_at).total_seconds()
    if age > s.max_metric_age_s:
        return MetricsGate(
            Reason.STALE_METRICS,
            f"last sample {ago(age, s.max_metric_age_s)} old > max_metric_age_s {s.max_metric_age_s}s",
        )
    if util.window_s < s.window_s:
        return MetricsGate(
            Reason.WINDOW_NOT_FILLED,
            f"samples cover {ago(util.window_s, s.window_s)} < window {s.window_s}s ({util.samples} samples)",
        )
    if util.samples < s.min_samples:
        return MetricsGate(
            Reason.TOO_FEW_SAMPLES, f"{util.samples} samples < min_samples {s.min_samples} over {s.window_s}s"
        )
    return MetricsGate(None, "", util.mean_util)


def marginal_efficiency(small_nodes: int, small_tp: float, big_nodes: int, big_tp: float) -> float | None:
    """Gain of going from ``small`` to ``big`` divided by the gain of perfect scaling (1.0 = linear).

    None when it can not be computed (no gain possible, or no throughput at the small size).
    """
    if big_nodes <= small_nodes or small_nodes <= 0 or small_tp <= 0:
        return None
    perfect = small_tp * (big_nodes - small_nodes) / small_nodes
    return (big_tp - small_tp) / perfect


@dataclass(frozen=True)
class Scaling:
    """What the throughput samples say around the unit's current size.

    ``current`` is the trusted mean throughput at the current size (None: not enough fresh samples, so the
    goodput rule falls back to utilization). ``last_step`` is the measured marginal efficiency from the
    largest smaller trusted size (``prev_nodes``) to now; ``next_step`` the measured one to the next larger
    trusted size, else the last step's (concave scaling: the next step is no better than the last one), or
    None when nothing is known.
    """

    current: float | None
    prev_nodes: int | None
    last_step: float | None
    next_step: float | None
    next_measured: bool

    @property
    def usable(self) -> bool:
        return self.current is not None


def scaling(samples: Iterable[ThroughputSample], nodes: int, s: UnitSettings, now: datetime) -> Scaling:
    by_size: dict[int, list[ThroughputSample]] = {}
    for sample in samples:
        if (now - sample.at).total_seconds() <= s.throughput_max_age_s:  # old numbers are forgotten
            by_size.setdefault(sample.nodes, []).append(sample)
    trusted: dict[int, float] = {}
    for size, group in by_size.items():
        if len(group) >= s.min_throughput_samples:
            trusted[size] = sum(x.value for x in group) / len(group)
    at_now = by_size.get(nodes, [])
    fresh = bool(at_now) and (now - max(x.at for x in at_now)).total_seconds() <= s.max_metric_age_s
    if nodes not in trusted or not fresh:
        return Scaling(None, None, None, None, False)
    current = trusted[nodes]
    smaller = [n for n in trusted if n < nodes]
    larger = [n for n in trusted if n > nodes]
    prev = max(smaller) if smaller else None
    last = marginal_efficiency(prev, trusted[prev], nodes, current) if prev is not None else None
    if larger:
        nxt = min(larger)
        return Scaling(current, prev, last, marginal_efficiency(nodes, current, nxt, trusted[nxt]), True)
    return Scaling(current, prev, last, last, False)


def restart_gain_s(remaining_s: float | None, restart_s: float, efficiency: float, add: int, nodes: int) -> float:
    """Expected gain of growing by ``add`` nodes, in seconds of progress at the current size.

    Over the time left after the restart, the job runs ``efficiency * add / nodes`` faster; the restart
    itself costs ``restart_s`` of progress, compared against by the caller. No time limit: unbounded gain.
    """
    if remaining_s is None:
        return float("inf")
    return max(0.0, remaining_s - restart_s) * efficiency * add / max(1, nodes)
