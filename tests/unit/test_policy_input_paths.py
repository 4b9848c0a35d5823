"""The controller and the simulator build the same policy input from the same facts (policy/inputs.py).

A short run of the simulator's adapter is recorded: what Slurm would have shown each cycle (the snapshot the
adapter builds) and what the agents would have reported (its utilization samples). The recording is replayed
through the real controller -- a replaying Slurm, agents answering with the recorded values, a SQLite store,
its own journal -- and every cycle's ``PolicyInput`` must equal the simulator's: units, window of samples,
history, the shrink in its grace period (in progress), everything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import pytest

import slurm_elastic.controller.cycle as cycle
import slurm_elastic.sim.policy_adapter as adapter
from slurm_elastic.agent.payload import JobReport, NodeReport, NvmlInfo
from slurm_elastic.controller.collect import CollectResult
from slurm_elastic.controller.config import ControllerConfig
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.policy import (
    Action,
    Decision,
    PolicyConfig,
    PolicyInput,
    Reason,
    ThroughputSample,
    decide,
    parse_config,
)
from slurm_elastic.policy.inputs import PolicyInputBuilder, Sample, UnitMeasure, window_start
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.elastic import JobView, NodeView, SimClusterState
from slurm_elastic.sim.policy_adapter import AdapterSettings, ProductionPolicy, at
from slurm_elastic.slurm.model import ClusterSnapshot as SlurmSnapshot
from tests.policy_text import UNIT, policy_text
from tests.unit.policy_builders import job as policy_job
from tests.unit.policy_builders import unit as policy_unit
from tests.unit.storehelpers import FakeClock, memory_store

INTERVAL = 30.0
GPUS = 4
POLICY = parse_config(policy_text(UNIT, window_s=120, scale_down_below=40, scale_up_above=80, shrink_to_admit=False,
                                  cooldown_s=300, grace_s=90, max_metric_age_s=120))
SCRIPT = "#!/bin/bash\n#ELASTIC --min-nodes 1 --max-nodes 2\nsrun train\n"
#: Per cycle, the GPU utilization of job a (2 nodes, idles: shrunk at the fifth cycle) and b (1 node, in band).
UTIL_A = (0.25, 0.125, 0.375, 0.25, 0.125, 0.25, 0.375)
UTIL_B = (0.5, 0.625, 0.75, 0.5, 0.625, 0.75, 0.5)


def _view(job_id: str, nodes: tuple[int, ...], util: float) -> JobView:
    return JobView(job_id=job_id, state="RUNNING", submit_time=0.0, start_time=0.0, requested_gpus=GPUS * len(nodes),
                   num_nodes=len(nodes), num_gpus=GPUS * len(nodes), nodes=nodes, gpus_per_node=(GPUS,) * len(nodes),
                   min_nodes=1, max_nodes=2, gpu_util=util, throughput=100.0 * len(nodes), progress=0.1, resizes=0,
                   last_resize_time=None, restarting_until=None, account="nlp")


def _cluster(now: float, util_a: float, util_b: float) -> SimClusterState:
    waiting = JobView(job_id="c", state="PENDING", submit_time=0.0, start_time=None, requested_gpus=2 * GPUS,
                      num_nodes=0, num_gpus=0, nodes=(), gpus_per_node=(), min_nodes=1, max_nodes=2, gpu_util=0.0,
                      throughput=0.0, progress=0.0, resizes=0, last_resize_time=None, restarting_until=None,
                      account="nlp")
    jobs = (_view("a", (0, 1), util_a), _view("b", (2,), util_b), waiting)
    holders = {0: ("a",), 1: ("a",), 2: ("b",), 3: ()}
    nodes = tuple(NodeView(i, GPUS, 0 if holders[i] else GPUS, holders[i]) for i in range(4))
    return SimClusterState(now=now, gpus_per_node=GPUS, total_gpus=4 * GPUS, free_gpus=GPUS, nodes=nodes, jobs=jobs)


@dataclass
class Recorder:
    """Wraps ``decide``: keeps every input (and the decisions) it was called with."""

    inputs: list[PolicyInput] = field(default_factory=list)
    decisions: list[list[Decision]] = field(default_factory=list)

    def __call__(self, inp: PolicyInput, cfg: PolicyConfig, now: datetime) -> list[Decision]:
        self.inputs.append(inp)
        self.decisions.append(decide(inp, cfg, now))
        return self.decisions[-1]


@dataclass(frozen=True)
class Recording:
    """One simulated run: per cycle, the time, the Slurm snapshot and each Slurm job's utilization (percent)."""

    times: tuple[float, ...]
    snapshots: tuple[SlurmSnapshot, ...]
    util: tuple[Mapping[int, float], ...]
    gpus_in_use: tuple[Mapping[int, int], ...]
    sim: Recorder


def record_run(monkeypatch: pytest.MonkeyPatch, cfg: PolicyConfig, cluster: Callable[[int, float], SimClusterState],
               util_a: Sequence[float], util_b: Sequence[float]) -> Recording:
    """A run of the simulator's adapter under ``cfg``: at cycle ``i`` (time ``now``) it sees ``cluster(i, now)``,
    in which job a (2 nodes) runs at ``util_a[i]`` and b (1 node) at ``util_b[i]``."""
    rec = Recorder()
    monkeypatch.setattr(adapter, "decide", rec)
    policy = ProductionPolicy(cfg, SimConfig(num_nodes=4, gpus_per_node=GPUS, interval=INTERVAL, start_delay=0.0),
                              AdapterSettings())
    times = tuple(INTERVAL * (i + 1) for i in range(len(util_a)))
    for i, now in enumerate(times):
        policy(cluster(i, now), now)
    ids = {trace: policy._ids[trace] for trace in ("a", "b")}  # the Slurm ids the adapter gave the trace jobs
    util = tuple({ids["a"]: 100.0 * ua, ids["b"]: 100.0 * ub} for ua, ub in zip(util_a, util_b, strict=True))
    in_use = tuple({ids["a"]: round(2 * GPUS * ua), ids["b"]: round(GPUS * ub)}
                   for ua, ub in zip(util_a, util_b, strict=True))
    return Recording(times, tuple(i.snapshot for i in rec.inputs), util, in_use, rec)


def _record(monkeypatch: pytest.MonkeyPatch) -> Recording:
    return record_run(monkeypatch, POLICY, lambda i, now: _cluster(now, UTIL_A[i], UTIL_B[i]), UTIL_A, UTIL_B)


class ReplaySlurm:
    """Slurm as recorded: each cycle's snapshot, the jobs' batch scripts; a grace signal is only noted."""

    def __init__(self, rec: Recording, clock: Callable[[], datetime]) -> None:
        self.by_time = {s.taken_at: s for s in rec.snapshots}
        self.clock = clock
        self.calls: list[tuple[str, Any]] = []

    def snapshot(self) -> SlurmSnapshot:
        return self.by_time[self.clock()]

    def batch_script(self, job_id: int) -> str:
        return SCRIPT

    def signal(self, job_id: int, signal: str, *, batch_only: bool = False) -> None:
        self.calls.append(("signal", (job_id, signal)))


class ReplayAgents:
    """Every node reports the recorded utilization of the job on it, sampled at the cycle's time."""

    def __init__(self, rec: Recording, clock: Callable[[], datetime]) -> None:
        self.rec = rec
        self.clock = clock

    def __call__(self, agents: Mapping[str, str]) -> CollectResult:
        now = self.clock()
        cycle_no = [at(t) for t in self.rec.times].index(now)
        snap = self.rec.snapshots[cycle_no]
        reports = {}
        for node in agents:
            jobs = []
            for j in snap.jobs:
                if node in j.nodes:
                    util = self.rec.util[cycle_no][j.job_id]
                    total, k = self.rec.gpus_in_use[cycle_no][j.job_id], j.nodes.index(node)
                    in_use = total // len(j.nodes) + (1 if k < total % len(j.nodes) else 0)
                    jobs.append(JobReport(
                        job_id=j.job_id, sluid=None, user=j.user, account=j.account, uid=None, devices=(),
                        gpus_allocated=GPUS, gpus_in_use=in_use, util_mean_percent=util, util_max_percent=util,
                        util_last_percent=util, utilization_reason=None, memory_used_mib=0, memory_max_mib=0,
                        sample_count=30, util_sample_count=30, first_sample_at=now.timestamp() - INTERVAL,
                        last_sample_at=now.timestamp()))
            reports[node] = NodeReport(node=node, agent_version="t", generated_at=now.timestamp(),
                                       sampled_at=now.timestamp(), interval_s=1.0, window_s=INTERVAL,
                                       nvml=NvmlInfo("ok", None, None), gpus=(), jobs=tuple(jobs), errors=())
        return CollectResult(reports=reports, errors={})


def _replay(rec: Recording, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    ctl_rec = Recorder()
    monkeypatch.setattr(cycle, "decide", ctl_rec)
    clock = FakeClock(at(rec.times[0]))
    store = memory_store(clock)
    ctl = Controller(ControllerConfig(interval_s=INTERVAL, holder="test"), POLICY, slurm=ReplaySlurm(rec, clock),
                     store=store, collector=ReplayAgents(rec, clock), clock=clock)
    for i, _ in enumerate(rec.times):
        summary = ctl.run_cycle()
        assert summary.error is None and summary.skipped is None, summary
        if i + 1 < len(rec.times):
            clock.advance(INTERVAL)
    return ctl_rec


def test_one_recorded_cycle_gives_the_same_policy_input_in_the_controller_and_the_simulator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _record(monkeypatch)
    ctl = _replay(rec, monkeypatch)
    assert len(ctl.inputs) == len(rec.sim.inputs) == len(rec.times)
    for i, (mine, sims) in enumerate(zip(ctl.inputs, rec.sim.inputs, strict=True)):
        assert mine == sims, f"cycle {i}: the controller's and the simulator's policy inputs differ"
    # The recording covers what matters: a filled window, a shrink decided, then in progress with its history.
    shrink_at = next(i for i, ds in enumerate(rec.sim.decisions) if any(d.action is Action.SHRINK for d in ds))
    assert shrink_at < len(rec.times) - 1
    assert [d.reason for d in ctl.decisions[shrink_at] if d.action is Action.SHRINK] == [Reason.UNDERUTILIZED]
    last = rec.sim.inputs[-1]
    assert last.in_progress and last.in_progress[0].kind == "shrink" and last.history
    # samples of window_s + 2 cycles: 120 s + 60 s -> 7 samples, one per 30 s cycle
    assert {u.samples for u in last.utilization.values()} == {7}


def test_the_window_reaches_two_cycles_back_and_goodput_only_where_the_settings_use_it() -> None:
    now = at(600)
    assert window_start(now, 120, 30) == now - timedelta(seconds=180)
    unit = policy_unit(policy_job(7, nodes=("n1",)))
    samples = [Sample(now - timedelta(seconds=s), float(s), float(s)) for s in (210, 180, 150, 30, 0)]
    off = PolicyInputBuilder(POLICY, now, 30.0)
    inp = off.build(_empty_snapshot(now), [unit], samples={unit.unit_id: samples},
                    measures={unit.unit_id: _measure()})
    util = inp.utilization[unit.unit_id]
    assert (util.samples, util.window_s, util.mean_util, util.max_util) == (4, 180.0, 90.0, 180.0)
    assert util.throughput == () and util.restart_s is None  # goodput and restart cost are off
    on = PolicyInputBuilder(parse_config("version = 1\nwindow_s = 120\nrestart_cost_aware = true\n"), now, 30.0)
    util = on.build(_empty_snapshot(now), [unit], samples={unit.unit_id: samples},
                    measures={unit.unit_id: _measure()}).utilization[unit.unit_id]
    assert util.restart_s == 42.0 and len(util.throughput) == 1
    assert on.reads(unit).goodput and not off.reads(unit).goodput


def _empty_snapshot(now: datetime) -> SlurmSnapshot:
    return SlurmSnapshot(taken_at=now, jobs=(), nodes=(), partitions=())


def _measure() -> UnitMeasure:
    return UnitMeasure(4, 2, (ThroughputSample(at(0), 1, 10.0),), 42.0)


def test_the_builder_puts_facts_in_one_order(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _record(monkeypatch)
    last = rec.sim.inputs[-1]
    builder = PolicyInputBuilder(POLICY, last.snapshot.taken_at, INTERVAL)
    samples: dict[int, Sequence[Sample]] = {}
    again = builder.build(last.snapshot, reversed(last.units), samples=samples, history=reversed(last.history),
                          in_progress=reversed(last.in_progress))
    assert again == replace(last, utilization={})
