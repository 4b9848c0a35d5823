"""The goodput-fair allocator (``allocator = true``): every unit's allocation planned together, fairness inside.

The rule walk decides one unit at a time: shrink-to-admit strips the best victim of all its surplus, grows go by
priority. The allocator replaces both choices with one objective over all units (Sia, SOSP'23; Pollux, OSDI'21):

    maximize  sum over units of  x_u ** p / p      (p = ``fairness_power`` < 0; Sia -0.5, Pollux -1)

where ``x_u`` is the unit's normalized goodput, its speed at its planned size over its speed at its requested
size (policy/fairness.py's SpeedModel: published throughput, the goodput model for opted-in jobs, else the
linear-sync model of its utilization), subject to everything the walk enforces (min/max, quotas and Slurm's GPU
limits, reserves, serving first, pauses, pending jobs' admission, restart cost: a resize must save more than its
restart). The objective is separable and concave in each unit's node count, so handing out or taking back one
node at a time by the best marginal value (water-filling) is exact for one pool of identical nodes; partitions
and GRES make the pool not quite one, and the walk then checks each node against the job it would go to.

Fairness is also a constraint, by finish-time fairness ``rho`` (projected JCT / rigid-equivalent JCT):

* a unit with ``rho > 1`` (set to finish later than at its requested size) is **protected**: never a victim
  of shrink-to-admit or reserve reclaim, and first in line for spare nodes;
* a victim gives back one node at a time, always the unit whose ``rho`` after the shrink would be lowest
  (so an arrival takes a little from many units, not one unit entirely), and never below the size at which its
  ``rho`` would exceed both ``fairness_max_rho`` and the waiting job's own ``rho`` (max-min fairness: no victim
  ends worse off than the job it gives way to);
* grows are ranked by their gain in the objective: protected units first, then the largest ``x ** p / p`` gain.

Pure and deterministic: ties go to the unit id. The cost is one fairness per unit per cycle and a heap per
admitted pending job: linear in the units up to a log factor.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

from slurm_elastic.policy.config import UnitSettings
from slurm_elastic.policy.fairness import MIN_HORIZON_S, Fairness, SpeedModel, fairness_value, finish_fairness
from slurm_elastic.policy.model import JobUtilization
from slurm_elastic.policy.reasons import Action
from slurm_elastic.policy.work import Context, UnitWork
from slurm_elastic.slurm.model import Job

#: rho above this counts as behind rigid (protected); the margin keeps a job at exactly its rigid pace, whose
#: rho wobbles with sampling by a fraction of a percent, from flipping every cycle.
PROTECT_ABOVE = 1.01


def speed_model(w: UnitWork, s: UnitSettings, util: JobUtilization, ctx: Context) -> SpeedModel:
    """The unit's speed by size: its trusted throughput by node count when two or more sizes are known (the same
    trust rules as the goodput rule: min_throughput_samples samples younger than throughput_max_age_s), else the
    linear-sync model of its mean utilization."""
    by_size: dict[int, list[float]] = {}
    for sample in util.throughput:
        if (ctx.now - sample.at).total_seconds() <= s.throughput_max_age_s:
            by_size.setdefault(sample.nodes, []).append(sample.value)
    points = tuple(sorted((n, sum(v) / len(v)) for n, v in by_size.items()
                          if len(v) >= s.min_throughput_samples and n > 0 and sum(v) > 0))
    mean = util.mean_util if util.mean_util is not None else 100.0
    return SpeedModel(base=w.current, util=mean / 100.0, points=points if len(points) >= 2 else ())


def assess(works: Iterable[UnitWork], ctx: Context) -> None:
    """Phase 1b: each measured unit's fairness, recorded in its inputs; protection; grow values for the walk."""
    power = ctx.cfg.fairness_power
    for w in works:
        s = w.settings
        util = ctx.utilization.get(w.unit_id)
        if s is None or util is None or util.mean_util is None or w.unit.spec.serving:
            continue
        restart = util.restart_s if util.restart_s is not None else float(s.restart_cost_s)
        f = finish_fairness(w.unit, speed_model(w, s, util, ctx), ctx.now, restart)
        if f is None:
            continue
        w.fairness = f
        w.inputs.update({
            "rho": round(f.rho, 3),
            "rigid_jct_s": round(f.rigid_jct_s, 1),
            "projected_jct_s": round(f.projected_jct_s, 1),
            "remaining_s.source": f.remaining_source,
            "speed_source": f.speeds.source,
            "fairness_max_rho": ctx.cfg.fairness_max_rho,
        })
        if f.rho > PROTECT_ABOVE:
            w.fair_protected = True
            w.reclaim_ok = False
        if w.action is Action.GROW and w.want > 0:
            x0, x1 = f.normalized_speed(w.current), f.normalized_speed(w.current + w.want)
            w.plan_value = fairness_value(x1, power) - fairness_value(x0, power)
            w.inputs["plan_value"] = round(w.plan_value, 4)


def pending_rho(job: Job, now: datetime) -> float:
    """A waiting job's finish-time fairness if it started now: (waited + its run) / its run, its run being its
    time limit (what a rigid run at its request takes at most), else as long as it has waited, at least
    MIN_HORIZON_S. The rigid run it is compared with started at once: every minute it waits counts against it."""
    if job.submit_time is None:
        return 1.0
    waited = max(0.0, (now - job.submit_time).total_seconds())
    run = job.time_limit_min * 60.0 if job.time_limit_min else max(waited, MIN_HORIZON_S)
    return (waited + run) / max(1.0, run)


def victim_limit(job: Job, now: datetime, max_rho: float) -> float:
    """How high a victim's rho may go to admit ``job``: ``max_rho``, or as high as the waiting job's own when
    that is higher (max-min fairness: no victim ends worse off than the job it gives way to). Capping it at
    ``max_rho`` instead was measured and lost: waiting jobs piled up behind protected units (workload-2 greedy:
    average JCT 1.08x rigid, 12% of jobs more than 2x later; docs/performance.md, "Fairness")."""
    return max(max_rho, pending_rho(job, now))


def grow_key(w: UnitWork) -> tuple[int, float, int]:
    """Grows among themselves: protected units first, then the largest gain in the objective, then unit id."""
    return (0 if w.fair_protected else 1, -(w.plan_value or 0.0), w.unit_id)


def shrink_floor(w: UnitWork, max_rho: float, floor: int) -> int:
    """The fewest nodes ``w`` may be shrunk to for others: ``floor`` (its min / admit floor), raised while its
    rho there would exceed ``max_rho``; its current size when it has no fairness (unmeasured units are left
    alone by the allocator)."""
    f = w.fairness
    if f is None:
        return w.current
    n = floor
    while n < w.current and f.rho_at(n) > max_rho:
        n += 1
    return n


def water_fill(candidates: Sequence[tuple[UnitWork, int]], need: int,
               helps: Callable[[UnitWork, int], bool]) -> list[tuple[UnitWork, int]] | None:
    """Take ``need`` nodes from ``candidates`` ((unit, nodes it may give at most)), one node at a time from the
    unit whose rho after giving it would be lowest; ``helps(unit, k)`` says whether its k-th next node (0-based)
    fits the job the nodes are for. Returns (unit, nodes) with nodes > 0, or None when they are not enough."""
    heap: list[tuple[float, int, int]] = []
    by_id: dict[int, tuple[UnitWork, int]] = {}
    for w, most in candidates:
        if most <= 0 or w.fairness is None or not helps(w, 0):
            continue
        by_id[w.unit_id] = (w, most)
        heap.append((w.fairness.rho_at(w.current - w.taken - 1), w.unit_id, 0))
    heapq.heapify(heap)
    got: dict[int, int] = {}
    left = need
    while left > 0 and heap:
        _, uid, k = heapq.heappop(heap)
        w, most = by_id[uid]
        got[uid] = k + 1
        left -= 1
        nxt = k + 1
        if nxt < most and helps(w, nxt):
            assert w.fairness is not None
            heapq.heappush(heap, (w.fairness.rho_at(w.current - w.taken - nxt - 1), uid, nxt))
    if left > 0:
        return None
    return [(by_id[uid][0], k) for uid, k in sorted(got.items())]


__all__ = ["Fairness", "assess", "grow_key", "shrink_floor", "speed_model", "water_fill"]
