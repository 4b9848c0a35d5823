"""Speedup-aware growth: what the next node(s) of a unit are worth, in seconds of its run time saved.

Two sources, best first:

* **throughput** (the job publishes it through ``slurm_elastic.goodput``): the marginal efficiency of the next
  step from :func:`~slurm_elastic.policy.signals.scaling` (measured at the next larger size, else the last
  step's, as the goodput rule reads it); speedup = 1 + efficiency x added / nodes.
* **the linear-sync model**, fitted to the window's mean GPU utilization ``u`` at the current size ``n``: a
  step is compute (share ``u``, divided among the nodes at a fixed global batch) plus synchronisation (share
  ``1 - u``, growing in proportion to the node count). At ``m`` nodes a step takes
  ``u * n / m + (1 - u) * m / n`` of what it takes now and the speedup is its inverse: linear at 100%
  utilization, a slowdown below about 50% for one more node. ``bench/speedup_model.py`` measures it against
  the Pollux traces' scalability.csv/placements.csv; sync held constant instead (the textbook Amdahl form)
  was measured there too and is much too optimistic (docs/performance.md, "Speedup-aware growth").

The gain of growing is ``remaining x (1 - 1 / speedup) - restart``: the seconds the remaining run (the time
limit left) gets shorter, minus one restart. Without a time limit the gain is unbounded and units rank by
speedup alone.
"""

from __future__ import annotations

from dataclasses import dataclass


def model_speedup(util_pct: float, nodes: int, add: int, sync_growth: float = 1.0) -> float:
    """Speedup of going from ``nodes`` to ``nodes + add`` under the linear-sync model, from the mean GPU
    utilization (percent) at ``nodes``; ``sync_growth`` 0 holds sync time constant instead (for the bench)."""
    if nodes <= 0 or add <= 0:
        return 1.0
    u = min(1.0, max(0.0, util_pct / 100.0))
    m = nodes + add
    growth: float = (m / nodes) ** sync_growth
    return 1.0 / (u * nodes / m + (1.0 - u) * growth)


def speedup_from_efficiency(efficiency: float, nodes: int, add: int) -> float:
    """Speedup of adding ``add`` nodes to ``nodes`` at marginal efficiency ``efficiency`` (1.0 = linear)."""
    return max(0.0, 1.0 + efficiency * add / max(1, nodes))


def efficiency_of(speedup: float, nodes: int, add: int) -> float:
    """The marginal efficiency a speedup stands for: its gain over the gain of perfect scaling."""
    return (speedup - 1.0) * max(1, nodes) / max(1, add)


@dataclass(frozen=True)
class Gain:
    """What growing a unit by ``add`` nodes is expected to save."""

    speedup: float
    source: str  # "throughput" or "utilization model"
    gain_s: float  # seconds saved net of the restart; inf without a time limit
    restart_s: float

    @property
    def pays(self) -> bool:
        return self.gain_s > 0


def grow_gain(speedup: float, source: str, remaining_s: float | None, restart_s: float) -> Gain:
    """The net seconds saved by running the remaining time ``speedup`` times faster, after one restart."""
    if remaining_s is None:
        return Gain(speedup, source, float("inf") if speedup > 1.0 else 0.0, restart_s)
    left = max(0.0, remaining_s - restart_s)
    saved = left * (1.0 - 1.0 / speedup) if speedup > 0 else 0.0
    return Gain(speedup, source, saved - restart_s, restart_s)
