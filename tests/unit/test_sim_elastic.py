"""The simulator's elastic mode through the production policy (slurm_elastic.sim.policy_adapter).

The smoke test runs one Pollux workload end to end (CLI contract and invariants); the small scenarios pin the
adapter's semantics (shrink-to-admit after the grace period, extension bookkeeping, bounds) on hand-built jobs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

import slurm_elastic.sim.policy_adapter as adapter
from slurm_elastic.cli import main
from slurm_elastic.errors import ConfigError
from slurm_elastic.policy import Decision, PolicyConfig, PolicyInput, parse_config
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.engine import JobRecord, SimResult, Simulation
from slurm_elastic.sim.errors import SimulationError
from slurm_elastic.sim.invariants import check_invariants
from slurm_elastic.sim.loaders import load_workload
from slurm_elastic.sim.metrics import slowdown
from slurm_elastic.sim.policy_adapter import AdapterSettings, ProductionPolicy, job_bounds, make_policy
from slurm_elastic.sim.run import compare
from slurm_elastic.sim.traces import traces_dir
from tests.policy_text import SIM_ADMIT, policy_text

from .simhelpers import LinearPerf, job

ROOT = Path(__file__).resolve().parents[2]
SIM_POLICY = ROOT / "bench" / "sim-policy.toml"
KEYS = {"avg_jct", "p50_jct", "p99_jct", "jct_std", "makespan", "avg_wait", "gpu_util", "starvation", "resizes",
        "jobs"}


def _workload() -> str:
    return str(traces_dir() / "pollux" / "workloads" / "workload-1.csv")


@pytest.fixture
def decide_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the adapter's calls of the production ``decide`` (and the decisions it returned)."""
    calls: list[int] = []
    real = adapter.decide

    def counting(inp: PolicyInput, cfg: PolicyConfig, now: datetime) -> list[Decision]:
        assert now.tzinfo is UTC
        out = real(inp, cfg, now)
        assert len(out) == len(inp.units)  # one decision per unit: the real policy answered
        calls.append(len(out))
        return out

    monkeypatch.setattr(adapter, "decide", counting)
    yield calls


def _peak_gpus(result: SimResult) -> int:
    edges = sorted([(u.end, -u.gpus) for u in result.usage] + [(u.start, u.gpus) for u in result.usage])
    held = peak = 0
    for _, delta in edges:
        held += delta
        peak = max(peak, held)
    return peak


def test_cli_json_has_both_columns_and_the_elastic_one_resizes() -> None:
    result = CliRunner().invoke(main, ["simulate", _workload(), "--format", "pollux", "--nodes", "16",
                                       "--gpus-per-node", "4", "--policy", str(SIM_POLICY), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert set(payload) == {"baseline", "elastic", "per_job"}
    for side in ("baseline", "elastic"):
        assert KEYS <= set(payload[side])
        assert payload[side]["jobs"] == 160
    elastic = payload["elastic"]
    assert elastic["resizes"] > 0 and payload["baseline"]["resizes"] == 0
    per_job = payload["per_job"]  # every job's elastic JCT against its rigid one (10-minute floor)
    assert per_job["jobs"] == 160 and per_job["floor_s"] == 600
    assert 0 < per_job["later"] < 1 and per_job["later_2"] <= per_job["later_125"] <= per_job["later"]
    assert per_job["worst"] > 1 and per_job["worst_job"]
    assert elastic["p50_jct"] <= elastic["p99_jct"] and 0 < elastic["gpu_util"] <= 1


def test_invariants_bounds_and_real_policy_calls(decide_calls: list[int]) -> None:
    workload = load_workload(_workload(), "pollux")
    config = SimConfig(16, 4)
    settings = AdapterSettings()
    policy = make_policy(SIM_POLICY, config, settings)
    result = compare(workload, config, seed=0, policy=policy).elastic  # raises if an invariant breaks
    assert result is not None
    assert check_invariants(result, 160) == []
    assert len(result.jobs) == 160 and not result.unfinished  # every job completes
    assert _peak_gpus(result) <= config.total_gpus
    # The policy ran every cycle through the production decide(), and its decisions reached the engine.
    assert len(decide_calls) == policy.calls > 100
    applied = [o for o in result.resizes if o.result == "applied"]
    assert applied and {o.message for o in applied} <= {"OVERUTILIZED", "UNDERUTILIZED", "SHRINK_TO_ADMIT",
                                                        "MOLDED_REGROW"}
    assert "SHRINK_TO_ADMIT" in {o.message for o in applied}
    # No job ever ran above the max or below the min its elastic unit was given.
    for record in result.jobs:
        lo, hi = job_bounds(settings, record.requested_gpus, record.nodes_seen[0], 4,
                            engine=(record.min_nodes, record.max_nodes))
        assert all(lo <= n <= hi for n in record.nodes_seen[1:]), (record.job_id, record.nodes_seen, lo, hi)


def test_same_seed_same_run() -> None:
    sacct = ROOT / "tests" / "fixtures" / "sacct" / "captured-22.05.8-parsable.txt"
    workload = load_workload(str(sacct), "sacct")  # parametric models: the seed matters
    config = SimConfig(4, 4)
    runs = [compare(workload, config, seed=7, policy=make_policy(SIM_POLICY, config)) for _ in range(2)]
    assert runs[0] == runs[1]
    first = compare(load_workload(_workload(), "pollux"), SimConfig(16, 4), seed=3,
                    policy=make_policy(None, SimConfig(16, 4)))
    assert first.elastic is not None and first.elastic.jobs


_SCENARIO = policy_text(SIM_ADMIT, scale_up_above=40)


def test_shrink_to_admit_waits_for_the_grace_period_then_admits() -> None:
    """A (50% busy, scale-up above 40%) grows onto the idle node; B arrives at 1000 and, once it has waited
    longer than A did (age priority 3 > 2, at 1140), A gives its extension node back after the 120 s grace
    period; B starts in that same cycle; A grows again after B ends."""
    config = SimConfig(2, 4, scheduler="fifo")
    jobs = [job("A", 0.0, 4), job("B", 1000.0, 4)]
    perf = {"A": LinearPerf(20_000.0, 4), "B": LinearPerf(600.0, 4)}
    policy = ProductionPolicy(parse_config(_SCENARIO), config)
    result = Simulation(config, jobs, perf, policy=policy).run()
    assert check_invariants(result, 2) == []
    steps = [(o.time, o.job_id, o.from_nodes, o.target_nodes, o.message) for o in result.resizes]
    assert steps == [
        (240.0, "A", 1, 2, "OVERUTILIZED"),
        (1260.0, "A", 2, 1, "SHRINK_TO_ADMIT"),
        (1920.0, "A", 1, 2, "OVERUTILIZED"),
    ]
    assert policy.actions == {"grow OVERUTILIZED": 2, "shrink SHRINK_TO_ADMIT": 1}  # what bench/ counts
    b = next(r for r in result.jobs if r.job_id == "B")
    assert b.start_time == 1260.0


def test_policy_file_errors_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "policy.toml"
    bad.write_text("version = 1\nscale_up_above = 10\nscale_down_below = 20\nshrink_to_admitt = true\n")
    result = CliRunner().invoke(main, ["simulate", _workload(), "--format", "pollux", "--nodes", "16",
                                       "--gpus-per-node", "4", "--policy", str(bad), "--json"])
    assert result.exit_code == 1
    assert "shrink_to_admitt: unknown key" in result.stderr and "did you mean 'shrink_to_admit'" in result.stderr


@pytest.mark.parametrize(
    ("settings", "gpus", "start_nodes", "engine", "expected"),
    [
        (AdapterSettings(), 6, 2, (1, 16), (1, 3)),  # 1.5 nodes asked: max ceil(3.0) = 3
        (AdapterSettings(), 32, 8, (1, 16), (1, 16)),
        (AdapterSettings(), 4, 4, (1, 16), (1, 4)),  # spread over 4 nodes: max is at least where it started
        (AdapterSettings(min_fraction=1.0), 24, 6, (1, 16), (6, 12)),
        (AdapterSettings(min_fraction=0.5, max_factor=1.0), 6, 2, (1, 16), (1, 2)),
        (AdapterSettings(max_factor=4.0), 48, 12, (2, 14), (2, 14)),  # within the engine's bounds
    ],
)
def test_job_bounds(settings: AdapterSettings, gpus: int, start_nodes: int, engine: tuple[int, int],
                    expected: tuple[int, int]) -> None:
    assert job_bounds(settings, gpus, start_nodes, 4, engine=engine) == expected


def test_one_policy_per_run_and_settings_are_checked() -> None:
    config = SimConfig(2, 4)
    policy = make_policy(None, config)
    jobs = [job("A", 0.0, 4)]
    Simulation(config, jobs, {"A": LinearPerf(300.0, 4)}, policy=policy).run()
    with pytest.raises(SimulationError, match="one run"):
        Simulation(config, jobs, {"A": LinearPerf(300.0, 4)}, policy=policy).run()
    with pytest.raises(ConfigError, match="min_fraction"):
        AdapterSettings(min_fraction=2.0)
    assert adapter.age_priority(59) == 1 and adapter.age_priority(120) == 3
    assert adapter.at(90.0) == datetime(2024, 1, 1, 0, 1, 30, tzinfo=UTC)


def test_cli_moldable_start_changes_only_the_elastic_column(tmp_path: Path) -> None:
    off = tmp_path / "off.toml"  # sim-policy.toml has moldable_start on (a packaged default): here it is off
    off.write_text(SIM_POLICY.read_text().replace("moldable_start = true", "moldable_start = false"))
    args = ["simulate", _workload(), "--format", "pollux", "--nodes", "16", "--gpus-per-node", "4",
            "--policy", str(off), "--json"]
    plain = CliRunner().invoke(main, args)
    molded = CliRunner().invoke(main, [*args, "--moldable-start"])
    assert plain.exit_code == 0 and molded.exit_code == 0, molded.output
    a, b = json.loads(plain.stdout), json.loads(molded.stdout)
    assert a["baseline"] == b["baseline"]  # rigid jobs never mold
    assert a["elastic"]["avg_jct"] != b["elastic"]["avg_jct"]


def test_per_job_slowdown_counts_each_job_against_its_own_rigid_run() -> None:
    def rec(job_id: str, jct: float) -> JobRecord:
        return JobRecord(job_id, 0.0, 4, 0.0, jct, 0, 1, 1, 4, (4,), (1,))

    config = SimConfig(1, 4)
    rigid = SimResult(config, (rec("a", 1000), rec("b", 100), rec("c", 2000), rec("d", 3000)), (), (), (), ())
    elastic = SimResult(config, (rec("a", 1300), rec("b", 500), rec("c", 4100), rec("d", 1000)), (), (), (), ())
    sd = slowdown(rigid, elastic)
    # b: 500 vs 100 is within the 10-minute floor (600 / 600); a: 1.3x; c: 2.05x; d: faster
    assert (sd.later, sd.later_125, sd.later_2) == (0.5, 0.5, 0.25)
    assert sd.worst == pytest.approx(2.05) and sd.worst_job == "c"
