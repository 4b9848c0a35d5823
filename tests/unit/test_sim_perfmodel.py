"""The performance models: the artifact's Pollux model on the shared traces, and the parametric model."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from slurm_elastic.sim.errors import PerfModelError
from slurm_elastic.sim.perfmodel.appdata import load_app
from slurm_elastic.sim.perfmodel.fit import fit_all
from slurm_elastic.sim.perfmodel.parametric import ParametricJobPerf, SpeedupParams, draw_params
from slurm_elastic.sim.perfmodel.pollux import PolluxApplication, PolluxJobPerf
from slurm_elastic.sim.perfmodel.speedup_table import SPEEDUP_TABLE
from slurm_elastic.sim.perfmodel.throughput import canonical_placement
from slurm_elastic.sim.traces import pollux_app_dir, traces_dir


@pytest.fixture(scope="module")
def root() -> Path:
    return traces_dir()


@pytest.fixture(scope="module")
def cifar10(root: Path) -> PolluxApplication:
    return PolluxApplication(load_app(pollux_app_dir(root, "cifar10")))


@pytest.fixture(scope="module")
def ncf(root: Path) -> PolluxApplication:
    return PolluxApplication(load_app(pollux_app_dir(root, "ncf")))


def test_placements_are_named_by_their_smallest_rotation() -> None:
    assert canonical_placement((4, 2)) == (2, 4)
    assert canonical_placement((4, 1, 2)) == (1, 2, 4)
    assert canonical_placement((4, 2, 1)) == (1, 4, 2)  # a rotation, not a sort
    assert canonical_placement((0, 3, 0)) == (3,)


def test_application_constants(cifar10: PolluxApplication, ncf: PolluxApplication) -> None:
    assert (cifar10.init_batch_size, cifar10.max_batch_size, cifar10.max_epochs) == (128, 4096, 100)
    assert (cifar10.min_local_bsz, cifar10.max_local_bsz) == (32, 1024)
    # Epoch 0 ends at the smallest progress of row 0 over the validation files.
    assert cifar10.epoch_end(0) == min(rows[0].progress for rows in cifar10.validation.values())
    assert ncf.max_epochs == 10


def test_local_batch_rules(cifar10: PolluxApplication, ncf: PolluxApplication) -> None:
    # 4096 over 6 GPUs: ceil gives 683, capped so that 6 x atomic <= 4096.
    assert cifar10.local_config(6, 4096) == (682, 0)
    # A single GPU above the initial batch always accumulates at least once (the artifact's rule).
    assert ncf.local_config(1, 32768) == (16384, 1)
    assert cifar10.local_config(2, 4096) == (1024, 1)


def test_measured_step_times_are_looked_up_and_interpolated(cifar10: PolluxApplication) -> None:
    # placements.csv: "4,32,0.05821514129638672,0.01432212142944336" and "4,45,0.0626768...,0.0095896..."
    step, sync = cifar10.table.lookup((4,), 32)
    assert (step, sync) == (0.05821514129638672, 0.01432212142944336)
    mid, _ = cifar10.table.lookup((4,), 38.5)
    assert mid == pytest.approx((0.05821514129638672 + 0.06267681121826171) / 2)
    assert cifar10.table.lookup((2, 4), 100) == cifar10.table.lookup((4, 2), 100)
    with pytest.raises(PerfModelError, match="measured for local batch"):
        cifar10.table.lookup((4,), 5000)


def test_unmeasured_placements_are_interpolated_from_scalability(cifar10: PolluxApplication) -> None:
    step, sync = cifar10.table.lookup((4, 4, 4, 4, 4, 4), 128)  # 6 nodes: only scalability.csv covers it
    assert 0 < sync < step < 1.0
    with pytest.raises(PerfModelError, match="no measurement near"):
        cifar10.table.lookup(tuple([4] * 16) + (4, 4, 4, 4), 32)  # 80 GPUs: beyond the measured hull


def test_job_rate_gain_and_utilization(cifar10: PolluxApplication) -> None:
    perf = PolluxJobPerf(cifar10, 2048)
    step, sync = cifar10.table.lookup((4, 4), 256)
    grad_sqr, grad_var = cifar10.grad_stats(2048, 0)
    scale = 2048 / 128
    gain = (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)
    assert perf.rate((4, 4), 0) == pytest.approx(gain / step)
    assert perf.utilization((4, 4)) == pytest.approx((step - sync) / step)
    assert perf.max_gpus == 64
    # Spreading the same 8 GPUs over 8 nodes changes the measured step time.
    assert perf.rate((1,) * 8, 0) != perf.rate((4, 4), 0)


def test_grad_stats_interpolate_between_validated_batches(cifar10: PolluxApplication) -> None:
    lo, hi = cifar10.grad_stats(1024, 3), cifar10.grad_stats(2048, 3)
    mid = cifar10.grad_stats(1536, 3)
    assert mid == pytest.approx(((lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2))
    with pytest.raises(PerfModelError, match="outside the validated"):
        cifar10.grad_stats(8192, 0)


def test_parametric_job_runs_its_trace_duration_at_its_trace_size() -> None:
    params = SpeedupParams("x@1", c0=0.1, c1=0.9, a_r=0.01, b_r=0.001, a_n=0.05, b_n=0.002)
    perf = ParametricJobPerf(params, duration=3600.0, ref_gpus=8, gpus_per_node=4)
    assert perf.rate((4, 4), 0) == pytest.approx(1 / 3600.0)
    # Crossing nodes is slower than staying on one (only the bottleneck link counts, not how many nodes);
    # more GPUs are faster here; utilization is compute / step.
    assert perf.rate((2, 2), 0) < perf.rate((4,), 0)
    assert perf.rate((2, 2, 2, 2), 0) == perf.rate((4, 4), 0) < perf.rate((4, 4, 4, 4), 0)
    assert perf.utilization((4, 4)) == pytest.approx(
        params.compute_time(8) / (params.compute_time(8) + params.sync_time(8, 2))
    )
    assert perf.utilization((1,)) == 1.0


def test_parameter_draws_are_seeded() -> None:
    first = [draw_params(SPEEDUP_TABLE, rng).source for rng in [random.Random(7)] for _ in range(20)]
    again = [draw_params(SPEEDUP_TABLE, rng).source for rng in [random.Random(7)] for _ in range(20)]
    assert first == again
    assert len(set(first)) > 1


def test_stored_speedup_table_matches_a_fresh_fit(root: Path) -> None:
    fresh = fit_all(root)
    assert [p.source for p in fresh] == [p.source for p in SPEEDUP_TABLE]
    for new, old in zip(fresh, SPEEDUP_TABLE, strict=True):
        for name in ("c0", "c1", "a_r", "b_r", "a_n", "b_n"):
            assert getattr(new, name) == pytest.approx(getattr(old, name), rel=1e-6, abs=1e-9), (
                old.source,
                name,
            )
