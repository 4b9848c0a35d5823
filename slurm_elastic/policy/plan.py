"""The allocator's round plan (``allocator = true``): target sizes for the elastic units and the waiting jobs of a
partition together, pending jobs at a share.

Each cycle, per partition, the plan hands out the partition's *plannable* nodes: its free nodes plus every
victim's nodes above its floor (``max(min, admit floor)``). Units that may not give (protected by rho, paused,
no shrink, serving) keep what they hold. The objective is Sia's (SOSP'23)::

    maximize  sum over units and admitted jobs of  x ** p / p      (p = fairness_power < 0)

``x`` being normalized goodput: a unit's speed at ``n`` nodes over its speed at its request
(policy/fairness.py's SpeedModel: its measured throughput, else the linear-sync model of its utilization); a
waiting job's ``n / request`` (nothing is measured before it runs: linear, the optimistic side for the arrival).

**The solver.** Two steps, in this order:

1. *Admission* (the only non-concave part: a job that cannot start at all has ``x = 0``, worth ``-inf``). In
   priority order (Slurm's), every waiting job whose start size fits what is left gets it: its moldable min
   (``PolicyInput.pending_min_nodes``, a job moldable start may start smaller) or, for a rigid job, its request.
   Since ``-inf`` is below any finite loss, starting a job beats any number of nodes elsewhere, so an admission
   step is never undone by the water-filling below.
2. *Water-filling.* The rest goes one node at a time to the entity with the largest marginal gain
   ``V(n + 1) - V(n)``: victims up to what they hold now, grow intents up to what they asked for, admitted
   moldable jobs up to their request. Ties: units first, then the higher id (the lowest id is left smaller).

Step 2 is exact, not an approximation: the objective is a sum of one concave function per entity over integer
sizes with box bounds and one budget constraint (sum of sizes <= nodes). For such a *separable concave* resource
allocation problem, marginal gains of each entity do not increase with its size, so the multiset of the B largest
marginal gains over all entities is a prefix of each entity's gain sequence; greedy takes exactly those B gains,
and any other feasible allocation replaces some of them by gains no larger (the exchange argument; Gross 1956,
Ibaraki & Katoh, "Resource Allocation Problems", 1988, ch. 4). ``x ** p / p`` with p < 0 is concave and rising in
``x``, and ``x`` is concave in ``n`` (linear for pending jobs, concave for measured speeds by construction of
SpeedModel; the linear-sync model is concave below its optimum, and the grows above it are not offered by the
evaluation), so the composition is concave. Cost: O((entities + B) log entities) per partition.

**Restart cost.** A resize restarts the job (checkpoint, requeue of the step, warm-up): a unit sized away from
what it holds loses ``restart_s`` (measured by the controller's resize phases and cold starts, else
``restart_cost_s``; the simulator's ``resize_cost``). :func:`restart_penalty` turns that into the plan's value
units (its value at ``held`` less its value with ``restart_s`` of its remaining time lost), and each unit's value
is ``V(n) - c * |n - held|``: every node it keeps below ``held`` gains ``c`` more, every node above ``held`` (a
grow) ``c`` less, and a node whose gain falls below zero is left free. That is the hysteresis: a plan that
would move a unit by one node does so only when someone else gains more than the unit's restart. Charging
``c`` per node away from ``held`` keeps the solver exact: ``-c * |n - held|`` is concave, so each entity's value
stays concave and the exchange argument above holds unchanged. The true cost is ``c`` once per resized unit (a
fixed cost: not concave, and with it the problem is a knapsack); per node it is exact for one-node changes,
which is where hysteresis matters, and an upper bound for larger ones (the plan then leans to taking one node
from each of several units rather than several from one, the fair side).

What the plan changes in the walk: a moldable waiting job asks only for its **share** (what the plan gave it),
so an arrival takes a little from many units instead of its whole request from a few; victims give back only
down to their planned size (their floor for shrink-to-admit), and the walk still picks which nodes fit
(partition, GRES). The walk's own restart-cost rule guards grows as before. Pure and deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from slurm_elastic.policy.fairness import Fairness, fairness_value


@dataclass
class Entity:
    """One thing the plan sizes: ``lo`` nodes it gets at least, ``hi`` at most; ``speed(n)`` its normalized
    goodput at ``n`` nodes (1.0 at its request)."""

    key: tuple[int, int]  # (kind, id): kind 0 for units, 1 for waiting jobs
    lo: int
    hi: int
    speed: Callable[[int], float]
    size: int = 0
    held: int = 0  # nodes it holds now (a unit; 0 for a waiting job)
    restart: float = 0.0  # the value a resize costs it, per node away from ``held`` (restart_penalty)


@dataclass
class Waiting:
    """A waiting job as the plan sees it: its start size (moldable min, else its request; 1 <= start <= request)
    and its request."""

    job_id: int
    start: int
    request: int


@dataclass
class Plan:
    """The plan of one partition: sizes by unit id, and by waiting job id for the moldable jobs it admits."""

    units: dict[int, int] = field(default_factory=dict)
    jobs: dict[int, int] = field(default_factory=dict)
    requests: dict[int, int] = field(default_factory=dict)  # the admitted jobs' requests
    budget: int = 0  # the plannable nodes: free + victims' nodes above their floors


def _gain(e: Entity, power: float) -> float:
    now, nxt = e.speed(e.size), e.speed(e.size + 1)
    gain = fairness_value(nxt, power) - fairness_value(now, power) if now > 0 else float("inf")
    return gain + (e.restart if e.size < e.held else -e.restart)  # toward what it holds: one restart less


def _tie(e: Entity) -> tuple[int, int]:
    """Equal gains: units before waiting jobs, then the highest id first, so that among equal victims the lowest
    unit id is the one left smaller (the walk's VictimHeap breaks its ties the same way)."""
    return (e.key[0], -e.key[1])


def water_fill(entities: Sequence[Entity], budget: int, power: float) -> int:
    """Hand out ``budget`` nodes one at a time by the largest marginal gain (each entity from its current
    ``size`` up to ``hi``); returns what was left. Exact for concave per-entity values (module docstring).
    When the budget covers every entity's room, each simply gets its ``hi`` (no heap)."""
    room = sum(e.hi - e.size for e in entities if e.hi > e.size)
    if room <= budget and not any(e.restart > 0 and e.hi > e.held for e in entities):  # every gain > 0
        for e in entities:
            e.size = max(e.size, e.hi)
        return budget - room
    heap: list[tuple[float, tuple[int, int], int]] = []
    for i, e in enumerate(entities):
        if e.size < e.hi:
            heap.append((-_gain(e, power), _tie(e), i))
    heapq.heapify(heap)
    while budget > 0 and heap:
        gain, _, i = heapq.heappop(heap)
        if -gain < 0:
            break  # a grow worth less than its restart: the node is better left free (all others gain less)
        e = entities[i]
        e.size += 1
        budget -= 1
        if e.size < e.hi:
            heapq.heappush(heap, (-_gain(e, power), _tie(e), i))
    return budget


def plan_partition(units: Sequence[Entity], waiting: Iterable[Waiting], free: int, power: float) -> Plan:
    """The plan for one partition: ``units`` with their floors (``lo``) and what they may reach (``hi``: what
    they hold for victims, more for grow intents, ``lo == hi`` for units that keep their size), ``waiting`` in
    priority order (read only until the budget is spent), ``free`` nodes. Entities are changed in place
    (``size``)."""
    budget = free
    for u in units:
        u.size = u.lo
        budget += max(0, u.held - u.lo)
    plan = Plan(budget=budget)
    admitted: list[Entity] = []
    for job in waiting:
        if budget <= 0:
            break
        if job.start <= budget:
            budget -= job.start
            if job.start < job.request:  # a rigid job has no room to fill: its size is its request
                admitted.append(Entity((1, job.job_id), job.start, job.request, _linear(job.request),
                                       size=job.start))
    water_fill([*units, *admitted], budget, power)
    plan.units = {u.key[1]: u.size for u in units}
    plan.jobs = {e.key[1]: e.size for e in admitted}
    plan.requests = {e.key[1]: e.hi for e in admitted}
    return plan


def restart_penalty(f: Fairness, held: int, power: float) -> float:
    """What one resize costs a unit, in the plan's value units: its value at ``held`` nodes less its value when
    the restart's ``restart_s`` (measured, else ``restart_cost_s``) is lost from the ``remaining_s`` it has left
    (its normalized speed times L / (L + restart_s) over that horizon). The plan charges it per node away from
    ``held`` (``Entity.restart``), which keeps the solver exact (module docstring: "Restart cost")."""
    x = f.normalized_speed(held)
    left = max(f.remaining_s, 1.0)
    if x <= 0 or f.restart_s <= 0:
        return 0.0
    return fairness_value(x, power) - fairness_value(x * left / (left + f.restart_s), power)


def _linear(request: int) -> Callable[[int], float]:
    """A waiting job's normalized speed: nothing is measured before it runs, so linear in its nodes."""
    return lambda n: n / request


def shares(plan: Plan) -> dict[int, int]:
    """The waiting jobs the plan starts below their request: job id -> share."""
    return {j: n for j, n in plan.jobs.items() if n < plan.requests.get(j, n)}


__all__ = ["Entity", "Plan", "Waiting", "plan_partition", "restart_penalty", "shares", "water_fill"]
