"""Adaptive batch size: the efficiency model, the goodput-best plan, lr scaling, and the simulator's opted-in jobs."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic.batchsize import (
    AdaptiveState,
    BatchLimits,
    BatchModelError,
    GradNoiseEstimator,
    GradStats,
    LinearStepModel,
    choose_plan,
    goodput_at,
    local_batch_candidates,
    lr_factor,
)
from slurm_elastic.controller.hold_filter import BANDED_INPUTS, VOLATILE_INPUTS
from slurm_elastic.policy import Action, Basis, Decision, Reason, decide
from slurm_elastic.policy.inputs import PolicyInputBuilder, Sample, UnitMeasure
from slurm_elastic.sim.perfmodel.adaptive import AdaptiveBatchJobPerf
from slurm_elastic.sim.perfmodel.appdata import load_app
from slurm_elastic.sim.perfmodel.pollux import PolluxApplication, PolluxJobPerf
from slurm_elastic.sim.traces import pollux_app_dir, traces_dir
from tests.unit.policy_builders import NOW, cfg, job, make_input, nodes, tput, unit, util


def test_efficiency_is_pollux_formula() -> None:
    stats = GradStats(grad_sqr=2.0, grad_var=6.0, init_batch=128)  # noise scale 128 * 3 = 384 samples
    assert stats.noise_scale == pytest.approx(384.0)
    assert stats.efficiency(128) == pytest.approx(1.0)
    for m in (256, 1024, 4096):
        assert stats.efficiency(m) == pytest.approx((384 + 128) / (384 + m))
        # the gain of one step is efficiency x scale, AdaScale's (var + sqr) / (var / S + sqr)
        assert stats.gain(m) == pytest.approx((6 + 2) / (6 / (m / 128) + 2))
    assert stats.efficiency(256) > stats.efficiency(512) > stats.efficiency(1024)


def test_bad_statistics_and_limits_are_refused() -> None:
    with pytest.raises(BatchModelError, match="grad_sqr"):
        GradStats(grad_sqr=0.0, grad_var=1.0, init_batch=8)
    with pytest.raises(BatchModelError, match="grad_var"):
        GradStats(grad_sqr=1.0, grad_var=math.nan, init_batch=8)
    with pytest.raises(BatchModelError, match="init_batch"):
        BatchLimits(init_batch=64, max_batch=32, max_local_batch=8)
    with pytest.raises(BatchModelError, match="local"):
        BatchLimits(init_batch=8, max_batch=32, max_local_batch=4, min_local_batch=5)
    with pytest.raises(BatchModelError, match="lr rule"):
        lr_factor("linear", 64, None, 32)


def test_candidates_cover_the_range_geometrically() -> None:
    c = local_batch_candidates(BatchLimits(init_batch=8, max_batch=4096, max_local_batch=256, min_local_batch=4))
    assert c[0] == 4 and c[-1] == 256 and list(c) == sorted(set(c))
    assert 8 in c and 16 in c and 128 in c


LIMITS = BatchLimits(init_batch=64, max_batch=4096, max_local_batch=128, min_local_batch=8)


def test_noisy_gradients_and_costly_sync_choose_a_larger_batch() -> None:
    """Large noise scale: big batches stay efficient, so the plan amortizes the all-reduce over more samples;
    small noise scale: the plan stays near the initial batch."""
    step = LinearStepModel(compute_s_per_sample=0.001, sync_s_per_node=0.05, gpus_per_node=4)
    noisy = choose_plan(16, GradStats(1.0, 200.0, 64), LIMITS, step)  # noise scale 12,800 samples
    clean = choose_plan(16, GradStats(1.0, 0.1, 64), LIMITS, step)  # noise scale 6.4 samples
    assert noisy is not None and clean is not None
    assert noisy.global_batch > 4 * clean.global_batch
    assert clean.global_batch <= 2 * 16 * LIMITS.min_local_batch  # near the smallest batch 16 GPUs can run
    for plan in (noisy, clean):
        assert plan.global_batch == 16 * plan.local_batch * (plan.accum_steps + 1)
        assert LIMITS.min_local_batch <= plan.local_batch <= LIMITS.max_local_batch
        assert plan.global_batch <= LIMITS.max_batch
        assert plan.goodput == pytest.approx(plan.throughput * plan.efficiency)


def test_plan_is_the_goodput_maximum_over_every_choice() -> None:
    step = LinearStepModel(compute_s_per_sample=0.002, sync_s_per_node=0.03, gpus_per_node=4, overhead_s=0.01)
    stats = GradStats(1.0, 20.0, 64)
    plan = choose_plan(8, stats, LIMITS, step, candidates=range(1, 129))
    assert plan is not None
    best = 0.0
    for b in range(LIMITS.min_local_batch, LIMITS.max_local_batch + 1):
        for a in range(65):
            m = 8 * b * (a + 1)
            t = step(8, b, a)
            if LIMITS.init_batch <= m <= LIMITS.max_batch and t:
                best = max(best, m / t * stats.efficiency(m))
    assert plan.goodput == pytest.approx(best)


def test_memory_limit_forces_accumulation() -> None:
    """Two nodes, a slow all-reduce, per-GPU limit 128 and a noise scale of 6,400 samples: more samples per
    all-reduce pay, and beyond 128 per GPU only accumulation gives them."""
    step = LinearStepModel(compute_s_per_sample=0.001, sync_s_per_node=0.5, gpus_per_node=4, overhead_s=0.01)
    plan = choose_plan(8, GradStats(1.0, 100.0, 64), LIMITS, step)
    assert plan is not None and plan.local_batch == 128 and plan.accum_steps >= 1
    # with a free all-reduce the same job does not accumulate (it only would lose efficiency)
    free = choose_plan(8, GradStats(1.0, 100.0, 64), LIMITS, LinearStepModel(0.001, 0.0, 4))
    assert free is not None and free.accum_steps == 0


def test_no_plan_when_the_replicas_can_not_fit_max_batch() -> None:
    step = LinearStepModel(compute_s_per_sample=0.001, sync_s_per_node=0.0, gpus_per_node=4)
    assert choose_plan(1024, GradStats(1.0, 1.0, 64), LIMITS, step) is None
    with pytest.raises(BatchModelError):
        choose_plan(0, None, LIMITS, step)


def test_without_statistics_the_plan_keeps_the_initial_batch() -> None:
    step = LinearStepModel(compute_s_per_sample=0.001, sync_s_per_node=0.05, gpus_per_node=4)
    plan = choose_plan(4, None, LIMITS, step)
    assert plan is not None and plan.global_batch == 64 and plan.efficiency == 1.0


def test_lr_factor_sqrt_and_adascale() -> None:
    stats = GradStats(1.0, 3.0, 64)
    assert lr_factor("sqrt", 256, stats, 64) == pytest.approx(2.0)
    assert lr_factor("adascale", 256, stats, 64) == pytest.approx(stats.gain(256))
    assert 1.0 < lr_factor("adascale", 256, stats, 64) < 4.0  # between no scaling and linear scaling
    assert lr_factor("adascale", 256, None, 64) == pytest.approx(2.0)  # no statistics yet: sqrt


# --- the simulator's opted-in jobs ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cifar10() -> PolluxApplication:
    return PolluxApplication(load_app(pollux_app_dir(traces_dir(), "cifar10")))


def test_adaptive_job_runs_at_least_as_fast_as_the_fixed_batch_where_it_is_valid(cifar10: PolluxApplication) -> None:
    fixed = PolluxJobPerf(cifar10, 512)
    adaptive = AdaptiveBatchJobPerf(cifar10, 512)
    for shape in ((4,), (4, 4), (4, 4, 4, 4)):
        for epoch in (0, 30, 90):
            plan = adaptive.plan(shape, epoch)
            assert plan.replicas == sum(shape)
            assert cifar10.init_batch_size <= plan.global_batch <= cifar10.max_batch_size
            assert adaptive.rate(shape, epoch) > 0.9 * fixed.rate(shape, epoch)
    # growing from 4 to 16 GPUs pays more with the batch co-adapted than at the fixed batch
    late = 90
    assert (adaptive.rate((4, 4, 4, 4), late) / adaptive.rate((4,), late)
            > fixed.rate((4, 4, 4, 4), late) / fixed.rate((4,), late))


def test_adaptive_job_publishes_goodput_and_grows_its_batch_with_the_noise(cifar10: PolluxApplication) -> None:
    adaptive = AdaptiveBatchJobPerf(cifar10, 512)
    early, late = adaptive.plan((4, 4), 0), adaptive.plan((4, 4), 90)
    assert adaptive.stats(90).noise_scale > adaptive.stats(0).noise_scale  # gradients get noisier
    assert late.global_batch >= early.global_batch
    assert adaptive.throughput((4, 4), 90) == pytest.approx(late.goodput)
    assert 0.0 < adaptive.utilization((4, 4), 90) <= 1.0
    assert adaptive.max_gpus >= 16


# --- the job-side library ---------------------------------------------------------------------------------------
def test_job_reads_a_plan_for_its_size_from_what_it_published(tmp_path: Path) -> None:
    from slurm_elastic import goodput

    path = str(tmp_path / ".slurm-elastic" / "gradstats-7.jsonl")
    assert goodput.batch_plan(1, 4, path=path) is None  # nothing written: keep your own batch
    assert goodput.opt_in(init_batch=64, max_batch=4096, max_local_batch=128, min_local_batch=8,
                          lr_rule="adascale", path=path, at=100.0)
    first = goodput.batch_plan(2, 4, path=path)
    assert first is not None and first.basis == "initial batch" and first.global_batch == 64
    assert first.local_batch == 8 and first.accum_steps == 0 and first.lr_factor == pytest.approx(1.0)
    # a noisy job measured at 2 nodes: 1 ms per sample, the all-reduce 0.2 s (0.1 s per node)
    stats = GradStats(grad_sqr=1.0, grad_var=100.0, init_batch=64)
    assert goodput.publish_grad_stats(stats, nodes=2, gpus_per_node=4, local_batch=8, accum_steps=0,
                                      compute_s=0.008, step_s=0.208, path=path, at=101.0)
    with open(path, "ab") as handle:
        handle.write(b"not json\n{\"grad_sqr\": \"x\"}\n{\"time\": 1")  # skipped; a half-written line is ignored
    small, big = goodput.batch_plan(2, 4, path=path), goodput.batch_plan(4, 4, path=path)
    assert small is not None and big is not None and small.basis == big.basis == "goodput"
    model = LinearStepModel(0.001, 0.1, 4)
    for size, got in ((2, small), (4, big)):
        want = choose_plan(size * 4, stats, BatchLimits(64, 4096, 128, 8), model)
        assert want is not None
        assert (got.local_batch, got.accum_steps, got.global_batch) == (want.local_batch, want.accum_steps,
                                                                        want.global_batch)
        assert got.lr_factor == pytest.approx(stats.gain(got.global_batch))  # adascale
    assert small.global_batch > 64  # noisy gradients and a costly all-reduce: a larger batch pays


def test_publish_refuses_bad_timings_and_works_outside_slurm(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_elastic import goodput

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_ELASTIC_PARENT", raising=False)
    monkeypatch.delenv(goodput.ENV_GRADSTATS_FILE, raising=False)
    stats = GradStats(1.0, 1.0, 64)
    assert not goodput.opt_in(init_batch=64, max_batch=128, max_local_batch=64)  # nowhere to write
    path = str(tmp_path / "g.jsonl")
    assert not goodput.publish_grad_stats(stats, nodes=1, gpus_per_node=1, local_batch=8, accum_steps=0,
                                          compute_s=0.5, step_s=0.4, path=path)  # step shorter than compute
    with pytest.raises(ValueError):
        goodput.opt_in(init_batch=64, max_batch=128, max_local_batch=64, lr_rule="linear", path=path)


def test_noise_estimator_recovers_the_statistics() -> None:
    """Norms with the expectations of the model (|G_B|^2 = |G|^2 + S / B) give back |G|^2 and S exactly."""
    true_sqr, per_sample_var = 2.0, 400.0
    est = GradNoiseEstimator(init_batch=32)
    assert est.stats() is None
    for _ in range(5):
        est.update(true_sqr + per_sample_var / 16, 16, true_sqr + per_sample_var / 64, 64)
    stats = est.stats()
    assert stats is not None
    assert stats.grad_sqr == pytest.approx(true_sqr)
    assert stats.grad_var == pytest.approx(per_sample_var / 32)
    assert stats.noise_scale == pytest.approx(per_sample_var / true_sqr)
    with pytest.raises(BatchModelError):
        est.update(1.0, 64, 1.0, 64)


# --- the policy ranks opted-in units by the goodput model -------------------------------------------------------
def _state(var: float, sync_per_node: float) -> AdaptiveState:
    return AdaptiveState(LIMITS, "sqrt", GradStats(1.0, var, 64), LinearStepModel(0.001, sync_per_node, 4))


def _policy_decide(states: dict[int, AdaptiveState | None], free: int = 1, **kw: Any) -> dict[int, Decision]:
    busy = [f"n{i + 1}" for i in range(len(states))]
    us = [unit(job(jid, nodes=(busy[i],), time_limit_min=600, priority=1000), max_nodes=4)
          for i, jid in enumerate(states)]
    utils = [replace(util(jid, 92, restart=60.0), adaptive=st) for jid, st in states.items()]
    inp = make_input(us, nodes(len(busy) + free, busy=busy), utils=utils)
    kw.setdefault("speedup_growth", True)
    return {d.unit_id: d for d in decide(inp, cfg(**kw), NOW)}


def test_policy_gives_the_spare_node_to_the_larger_goodput_gain() -> None:
    """Same utilization; the noisy job with a costly all-reduce gains more goodput from a second node (its batch
    grows with it) than the clean one, whatever the unit ids say."""
    for noisy, clean in ((100, 101), (101, 100)):
        got = _policy_decide({noisy: _state(200.0, 0.005), clean: _state(0.1, 0.005)}
                             if noisy < clean else {clean: _state(0.1, 0.005), noisy: _state(200.0, 0.005)})
        d = got[noisy]
        assert (d.action, d.reason, d.basis) == (Action.GROW, Reason.SPEEDUP_GAIN, Basis.THROUGHPUT)
        assert d.inputs["speedup_source"] == "goodput model"
        state = _state(200.0, 0.005)
        now, nxt = goodput_at(state, 1, 4), goodput_at(state, 2, 4)
        assert now is not None and nxt is not None
        assert d.inputs["next_speedup"] == pytest.approx(round(nxt.goodput / now.goodput, 3))
        assert (d.inputs["batch_now"], d.inputs["batch_next"]) == (now.global_batch, nxt.global_batch)
        assert d.inputs["noise_scale"] == pytest.approx(64 * 200.0)
        assert got[clean].action is Action.HOLD


def test_without_statistics_the_policy_falls_back_to_the_other_sources() -> None:
    no_stats = AdaptiveState(LIMITS, "sqrt", None, None)
    d = _policy_decide({100: no_stats})[100]
    assert d.inputs["speedup_source"] == "utilization model" and "batch_next" not in d.inputs


def test_adaptive_state_reaches_the_policy_only_where_goodput_is_used() -> None:
    u = unit(job(100))
    measure = UnitMeasure(4, 4, adaptive=_state(1.0, 0.0))
    samples = {100: [Sample(NOW - timedelta(seconds=s), 50.0, 50.0) for s in range(0, 300, 30)]}
    for on in (True, False):
        builder = PolicyInputBuilder(cfg(speedup_growth=on), NOW, 30)
        got = builder.build(make_input([u], nodes(2, busy=["n1"])).snapshot, [u], samples=samples,
                            measures={100: measure}).utilization[100]
        assert (got.adaptive is not None) is on


def test_hold_filter_bands_or_skips_the_adaptive_inputs() -> None:
    assert {"noise_scale", "goodput_now", "goodput_next"} <= VOLATILE_INPUTS
    assert {"batch_efficiency_now", "batch_efficiency_next"} <= set(BANDED_INPUTS)


def test_a_measured_next_size_wins_over_the_goodput_model() -> None:
    busy = ("n1",)
    u = unit(job(100, nodes=busy, time_limit_min=600), max_nodes=4)
    samples = tput(1, 100.0) + tput(2, 110.0, age=3000)  # it ran at 2 nodes before: barely faster
    inp = make_input([u], nodes(3, busy=busy),
                     utils=[replace(util(100, 92, throughput=samples), adaptive=_state(200.0, 0.005))])
    (d,) = decide(inp, cfg(speedup_growth=True), NOW)
    assert (d.action, d.reason) == (Action.HOLD, Reason.LOW_SPEEDUP_GAIN)
    assert d.inputs["speedup_source"] == "throughput" and "batch_next" not in d.inputs


# --- the controller reads the job's file for the policy ---------------------------------------------------------
def test_controller_reads_the_published_state_safely(tmp_path: Path) -> None:
    import os
    import pwd

    from slurm_elastic import goodput
    from slurm_elastic.controller.gradstats import GradStatsReader

    me = pwd.getpwuid(os.geteuid()).pw_name
    u = unit(replace(job(7, nodes=("n1",), user=me), working_dir=str(tmp_path)))
    reader = GradStatsReader()
    path = reader.path_for(u)
    assert path == str(tmp_path / ".slurm-elastic" / "gradstats-7.jsonl")
    assert reader.read_unit(u, NOW, 4) is None  # no file
    at = NOW.timestamp() - 60
    goodput.opt_in(init_batch=64, max_batch=4096, max_local_batch=128, min_local_batch=8, path=path, at=at)
    state = reader.read_unit(u, NOW, 4)
    assert state is not None and state.stats is None and state.limits.max_batch == 4096
    goodput.publish_grad_stats(GradStats(1.0, 200.0, 64), nodes=2, gpus_per_node=4, local_batch=16,
                               accum_steps=0, compute_s=0.016, step_s=0.026, path=path, at=at + 1)
    state = reader.read_unit(u, NOW, 4)
    assert state is not None and state.stats is not None and state.stats.noise_scale == pytest.approx(12800)
    assert state.step_model is not None and state.step_model.gpus_per_node == 4
    assert state.step_model.compute_s_per_sample == pytest.approx(0.001)
    assert state.step_model.sync_s_per_node == pytest.approx(0.005)
    # someone else's file (here: a symlink to it) is refused, never read
    os.remove(path)
    os.symlink(tmp_path / "elsewhere", path)
    (tmp_path / "elsewhere").write_text('{"time": 1, "opt_in": {}}\n')
    assert reader.read_unit(u, NOW, 4) is None
