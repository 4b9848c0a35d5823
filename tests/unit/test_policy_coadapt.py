"""Batch size in the plan: opted-in units are valued by goodput at the batch they would use."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_elastic.batchsize import AdaptiveState, BatchLimits, GradStats, LinearStepModel, goodput_at
from slurm_elastic.policy import Action, ElasticUnit, JobUtilization, Reason, decide
from slurm_elastic.policy.coadapt import coadapted, goodput_curve
from slurm_elastic.policy.fairness import SpeedModel, finish_fairness
from tests.unit.policy_builders import NOW, cfg, job, make_input, node, pending, unit, util

LIMITS = BatchLimits(init_batch=64, max_batch=4096, max_local_batch=128, min_local_batch=8)
STEP = LinearStepModel(compute_s_per_sample=0.001, sync_s_per_node=0.05, gpus_per_node=4)
#: a tiny gradient noise scale: a larger batch barely helps, so goodput hardly grows with nodes
FLAT = AdaptiveState(LIMITS, "sqrt", GradStats(1.0, 0.01, 64), STEP)
#: a large one: a larger batch is nearly as efficient, so goodput scales with nodes
STEEP = AdaptiveState(LIMITS, "sqrt", GradStats(1.0, 1000.0, 64), LinearStepModel(0.001, 0.0, 4))


def _four(uid: int, first: int) -> ElasticUnit:
    return unit(job(uid, nodes=tuple(f"n{i}" for i in range(first, first + 4)), priority=10))


def test_the_curve_is_the_goodput_of_the_best_batch_plan_at_each_size() -> None:
    u = replace(util(1, 95, gpus=8), adaptive=STEEP)
    curve = goodput_curve(u, 2, 5)
    assert [n for n, _ in curve] == [1, 2, 3, 4, 5]
    for n, g in curve:
        plan = goodput_at(STEEP, n, 4)
        assert plan is not None and g == pytest.approx(plan.goodput)
    assert curve[-1][1] > curve[0][1] * 3  # a large noise scale: the batch grows with the GPUs
    flat = goodput_curve(replace(util(1, 95, gpus=8), adaptive=FLAT), 2, 5)
    assert flat[-1][1] < flat[0][1] * 2  # a tiny one: most of what more GPUs add is lost to efficiency


def test_no_curve_without_opt_in_statistics_or_a_step_time_fit() -> None:
    assert goodput_curve(util(1, 95), 2, 4) == ()
    assert goodput_curve(replace(util(1, 95), adaptive=replace(STEEP, stats=None)), 2, 4) == ()
    assert goodput_curve(replace(util(1, 95), adaptive=replace(STEEP, step_model=None)), 2, 4) == ()


def test_coadapted_values_other_sizes_by_goodput_and_keeps_rho_now_measured() -> None:
    u = _four(100, 1)
    measured = finish_fairness(u, SpeedModel(base=4, util=1.0), NOW, restart_s=60.0)
    assert measured is not None
    f, used = coadapted(measured, replace(util(100, 95, gpus=16), adaptive=FLAT), 4)
    assert used
    assert (f.rho, f.rigid_jct_s, f.projected_jct_s) == (measured.rho, measured.rigid_jct_s, measured.projected_jct_s)
    g = dict(goodput_curve(replace(util(100, 95, gpus=16), adaptive=FLAT), 4, 4))
    assert f.normalized_speed(3) == pytest.approx(g[3] / g[4])
    assert f.rho_at(3) < measured.rho_at(3)  # at the batch it then uses, a node fewer costs it less than linear
    same, used = coadapted(measured, util(100, 95, gpus=16), 4)
    assert not used and same is measured


def test_the_arrival_takes_the_node_from_the_unit_that_loses_least_goodput() -> None:
    units = [_four(100, 1), _four(101, 5)]  # equal but for unit 101's adaptive batch
    all_nodes = [node(f"n{i}", used=4) for i in range(1, 9)]
    arrival = [pending(900, count=1, priority=100)]
    plain = [util(100, 100, gpus=16), util(101, 100, gpus=16)]
    opted = [plain[0], replace(plain[1], adaptive=FLAT)]

    def run(utils: list[JobUtilization]) -> dict[int, int]:
        inp = make_input(units, all_nodes, pending_jobs=arrival, utils=utils)
        got = {d.unit_id: d for d in decide(inp, cfg(shrink_to_admit=True, allocator=True), NOW)}
        for d in got.values():
            assert d.action is Action.HOLD or (d.action, d.reason) == (Action.SHRINK, Reason.SHRINK_TO_ADMIT)
        return {uid: d.target_nodes for uid, d in got.items()}

    assert run(plain) == {100: 3, 101: 4}  # both linear: the tie leaves the lowest unit id smaller
    assert run(opted) == {100: 4, 101: 3}  # its last node adds little goodput at the batch it then uses
    inp = make_input(units, all_nodes, pending_jobs=arrival, utils=opted)
    d = {d.unit_id: d for d in decide(inp, cfg(shrink_to_admit=True, allocator=True), NOW)}[101]
    assert d.inputs["plan_speed_source"] == "goodput model (co-adapted batch)"
    assert d.inputs["speed_source"] == "utilization model"
