"""Batch size in the plan: an opted-in unit's speed at each size is the goodput of the batch it
would use at that size (Pollux's co-adaptation, OSDI'21 section 4.1: the allocator values an allocation by the
goodput of the best batch plan for it, not by the throughput at the job's current batch).

For a unit that opted in to adaptive batch size (``JobUtilization.adaptive`` with statistics and a step-time
fit), :func:`goodput_curve` gives ``(nodes, goodput)`` at every size from one node up to what the plan may give
it, each the goodput-best plan of :func:`slurm_elastic.batchsize.goodput_at` (the plan the job reads at its next
restart). :func:`coadapted` puts that curve under the unit's :class:`~slurm_elastic.policy.fairness.Fairness`,
so what the allocator *ranks* by reads goodput at the co-adapted batch:

* the round plan's objective ``sum(x ** p / p)`` (``x`` = goodput at ``n`` over goodput at the request), so
  water-filling values a node for this unit by the goodput it adds with the batch re-chosen;
* shrink-to-admit victims and the plan's floors (``rho_at``: rho after a shrink, from the goodput lost on the
  nodes given back, at the batch the job then uses);
* grows' ``plan_value``.

What the unit's fairness *rests on* stays measured: rho now, its rigid-equivalent and projected JCT (the
protection rho > 1) come from the speed model of its published throughput (or utilization), as for every other
unit. Putting the curve under rho as well was measured and lost on the mean (docs/performance.md, "Batch size in
the plan"): the model's better scaling at the request shortens the rigid-equivalent, more units count as
behind their rigid pace, fewer are victims, and arrivals wait longer.

Pure (no cache across calls): a unit costs one batch-plan search per size up to what the plan may give it, and
only units that opted in have a curve.
"""

from __future__ import annotations

from dataclasses import replace

from slurm_elastic.batchsize import AdaptiveState, goodput_at
from slurm_elastic.policy.fairness import Fairness, SpeedModel
from slurm_elastic.policy.model import JobUtilization

#: The most sizes one curve evaluates (above it the speed model extrapolates by its last step, concave).
MAX_CURVE_NODES = 64


def gpus_per_node(util: JobUtilization, current: int) -> int:
    """GPUs per node of the unit: what it holds over its nodes, else its step-time fit's (as goodput_trade)."""
    state = util.adaptive
    if current >= 1 and util.gpus_allocated >= current:
        return util.gpus_allocated // current
    if state is not None and state.step_model is not None:
        return state.step_model.gpus_per_node
    return 0


def _goodput(state: AdaptiveState, nodes: int, per_node: int) -> float:
    plan = goodput_at(state, nodes, per_node)
    return plan.goodput if plan is not None and plan.goodput > 0 else 0.0


def goodput_curve(util: JobUtilization, current: int, upto: int) -> tuple[tuple[int, float], ...]:
    """``(nodes, goodput)`` for 1..``upto`` nodes (at most MAX_CURVE_NODES) at the co-adapted batch; empty when
    the unit did not opt in, has no statistics or step-time fit yet, or a size has no plan (then the caller
    falls back to measured throughput: a curve with holes would not be concave)."""
    state = util.adaptive
    if state is None or state.stats is None or state.step_model is None:
        return ()
    per_node = gpus_per_node(util, current)
    if per_node < 1:
        return ()
    points: list[tuple[int, float]] = []
    for n in range(1, max(1, min(upto, MAX_CURVE_NODES)) + 1):
        g = _goodput(state, n, per_node)
        if g <= 0:
            return ()
        points.append((n, g))
    return tuple(points) if len(points) >= 2 else ()


def coadapted(f: Fairness, util: JobUtilization, reach: int) -> tuple[Fairness, bool]:
    """``f`` with the co-adapted goodput curve as its speed model for sizes other than the current one (rho now
    unchanged), and True; ``f`` and False when the unit has no curve. ``reach``: the most nodes the plan may
    give it this cycle (the curve covers 1..max(reach, its request))."""
    curve = goodput_curve(util, f.current, max(reach, f.requested_nodes))
    if not curve:
        return f, False
    return replace(f, speeds=SpeedModel(base=f.current, util=f.speeds.util, points=curve), _memo={}), True


__all__ = ["MAX_CURVE_NODES", "coadapted", "goodput_curve", "gpus_per_node"]
