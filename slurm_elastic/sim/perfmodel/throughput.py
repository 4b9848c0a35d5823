"""Measured step time of a Pollux application for a placement and per-GPU batch, interpolated as the artifact.

* A measured placement (every placement of up to 4 nodes was measured) is looked up under its
  lexicographically smallest rotation, then interpolated linearly over ``local_bsz`` between the two nearest
  measured batch sizes. Outside the measured batch range there is no answer.
* Any other placement (5 or more nodes) is interpolated linearly in (num_nodes, num_replicas, local_bsz) over
  the union of the placement measurements (averaged per node count, replica count and batch) and
  ``scalability.csv`` (6 to 16 nodes): scipy's ``LinearNDInterpolator``, i.e. barycentric interpolation inside
  the Delaunay tetrahedron that contains the point. That is what the artifact does, on the same points in the
  same order, so ties in the (degenerate, grid-like) triangulation resolve the same way. Node counts above 16
  are treated as 16 (the largest measured), as in the artifact. Outside the convex hull there is no answer.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import defaultdict
from typing import Any

from slurm_elastic.sim.errors import PerfModelError, SimulationError
from slurm_elastic.sim.perfmodel.appdata import AppMeasurements

_MAX_MEASURED_NODES = 16


def canonical_placement(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The lexicographically smallest rotation, the artifact's name of a placement: (4, 2) -> (2, 4)."""
    shape = tuple(g for g in shape if g)
    if not shape:
        return shape
    return min(shape[i:] + shape[:i] for i in range(len(shape)))


class StepTimeTable:
    """``lookup(placement, local_bsz) -> (step_time, sync_time)`` for one application. Results are cached."""

    def __init__(self, measurements: AppMeasurements) -> None:
        self.name = measurements.name
        curves: dict[tuple[int, ...], list[tuple[float, float, float]]] = defaultdict(list)
        groups: dict[tuple[int, int, int], list[tuple[float, float]]] = defaultdict(list)
        for row in measurements.placements:
            curves[row.placement].append((float(row.local_bsz), row.step_time, row.sync_time))
            key = (len(row.placement), sum(row.placement), row.local_bsz)
            groups[key].append((row.step_time, row.sync_time))
        self._curves = {p: sorted(points) for p, points in curves.items()}
        # Same points, same order as the artifact: the per-(nodes, replicas, bsz) means in sorted key order,
        # then scalability.csv in file order.
        points: list[tuple[float, float, float]] = []
        values: list[tuple[float, float]] = []
        for key in sorted(groups):
            rows = groups[key]
            points.append((float(key[0]), float(key[1]), float(key[2])))
            values.append((sum(r[0] for r in rows) / len(rows), sum(r[1] for r in rows) / len(rows)))
        for srow in measurements.scalability:
            points.append((float(srow.num_nodes), float(srow.num_replicas), float(srow.local_bsz)))
            values.append((srow.step_time, srow.sync_time))
        self._nd_points = points
        self._nd_values = values
        self._nd: Any = None
        self._cache: dict[tuple[tuple[int, ...], float], tuple[float, float]] = {}

    def lookup(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        key = (canonical_placement(placement), float(local_bsz))
        cached = self._cache.get(key)
        if cached is None:
            cached = self._compute(*key)
            self._cache[key] = cached
        return cached

    def _compute(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        if not placement:
            raise PerfModelError(f"{self.name}: empty placement")
        curve = self._curves.get(placement)
        if curve is not None:
            return _interp_curve(self.name, placement, curve, local_bsz)
        return self._interp_nd(placement, local_bsz)

    def _interp_nd(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        if self._nd is None:
            try:
                import numpy as np
                from scipy.interpolate import LinearNDInterpolator
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise SimulationError("the simulator needs numpy and scipy: pip install 'slurm-elastic[sim]'") from exc
            self._nd = LinearNDInterpolator(np.array(self._nd_points), np.array(self._nd_values))
        num_nodes = min(len(placement), _MAX_MEASURED_NODES)
        result = self._nd([[float(num_nodes), float(sum(placement)), float(local_bsz)]])[0]
        step, sync = float(result[0]), float(result[1])
        if math.isnan(step) or math.isnan(sync):  # outside the measured hull
            raise PerfModelError(
                f"{self.name}: no measurement near {len(placement)} nodes x {sum(placement)} GPUs "
                f"at local batch {local_bsz:g}"
            )
        return step, sync


def _interp_curve(
    name: str, placement: tuple[int, ...], curve: list[tuple[float, float, float]], x: float
) -> tuple[float, float]:
    xs = [p[0] for p in curve]
    if not xs[0] <= x <= xs[-1]:
        raise PerfModelError(
            f"{name}: placement {''.join(map(str, placement))} measured for local batch "
            f"{xs[0]:g}..{xs[-1]:g}, not {x:g}"
        )
    i = bisect_left(xs, x)
    if xs[i] == x:
        return curve[i][1], curve[i][2]
    x0, s0, y0 = curve[i - 1]
    x1, s1, y1 = curve[i]
    w = (x - x0) / (x1 - x0)
    return s0 + w * (s1 - s0), y0 + w * (y1 - y0)
