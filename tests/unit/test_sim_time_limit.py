"""The simulator applies a shrink's time-limit extension (extend_time_limit_on_shrink) to the simulated job, so
the policy (and backfill) see the new limit, as on a real cluster after ``scontrol update TimeLimit=``."""

from __future__ import annotations

import math
import sys
from datetime import datetime

import pytest

import slurm_elastic.sim.policy_adapter as adapter
from slurm_elastic.policy import Action, Decision, PolicyConfig, PolicyInput, decide, parse_config
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.elastic import ResizeRequest, SimClusterState
from slurm_elastic.sim.engine import Simulation
from slurm_elastic.sim.invariants import check_invariants
from tests.policy_text import SIM_ADMIT, policy_text

from .simhelpers import LinearPerf, job

_SCENARIO = policy_text(SIM_ADMIT, scale_up_above=90)


def _run(monkeypatch: pytest.MonkeyPatch, extra: str, grows: list[Decision] | None = None) -> tuple[
        list[Decision], dict[float, float], list[int]]:
    """A starts on both nodes (8 GPUs); B (4 GPUs) arrives at 1000 and takes one of them by shrink-to-admit.

    Returns A's shrink decisions, A's time limit as the engine shows it at each cycle, and the time limits (in
    minutes) the policy saw for A; the grow decisions go to ``grows`` when given."""
    shrinks: list[Decision] = []
    seen_min: list[int] = []

    def spy(inp: PolicyInput, cfg: PolicyConfig, now: datetime) -> list[Decision]:
        seen_min.extend(u.job.time_limit_min or 0 for u in inp.units if u.job.name == "A")
        out = decide(inp, cfg, now)
        shrinks.extend(d for d in out if d.action is Action.SHRINK)
        if grows is not None:
            grows.extend(d for d in out if d.action is Action.GROW)
        return out

    monkeypatch.setattr(adapter, "decide", spy)
    config = SimConfig(2, 4, scheduler="fifo")
    policy = adapter.ProductionPolicy(parse_config(_SCENARIO + extra), config)
    limits: dict[float, float] = {}

    def watching(snapshot: SimClusterState, now: float) -> list[ResizeRequest]:
        for view in snapshot.jobs:
            if view.job_id == "A" and view.state == "RUNNING" and view.time_limit is not None:
                limits[now] = view.time_limit
        return list(policy(snapshot, now))

    jobs = [job("A", 0.0, 8), job("B", 1000.0, 4)]
    perf = {"A": LinearPerf(20_000.0, 8), "B": LinearPerf(600.0, 4)}
    result = Simulation(config, jobs, perf, policy=watching).run()
    assert check_invariants(result, 2) == []
    assert [(o.job_id, o.from_nodes, o.target_nodes) for o in result.resizes][:1] == [("A", 2, 1)]
    return shrinks, limits, seen_min


def test_the_shrunk_job_gets_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    shrinks, limits, seen_min = _run(monkeypatch, "")
    d = shrinks[0]
    assert d.shrink is not None and (d.current_nodes, d.target_nodes) == (2, 1)
    remaining = float(str(d.inputs["remaining_s"]))
    add = d.shrink.time_limit_add_s
    assert add == math.ceil(remaining / 60) * 60 > 0  # remaining x (2/1 - 1), whole minutes
    before, after = min(limits.values()), max(limits.values())
    assert after - before == add
    assert max(seen_min) == math.ceil(after / 60) and min(seen_min) == math.ceil(before / 60)


def test_no_extension_when_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    shrinks, limits, _ = _run(monkeypatch, "extend_time_limit_on_shrink = false\n")
    assert shrinks and all(d.shrink is not None and d.shrink.time_limit_add_s == 0 for d in shrinks)
    assert len(set(limits.values())) == 1


def test_the_regrown_job_gives_the_extension_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once B is done, A (busy enough with scale_up_above 30) grows back to 2 nodes: its limit drops by the
    grow's give-back, at most what the shrink added, so it ends no lower than where it started."""
    monkeypatch.setattr(sys.modules[__name__], "_SCENARIO", policy_text(SIM_ADMIT, scale_up_above=30))
    grows: list[Decision] = []
    shrinks, limits, _ = _run(monkeypatch, "", grows)
    (g,) = grows
    assert g.grow is not None and (g.current_nodes, g.target_nodes) == (1, 2)
    added = shrinks[0].shrink.time_limit_add_s if shrinks[0].shrink is not None else 0
    assert 0 < g.grow.time_limit_sub_s <= added
    timeline = [limits[t] for t in sorted(limits)]
    start, peak, end = timeline[0], max(timeline), timeline[-1]
    assert peak - start == added and peak - end == g.grow.time_limit_sub_s and end >= start
