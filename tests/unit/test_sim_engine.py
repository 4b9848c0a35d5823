"""Engine semantics on hand-built jobs with a linear-speedup model: timing, schedulers, the elastic hook."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from slurm_elastic.sim.cluster import Cluster
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.elastic import ElasticPolicy, ResizeRequest, SimClusterState
from slurm_elastic.sim.engine import SimResult, Simulation, UsageInterval
from slurm_elastic.sim.errors import WorkloadError
from slurm_elastic.sim.invariants import check_invariants
from slurm_elastic.sim.metrics import percentile_lower, summarize, time_weighted
from slurm_elastic.sim.perfmodel.base import JobPerf
from slurm_elastic.sim.run import compare
from slurm_elastic.sim.scheduler import SchedulerKind
from slurm_elastic.sim.workload import JobSpec, Workload

from .simhelpers import LinearPerf, job


def _run(config: SimConfig, specs: Sequence[tuple[str, float, int, float]],
         policy: ElasticPolicy | None = None) -> SimResult:
    jobs = [job(j, t, g) for j, t, g, _ in specs]
    perf: dict[str, JobPerf] = {j: LinearPerf(runtime=r, gpus=g) for j, _, g, r in specs}
    result = Simulation(config, jobs, perf, policy=policy).run()
    assert check_invariants(result, len(jobs)) == []
    return result


def _starts(result: SimResult) -> dict[str, float]:
    return {r.job_id: r.start_time for r in result.jobs}


# One 4-GPU node. J2 (4 GPUs) is blocked behind J1; J3 is short, J4 is long.
_QUEUE = [("J1", 0.0, 2, 600.0), ("J2", 10.0, 4, 600.0), ("J3", 20.0, 2, 300.0), ("J4", 30.0, 2, 1200.0)]


@pytest.mark.parametrize(
    ("scheduler", "starts"),
    [
        ("fifo", {"J1": 60, "J2": 660, "J3": 1260, "J4": 1260}),
        ("greedy", {"J1": 60, "J3": 60, "J4": 360, "J2": 1560}),
        ("backfill", {"J1": 60, "J3": 60, "J2": 660, "J4": 1260}),
    ],
)
def test_schedulers_start_jobs_at_cycles(scheduler: SchedulerKind, starts: dict[str, float]) -> None:
    config = SimConfig(1, 4, scheduler=scheduler, start_delay=0.0)
    assert _starts(_run(config, _QUEUE)) == starts


def test_completion_time_includes_start_delay_and_is_exact() -> None:
    result = _run(SimConfig(1, 4, scheduler="fifo", start_delay=30.0), [("A", 5.0, 4, 1000.0)])
    (record,) = result.jobs
    assert (record.start_time, record.end_time, record.jct) == (60.0, 1090.0, 1085.0)
    # 30 s restarting (idle) then 1000 s at 50% utilization on 4 GPUs.
    metrics = summarize(result)
    assert metrics.makespan == 1085.0
    assert metrics.gpu_util == pytest.approx(4 * 1030 / (4 * 1085))
    assert metrics.effective_gpu_util == pytest.approx(4 * 0.5 * 1000 / (4 * 1085))


def test_spread_placement_uses_most_free_nodes_first() -> None:
    # Two 4-GPU nodes: A takes 3 GPUs of node 0; B (3 GPUs) goes to node 1 (4 free) rather than splitting.
    result = _run(SimConfig(2, 4, scheduler="fifo"), [("A", 0.0, 3, 100.0), ("B", 0.0, 3, 100.0)])
    assert all(r.nodes_seen == (1,) for r in result.jobs)
    # With 6 GPUs asked on an empty cluster the job gets 4 + 2.
    result = _run(SimConfig(2, 4, scheduler="fifo"), [("C", 0.0, 6, 100.0)])
    assert result.jobs[0].nodes_seen == (2,)


def test_job_larger_than_cluster_is_rejected() -> None:
    with pytest.raises(WorkloadError, match="asks for 16 GPUs"):
        Simulation(SimConfig(2, 4), [job("X", 0.0, 16)], {"X": LinearPerf(100.0, 16)})


def test_runs_are_deterministic() -> None:
    config = SimConfig(1, 4, scheduler="backfill")
    assert _run(config, _QUEUE) == _run(config, _QUEUE)


class ScriptedPolicy:
    """Test double: returns the requests scripted for each cycle time and records every snapshot."""

    def __init__(self, script: dict[float, list[ResizeRequest]]) -> None:
        self.script = script
        self.snapshots: list[SimClusterState] = []

    def __call__(self, snapshot: SimClusterState, now: float) -> Sequence[ResizeRequest]:
        self.snapshots.append(snapshot)
        return self.script.get(now, [])


def test_grow_adds_whole_free_nodes_and_costs_progress() -> None:
    policy = ScriptedPolicy({120.0: [ResizeRequest("A", 2, "test grow")]})
    result = _run(SimConfig(2, 4, scheduler="fifo", resize_cost=60.0), [("A", 0.0, 4, 1200.0)], policy)
    (record,) = result.jobs
    # Starts at 60, computes from 90; at 120 it has done 30/1200; the grow costs 60 s; then twice as fast.
    assert record.end_time == pytest.approx(180 + (1 - 30 / 1200) * 600)
    assert (record.resizes, record.gpus_seen, record.nodes_seen) == (1, (4, 8), (1, 2))
    assert [o.code for o in result.resizes] == ["applied"]
    # The agent-visible utilization is 0 while (re)starting and the model's value afterwards.
    views = {s.now: s.jobs[0] for s in policy.snapshots if s.jobs}
    assert views[120.0].gpu_util == 0.5 and views[120.0].num_nodes == 1
    assert views[180.0].gpu_util == 0.5 and views[180.0].num_gpus == 8
    assert views[60.0].state == "PENDING"


def test_shrink_applies_before_admission() -> None:
    policy = ScriptedPolicy({120.0: [ResizeRequest("A", 2)], 300.0: [ResizeRequest("A", 1, "make room")]})
    specs = [("A", 0.0, 4, 5000.0), ("B", 250.0, 4, 100.0)]
    result = _run(SimConfig(2, 4, scheduler="fifo"), specs, policy)
    starts = _starts(result)
    assert starts["B"] == 300.0  # admitted in the same cycle as the shrink freed node 1
    a = next(r for r in result.jobs if r.job_id == "A")
    assert a.nodes_seen == (1, 2, 1)


def test_engine_rejects_invalid_requests_without_clamping() -> None:
    policy = ScriptedPolicy(
        {
            60.0: [ResizeRequest("A", 2)],  # A is still pending at this cycle's snapshot
            120.0: [
                ResizeRequest("A", 3),  # the cluster has 2 nodes
                ResizeRequest("nope", 1),
            ],
            180.0: [ResizeRequest("A", 2), ResizeRequest("A", 1)],  # B holds node 1: no whole free node
        }
    )
    specs = [("A", 0.0, 4, 1000.0), ("B", 0.0, 2, 1000.0)]
    result = _run(SimConfig(2, 4, scheduler="fifo"), specs, policy)
    codes = [(o.time, o.job_id, o.code) for o in result.resizes]
    assert codes == [
        (60.0, "A", "not_running"),
        (120.0, "A", "out_of_bounds"),
        (120.0, "nope", "unknown_job"),
        (180.0, "A", "duplicate"),
        (180.0, "A", "no_free_nodes"),
    ]
    assert all(r.resizes == 0 for r in result.jobs)


def test_grow_beyond_model_limit_is_rejected() -> None:
    policy = ScriptedPolicy({120.0: [ResizeRequest("A", 2)]})
    jobs = [job("A", 0.0, 4)]
    perf: dict[str, JobPerf] = {"A": LinearPerf(runtime=600.0, gpus=4, limit=6)}
    result = Simulation(SimConfig(2, 4), jobs, perf, policy=policy).run()
    assert [o.code for o in result.resizes] == ["model_range"]


def test_invariant_checker_reports_violations() -> None:
    result = _run(SimConfig(1, 4, scheduler="fifo"), _QUEUE)
    assert check_invariants(result, 4) == []
    overfull = replace(result, usage=(*result.usage, UsageInterval(0, 100.0, 200.0, 4, 0.0)))
    assert any("GPUs in use" in p for p in check_invariants(overfull, 4))
    missing = replace(result, jobs=result.jobs[1:], unfinished=("J1",))
    assert any("never completed" in p for p in check_invariants(missing, 4))
    resized = replace(result, jobs=(replace(result.jobs[0], gpus_seen=(3,)), *result.jobs[1:]))
    assert any("rigid job" in p for p in check_invariants(resized, 4))


def test_percentile_is_the_lower_one() -> None:
    values = list(range(1, 161))  # 160 values: index floor(0.99 * 159) = 157
    assert percentile_lower(values, 99) == 158
    assert percentile_lower(values, 50) == 80


def test_pack_placement_best_fits_and_takes_whole_nodes() -> None:
    cluster = Cluster(3, 4)
    cluster.take(((0, 1), (1, 3)))  # free: node0 3, node1 1, node2 4
    assert cluster.place(1, "pack") == ((1, 1),)  # the fullest node that still fits
    assert cluster.place(3, "pack") == ((0, 3),)
    assert cluster.place(5, "pack") == ((2, 4), (1, 1))  # a whole free node, then best fit
    assert cluster.place(1, "spread") == ((2, 1),)  # the artifact's rule: most free first


def test_an_arrival_gets_the_next_cycle_even_when_a_later_one_is_armed() -> None:
    # Backfill arms a cycle at J1's expected end (t=1080); J3 arriving at t=200 must not wait for it:
    # it fits beside J1 and ends long before the head job's (J2's) reservation.
    specs = [("J1", 0.0, 4, 1000.0), ("J2", 10.0, 8, 100.0), ("J3", 200.0, 2, 100.0)]
    starts = _starts(_run(SimConfig(2, 4, scheduler="backfill", start_delay=0.0), specs))
    assert starts == {"J1": 60.0, "J3": 240.0, "J2": 1080.0}


def test_compare_runs_the_elastic_mode_on_the_same_seeded_models() -> None:
    workload = Workload(
        source="test",
        jobs=(
            JobSpec("a", 0.0, 4, duration=3600.0),
            JobSpec("b", 30.0, 8, duration=1800.0),
            JobSpec("c", 90.0, 2, duration=600.0),
        ),
    )
    hold = ScriptedPolicy({})  # never resizes: the elastic run must equal the baseline
    result = compare(workload, SimConfig(2, 4), seed=3, policy=hold)
    assert result.elastic is not None and result.elastic.jobs == result.baseline.jobs
    assert len(hold.snapshots) > 0
    assert compare(workload, SimConfig(2, 4), seed=3).elastic is None
    # Parametric jobs run their trace duration at their trace size (+ the 30 s start cost) when placed packed.
    a = next(r for r in result.baseline.jobs if r.job_id == "a")
    assert a.end_time - a.start_time == pytest.approx(3630.0)


def test_moldable_start_starts_a_waiting_job_now_on_the_free_whole_nodes() -> None:
    # Three 4-GPU nodes; A holds one for long. B asks for 3 nodes: rigid it waits for A, moldable it starts at
    # once on the 2 free nodes, with its time limit scaled by 3/2; C (one node) then waits for B or A.
    specs = [("A", 0.0, 4, 5000.0), ("B", 10.0, 12, 1200.0), ("C", 20.0, 4, 100.0)]
    rigid = _run(SimConfig(3, 4, scheduler="fifo", start_delay=0.0), specs, ScriptedPolicy({}))
    assert _starts(rigid)["B"] == 5100.0  # A ends at 5060, the next cycle is at 5100
    config = SimConfig(3, 4, scheduler="fifo", start_delay=0.0, moldable_start=True)
    policy = ScriptedPolicy({})
    molded = _run(config, specs, policy)
    b = next(r for r in molded.jobs if r.job_id == "B")
    assert (b.start_time, b.gpus_seen, b.nodes_seen, b.molded) == (60.0, (8,), (2,), True)
    assert b.end_time == pytest.approx(60 + 1800)  # linear scaling: 2/3 of the speed
    views = {s.now: {j.job_id: j for j in s.jobs} for s in policy.snapshots}
    assert views[120.0]["B"].time_limit == pytest.approx(1.5 * 1200)
    assert _starts(molded)["C"] > 60.0
    # Without a policy (rigid runs) nothing is molded, whatever the setting.
    assert _starts(_run(config, specs))["B"] > 5000.0


def test_invariants_reject_a_molded_start_at_or_above_the_request() -> None:
    config = SimConfig(3, 4, scheduler="fifo", start_delay=0.0, moldable_start=True)
    result = _run(config, [("A", 0.0, 4, 5000.0), ("B", 10.0, 12, 1200.0)], ScriptedPolicy({}))
    b = next(r for r in result.jobs if r.job_id == "B")
    bad = replace(result, jobs=tuple(replace(r, gpus_seen=(12,)) if r is b else r for r in result.jobs))
    assert any("molded job B" in p for p in check_invariants(bad, 2))


def test_a_policy_whose_config_has_moldable_start_on_molds_without_the_sim_switch() -> None:
    # the key the controller reads switches the simulator too (a production policy exposes it)
    specs = [("A", 0.0, 4, 5000.0), ("B", 10.0, 12, 1200.0)]
    policy = ScriptedPolicy({})
    policy.moldable_start = True  # type: ignore[attr-defined]
    molded = _run(SimConfig(3, 4, scheduler="fifo", start_delay=0.0), specs, policy)
    assert next(r for r in molded.jobs if r.job_id == "B").molded
    plain = _run(SimConfig(3, 4, scheduler="fifo", start_delay=0.0), specs, ScriptedPolicy({}))
    assert not next(r for r in plain.jobs if r.job_id == "B").molded


def test_the_production_policy_exposes_its_moldable_start_key() -> None:
    from slurm_elastic.policy import config_from_mapping
    from slurm_elastic.sim.policy_adapter import ProductionPolicy

    sim = SimConfig(3, 4)
    on = config_from_mapping({"version": 1, "moldable_start": True}, "<test>")
    off = config_from_mapping({"version": 1, "moldable_start": False}, "<test>")
    assert ProductionPolicy(on, sim).moldable_start and not ProductionPolicy(off, sim).moldable_start


def test_stranded_gpus_are_sampled_and_averaged_over_the_makespan() -> None:
    # J1 holds 2 of the node's 4 GPUs from 60 to 660; J2 waits for all 4: the other 2 are stranded meanwhile.
    result = _run(SimConfig(1, 4, scheduler="fifo", start_delay=0.0), [("J1", 0.0, 2, 600.0), ("J2", 10.0, 4, 600.0)])
    assert [s for s in result.stranded if s[1]] == [(60.0, 2, 2)]
    metrics = summarize(result)
    assert metrics.makespan == 1260.0
    assert metrics.stranded_gpus == pytest.approx(2 * 600 / 1260)
    assert metrics.partial_free_gpus == pytest.approx(2 * 600 / 1260)


def test_free_gpus_a_waiting_job_fits_are_not_stranded() -> None:
    # J3 (4 GPUs) blocks J4 (1 GPU) under FIFO, so from 60 to 660 J4 waits and could use the 2 GPUs J1 leaves
    # free: partly used, not stranded. Once J4 runs alone (1260..1320) nobody waits: its 3 free GPUs are stranded.
    result = _run(SimConfig(1, 4, scheduler="fifo", start_delay=0.0),
                  [("J1", 0.0, 2, 600.0), ("J3", 10.0, 4, 600.0), ("J4", 20.0, 1, 60.0)])
    assert [s for s in result.stranded if s[1]] == [(60.0, 2, 0), (1260.0, 3, 3)]
    metrics = summarize(result)
    assert metrics.partial_free_gpus == pytest.approx((2 * 600 + 3 * 60) / 1320)
    assert metrics.stranded_gpus == pytest.approx(3 * 60 / 1320)


def test_time_weighted_mean_of_a_step_function() -> None:
    assert time_weighted([(10.0, 2), (30.0, 0)], 1, 0.0, 40.0) == pytest.approx(2 * 20 / 40)
    assert time_weighted([(-5.0, 4), (50.0, 0)], 1, 0.0, 40.0) == pytest.approx(4.0)
    assert time_weighted([], 1, 0.0, 40.0) == 0.0
    assert time_weighted([(0.0, 3)], 1, 5.0, 5.0) == 0.0
