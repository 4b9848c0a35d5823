"""The allocator's round plan (policy/plan.py): exact water-filling, and a moldable arrival at a share."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

from slurm_elastic.policy import decide
from slurm_elastic.policy.fairness import fairness_value
from slurm_elastic.policy.plan import Entity, Waiting, plan_partition, water_fill
from tests.unit.policy_builders import NOW, cfg, job, make_input, node, pending, unit, util

POWER = -0.5


def _objective(sizes: tuple[int, ...], speeds: list[list[float]]) -> float:
    return sum(fairness_value(s[n], POWER) for s, n in zip(speeds, sizes, strict=True))


def test_water_filling_matches_brute_force_on_separable_concave_values() -> None:
    """Random concave speed curves (falling increments), box bounds, one budget: greedy by marginal gain
    reaches the brute-force optimum of sum x**p/p (the exchange argument in plan.py's docstring)."""
    rng = random.Random(7)
    for _ in range(60):
        speeds: list[list[float]] = []
        bounds: list[tuple[int, int]] = []
        for _ in range(rng.randint(2, 4)):
            steps = sorted((rng.uniform(0.05, 1.0) for _ in range(6)), reverse=True)
            speeds.append([0.0, *itertools.accumulate(steps)])
            lo = rng.randint(1, 2)
            bounds.append((lo, rng.randint(lo, 6)))
        budget = rng.randint(0, 8)
        entities = [Entity((0, i), lo, hi, (lambda n, s=s: s[n]), size=lo)
                    for i, ((lo, hi), s) in enumerate(zip(bounds, speeds, strict=True))]
        left = water_fill(entities, budget, POWER)
        got = tuple(e.size for e in entities)
        assert sum(got) - sum(lo for lo, _ in bounds) == budget - left
        best = max(
            (c for c in itertools.product(*(range(lo, hi + 1) for lo, hi in bounds))
             if sum(c) - sum(lo for lo, _ in bounds) <= budget),
            key=lambda c: _objective(c, speeds))
        assert _objective(got, speeds) >= _objective(best, speeds) - 1e-9, (got, best)


def test_a_moldable_arrival_gets_a_share_taken_evenly_from_three_equal_units() -> None:
    """Three units of four nodes at their request, no free node; a moldable arrival asks for four (min one). The
    plan gives it what equalizes normalized goodput: three nodes, one from each unit; a rigid one of four
    would get its whole request."""
    units = [Entity((0, u), 1, 4, (lambda n: n / 4), held=4) for u in (100, 101, 102)]
    plan = plan_partition(units, [Waiting(900, 1, 4)], 0, POWER)
    assert plan.jobs == {900: 3} and plan.units == {100: 3, 101: 3, 102: 3}
    units = [Entity((0, u), 1, 4, (lambda n: n / 4), held=4) for u in (100, 101, 102)]
    rigid = plan_partition(units, [Waiting(900, 4, 4)], 0, POWER)
    assert rigid.jobs == {} and sorted(rigid.units.values()) == [2, 3, 3]  # admitted at its request


def _three() -> list:  # type: ignore[type-arg]
    return [unit(job(uid, nodes=tuple(f"n{i}" for i in range(first, first + 4)), priority=10))
            for uid, first in ((100, 1), (101, 5), (102, 9))]


def test_decide_admits_a_moldable_arrival_by_one_node_from_each_of_three_units() -> None:
    units = _three()
    nodes = [node(f"n{i}", used=4) for i in range(1, 13)]
    arrival = pending(900, count=4, priority=100)
    utils = [util(u.unit_id, 100) for u in units]
    inp = make_input(units, nodes, pending_jobs=[arrival], utils=utils)
    molded = replace(inp, pending_min_nodes={900: 1})
    c = cfg(shrink_to_admit=True, allocator=True, fairness_max_rho=3.0)
    got = {d.unit_id: d for d in decide(molded, c, NOW)}
    assert [got[u].target_nodes for u in (100, 101, 102)] == [3, 3, 3]
    assert all(got[u].shrink is not None and got[u].shrink.admits == (900,) for u in (100, 101, 102))
    assert [got[u].inputs["plan_nodes"] for u in (100, 101, 102)] == [3, 3, 3]
    # not moldable (no min known): the arrival needs its four nodes, so some unit gives two
    whole = {d.unit_id: d for d in decide(inp, c, NOW)}
    assert sorted(whole[u].target_nodes for u in (100, 101, 102)) == [2, 3, 3]
    # the allocator off: the rule walk, no plan
    walk = {d.unit_id: d for d in decide(molded, cfg(shrink_to_admit=True), NOW)}
    assert "plan_nodes" not in walk[100].inputs


def _sharing(priority_a: int, *, allocator: bool = True) -> dict:  # type: ignore[type-arg]
    """Three units at two GPUs per node share four 4-GPU nodes (A n1-n3, B n2-n4, C n1,n4: every node full); an
    arrival needs two GPUs on each of two nodes. A shrink gives back a unit's last node."""
    units = [unit(job(uid, nodes=names, gpus=2, priority=prio))
             for uid, names, prio in ((100, ("n1", "n2", "n3"), priority_a), (101, ("n2", "n3", "n4"), 10),
                                      (102, ("n1", "n4"), 10))]
    inp = make_input(units, [node(f"n{i}", used=4) for i in range(1, 5)],
                     pending_jobs=[pending(900, count=2, gpus=2, priority=100)],
                     utils=[util(u.unit_id, 60) for u in units])
    c = cfg(shrink_to_admit=True, allocator=True, fairness_max_rho=3.0) if allocator else cfg(shrink_to_admit=True)
    return {d.unit_id: d for d in decide(inp, c, NOW)}


def test_units_sharing_nodes_admit_an_arrival_by_one_node_each_from_the_two_that_free_different_nodes() -> None:
    got = _sharing(10)
    assert [got[u].target_nodes for u in (100, 101, 102)] == [2, 2, 2]
    assert got[100].shrink is not None and got[100].shrink.released_nodes == ("n3",)
    assert got[101].shrink is not None and got[101].shrink.released_nodes == ("n4",)
    walk = _sharing(10, allocator=False)  # the rule walk strips its first victim of both nodes instead
    assert [walk[u].target_nodes for u in (100, 101, 102)] == [1, 3, 2]


def test_a_node_two_victims_would_free_counts_once_for_the_arrival() -> None:
    """A outranks the arrival, so only B and C may give, and both would give n4: one place for the arrival, not
    two. Nobody shrinks (the arrival would still not fit)."""
    got = _sharing(1000)
    assert [got[u].target_nodes for u in (100, 101, 102)] == [3, 3, 2]
    assert all(got[u].shrink is None for u in (100, 101, 102))


def test_water_filling_with_restart_costs_matches_brute_force() -> None:
    """Each entity also pays ``restart`` per node away from what it holds (policy/plan.py, "Restart cost"):
    still separable concave, so greedy by marginal gain (stopping at a negative one) reaches the brute-force
    optimum of sum(x**p/p - restart * |n - held|), nodes left free included."""
    rng = random.Random(11)
    for _ in range(60):
        speeds: list[list[float]] = []
        bounds: list[tuple[int, int, int, float]] = []  # lo, hi, held, restart
        for _ in range(rng.randint(2, 4)):
            steps = sorted((rng.uniform(0.05, 1.0) for _ in range(6)), reverse=True)
            speeds.append([0.0, *itertools.accumulate(steps)])
            lo = rng.randint(1, 2)
            hi = rng.randint(lo, 6)
            bounds.append((lo, hi, rng.randint(lo, hi), rng.choice((0.0, rng.uniform(0.0, 0.3)))))
        budget = rng.randint(0, 8)
        entities = [Entity((0, i), lo, hi, (lambda n, s=s: s[n]), size=lo, held=held, restart=c)
                    for i, ((lo, hi, held, c), s) in enumerate(zip(bounds, speeds, strict=True))]

        def objective(sizes: tuple[int, ...], speeds: list[list[float]] = speeds,
                      bounds: list[tuple[int, int, int, float]] = bounds) -> float:
            return _objective(sizes, speeds) - sum(c * abs(n - held) for n, (_, _, held, c) in
                                                   zip(sizes, bounds, strict=True))

        water_fill(entities, budget, POWER)
        got = tuple(e.size for e in entities)
        assert sum(got) - sum(b[0] for b in bounds) <= budget
        best = max((c for c in itertools.product(*(range(lo, hi + 1) for lo, hi, _, _ in bounds))
                    if sum(c) - sum(b[0] for b in bounds) <= budget), key=objective)
        assert objective(got) >= objective(best) - 1e-9, (got, best, bounds)


def test_a_plan_that_would_move_one_node_between_two_units_leaves_both_when_the_gain_is_below_the_restarts() -> None:
    """Hysteresis: V holds three nodes and may give one, G holds two and asks for a third; G's third node is
    worth a little more than V's. Without restart costs the plan moves the node (two restarts for a small gain);
    with them each unit pays its restart per node moved, and both stay as they are."""
    def entities(restart: float) -> list[Entity]:
        return [Entity((0, 1), 2, 3, (lambda n: n / 3), held=3, restart=restart),
                Entity((0, 2), 2, 3, (lambda n: n / 4), held=2, restart=restart)]

    moved = plan_partition(entities(0.0), [], 0, POWER)
    assert moved.units == {1: 2, 2: 3}
    kept = plan_partition(entities(0.05), [], 0, POWER)
    assert kept.units == {1: 3, 2: 2}
