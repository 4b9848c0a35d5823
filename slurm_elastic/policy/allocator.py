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
from collections.abc import Callable, Iterable
from datetime import datetime

from slurm_elastic.policy.coadapt import coadapted
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
        source = f.speeds.source  # what rho rests on
        f, by_goodput = coadapted(f, util, w.current + max(0, w.want))  # opted-in: sizes valued by goodput
        w.fairness = f
        w.inputs.update({
            "rho": round(f.rho, 3),
            "rigid_jct_s": round(f.rigid_jct_s, 1),
            "projected_jct_s": round(f.projected_jct_s, 1),
            "remaining_s.source": f.remaining_source,
            "speed_source": source,
            "plan_speed_source": "goodput model (co-adapted batch)" if by_goodput else source,
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


class VictimHeap:
    """Water-filling of one pending job's nodes from the victims by rho, kept across the pending jobs of one walk
    (one heap per partition; a job of several partitions gets a heap of its own).

    The walk admits pending jobs in falling priority, so a victim of priority at or above one job's is no victim
    of any later job's either, and a victim without surplus left never has one again: both leave the heap for
    good. Keys go stale when a unit gives nodes; a stale key is refreshed when it reaches the top. So a walk
    costs the victims it takes from (and those it drops), not every victim once per pending job.
    """

    def __init__(self, victims: Iterable[UnitWork]) -> None:
        self._by_id: dict[int, UnitWork] = {}
        self._heap: list[tuple[float, int]] = []
        for w in victims:
            if w.fairness is not None and w.unit_id not in self._by_id:
                self._by_id[w.unit_id] = w
                self._heap.append((self._key(w, 0), w.unit_id))
        heapq.heapify(self._heap)

    @staticmethod
    def _surplus(w: UnitWork) -> int:
        return min(w.current - w.taken - max(w.unit.min_nodes, w.admit_floor), len(w.removal()) - w.taken)

    @staticmethod
    def _key(w: UnitWork, k: int) -> float:
        assert w.fairness is not None
        return w.fairness.rho_at(w.current - w.taken - k - 1)

    def take(self, priority: int, need: int, limit: float,
             helps: Callable[[UnitWork, int], bool]) -> list[tuple[UnitWork, int]] | None:
        """Take ``need`` nodes for a pending job of ``priority``, one node at a time from the unit whose rho after
        giving it would be lowest, none that would take a unit's rho above ``limit``; ``helps(unit, k)`` says
        whether its k-th next node (0-based) fits the job (asked only of the nodes popped). Returns (unit, nodes)
        with nodes > 0, or None when they are not enough; nothing is committed: the caller adds the picks to the
        units' ``taken``."""
        heap = self._heap
        picks: dict[int, int] = {}
        aside: list[tuple[float, int]] = []
        left = need
        while left > 0 and heap:
            key, uid = heap[0]
            w = self._by_id[uid]
            k = picks.get(uid, 0)
            if w.priority >= priority or (k == 0 and self._surplus(w) <= 0):
                heapq.heappop(heap)  # for good: later jobs have lower priority; surplus only shrinks
                continue
            if k >= self._surplus(w):
                aside.append(heapq.heappop(heap))  # exhausted by this job's picks alone
                continue
            fresh = self._key(w, k)
            if fresh != key:
                heapq.heapreplace(heap, (fresh, uid))
                continue
            if key > limit:
                break  # the lowest rho after a shrink is above the limit: so is every other
            heapq.heappop(heap)
            if not helps(w, k):
                aside.append((key, uid))
                continue
            picks[uid] = k + 1
            left -= 1
            heapq.heappush(heap, (self._key(w, k + 1), uid))
        for entry in aside:
            heapq.heappush(heap, entry)
        if left > 0:
            return None
        return [(self._by_id[uid], k) for uid, k in sorted(picks.items())]


__all__ = ["Fairness", "VictimHeap", "assess", "grow_key", "pending_rho", "speed_model", "victim_limit"]
