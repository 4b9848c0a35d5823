"""Smoke test of ``slurm-elastic simulate`` on one Pollux workload: output schema and invariants."""

from __future__ import annotations

import json
import random
from pathlib import Path

from click.testing import CliRunner

from slurm_elastic.cli import main
from slurm_elastic.cli.simulate_cmd import ELASTIC_UNAVAILABLE
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.engine import Simulation
from slurm_elastic.sim.invariants import check_invariants
from slurm_elastic.sim.loaders import load_workload
from slurm_elastic.sim.perfmodel.factory import build_models
from slurm_elastic.sim.traces import traces_dir

KEYS = {
    "avg_jct",
    "p50_jct",
    "p99_jct",
    "jct_std",
    "makespan",
    "avg_wait",
    "gpu_util",
    "starvation",
    "resizes",
    "jobs",
}
SACCT = Path(__file__).resolve().parents[1] / "fixtures" / "sacct" / "captured-22.05.8-parsable.txt"


def _workload() -> str:
    return str(traces_dir() / "pollux" / "workloads" / "workload-1.csv")


def test_json_output_schema() -> None:
    result = CliRunner().invoke(
        main,
        ["simulate", _workload(), "--format", "pollux", "--nodes", "16", "--gpus-per-node", "4", "--json"],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert set(payload) == {"baseline", "elastic", "per_job"}
    assert payload["elastic"] is not None and KEYS <= set(payload["elastic"])  # the packaged policy defaults
    assert ELASTIC_UNAVAILABLE not in result.stderr
    baseline = payload["baseline"]
    assert KEYS <= set(baseline)
    assert baseline["jobs"] == 160 and baseline["resizes"] == 0
    assert 0 < baseline["gpu_util"] <= 1 and 0 < baseline["effective_gpu_util"] <= baseline["gpu_util"]
    assert baseline["p50_jct"] <= baseline["p99_jct"] and baseline["avg_wait"] >= 0


def test_table_output_and_other_formats(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "simulate",
            str(SACCT),
            "--format",
            "sacct",
            "--nodes",
            "4",
            "--gpus-per-node",
            "4",
            "--plot",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "baseline" in result.stdout and "avg JCT (s)" in result.stdout
    assert "skipped 4 job(s): never started" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "jct_cdf.png",
        "queue_length.png",
        "utilization.png",
    ]


def test_errors_are_one_line_and_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "w.csv"
    bad.write_text("name,time,application,num_replicas,batch_size\na,0,cifar10,two,128\n")
    result = CliRunner().invoke(
        main, ["simulate", str(bad), "--format", "pollux", "--nodes", "1", "--gpus-per-node", "4"]
    )
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"slurm-elastic simulate: {bad}:2: num_replicas='two' is not an integer"
    )
    too_big = CliRunner().invoke(
        main, ["simulate", _workload(), "--format", "pollux", "--nodes", "1", "--gpus-per-node", "4"]
    )
    assert too_big.exit_code == 1 and "the cluster has 4" in too_big.stderr
    usage = CliRunner().invoke(
        main, ["simulate", _workload(), "--format", "csv", "--nodes", "1", "--gpus-per-node", "4"]
    )
    assert usage.exit_code == 2


def test_invariants_hold_on_a_full_workload() -> None:
    workload = load_workload(_workload(), "pollux")
    for scheduler in ("fifo", "greedy", "backfill"):
        config = SimConfig(16, 4, scheduler=scheduler)
        result = Simulation(config, workload.jobs, build_models(workload, 4, random.Random(0))).run()
        assert check_invariants(result, len(workload.jobs)) == []
        assert len(result.jobs) == 160 and not result.unfinished
