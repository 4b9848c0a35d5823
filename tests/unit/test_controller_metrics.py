"""The controller's metrics on their own registry, fed by real cycles over Slurm replies recorded from the live test
cluster (tests/unit/slurm_replay.py, fake clock), and the Grafana dashboard's queries parsed (the live check
against real scrapes is tests/cluster/test_operating_cli.py)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from slurm_elastic.controller.cycle import outcome_class
from slurm_elastic.controller.metrics import ControllerMetrics
from slurm_elastic.slurm.decode import parse_squeue
from slurm_elastic.testing.promql_names import metric_names
from tests.unit.controller_scenarios import GPU_NODES
from tests.unit.slurm_replay import replay
from tests.unit.test_controller_cycle import Agents

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "slurm-elastic.json"


def samples(m: ControllerMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_cycles_feed_every_controller_metric() -> None:
    r = replay("observed_grow", Agents)  # 10 cycles as the daemon runs them, then the lease lost
    assert r.world.ctl.metrics is not None
    s = samples(r.world.ctl.metrics)
    busy = r.rec.jobs["busy"]
    assert s["slurm_elastic_controller_cycle_duration_seconds_count"] == [({}, 11.0)]
    assert ({"result": "ok"}, 10.0) in s["slurm_elastic_controller_cycles_total"]
    reasons = {lab["reason"] for lab, _ in s["slurm_elastic_controller_decisions_total"]}
    assert "UNDERUTILIZED" not in reasons and len(reasons) >= 1
    assert ({"action": "grow", "outcome": "ok"}, 1.0) in s["slurm_elastic_controller_actions_total"]
    assert s["slurm_elastic_controller_gpus_granted_total"][0][1] == 4.0
    assert s["slurm_elastic_controller_managed_jobs"] == [({}, 1.0)]
    silent = max(set(GPU_NODES) - set(r.rec.nodes["busy"]))
    assert {lab["node"] for lab, _ in s["slurm_elastic_controller_agent_scrape_errors_total"]} == {silent}
    assert {lab["jobid"] for lab, _ in s["slurm_elastic_job_nodes"]} == {str(busy)}
    # Losing the lease shows: another holder took it after ours expired (the scenario's last cycle).
    assert s["slurm_elastic_controller_lease_held"] == [({}, 0.0)]


@pytest.mark.parametrize(("text", "label"), [
    ("extension job 12 submitted", "ok"), ("SIGUSR1 sent; nodes go after 3s", "ok"), ("released n2", "ok"),
    ("grow failed: sbatch: error", "failed"), ("error: DB locked", "failed"), ("refused: x", "failed"),
    ("aborted: below min", "aborted"), ("job gone", "aborted"),
])
def test_outcome_labels(text: str, label: str) -> None:
    assert outcome_class(text) == label


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (reason) (rate(x_total{a="b"}[5m]))', {"x_total"}),
    ("histogram_quantile(0.95, sum by (le) (rate(h_bucket[5m])))", {"h_bucket"}),
    ("rate(a_sum[5m]) / rate(a_count[5m])", {"a_sum", "a_count"}),
    ('changes(n{job=~"$job"}[2m]) > 0', {"n"}),
    ("avg(DCGM_FI_DEV_GPU_UTIL)", {"DCGM_FI_DEV_GPU_UTIL"}),
])
def test_metric_names_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_dashboard_has_the_required_panels_and_only_known_controller_names() -> None:
    d = json.loads(DASHBOARD.read_text())
    titles = {p["title"] for p in d["panels"]}
    assert {"Cluster GPU utilization", "Per-job GPU utilization vs size", "Decisions by reason", "Cycle latency",
            "Queue wait of pending jobs", "Completion time of finished jobs", "Queue wait of finished jobs"} <= titles
    assert any("slurm_elastic_job_nodes" in a["expr"] for a in d["annotations"]["list"])  # resize annotations
    exposed = set()
    for fam in text_string_to_metric_families(generate_latest(ControllerMetrics().registry).decode()):
        exposed.add(fam.name)
        exposed.update(fam.name + s for s in {"counter": ("_total",),
                                               "histogram": ("_bucket", "_sum", "_count")}.get(fam.type, ("",)))
    used = set().union(*(metric_names(t["expr"]) for p in d["panels"] for t in p["targets"]))
    controller_side = {n for n in used if not n.startswith(("DCGM_", "slurm_elastic_agent_"))}
    assert controller_side <= exposed, controller_side - exposed


def test_finished_jobs_feed_the_completion_and_wait_histograms_once() -> None:
    """Recorded: an elastic job and a rigid one ran and were cancelled, a rigid one was cancelled while it waited;
    squeue lists them as ended for several cycles, with the jobs that ended before the recording. Each job that
    ran is observed once, with its times as Slurm reported them; the one that never ran is not."""
    r = replay("jobs_end", Agents)
    assert r.world.ctl.metrics is not None
    s = samples(r.world.ctl.metrics)
    replies = [parse_squeue(json.loads(c["stdout"]))[1] for c in r.rec.commands
               if c["argv"][:3] == ["squeue", "--all", "--json"]]
    final = {j.job_id: j for j in replies[-1]}
    elastic, rigid, waiting = (final[r.rec.jobs[n]] for n in ("elastic", "rigid", "waiting"))
    assert {elastic.state, rigid.state, waiting.state} == {"CANCELLED"}
    # Slurm gives the job cancelled while waiting a start time (the cancel's), but no nodes
    assert waiting.start_time == waiting.end_time and not waiting.nodes and rigid.nodes
    ended = {j.job_id: j for reply in replies for j in reply  # every job that ran and ended, once
             if j.state in {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT"} and j.nodes and j.end_time is not None
             and j.start_time is not None and j.submit_time is not None and not j.comment.startswith("slurm-elastic:")}
    assert len([j for reply in replies for j in reply if j.job_id in ended]) > len(ended)  # listed repeatedly
    rigid_ones = [j for i, j in ended.items() if i != elastic.job_id]
    assert rigid.job_id in ended and waiting.job_id not in ended

    def seconds(a: datetime | None, b: datetime | None) -> float:
        assert a is not None and b is not None
        return (a - b).total_seconds()

    counts = {(lab["elastic"], lab["partition"]): v for lab, v in s["slurm_elastic_job_completion_seconds_count"]}
    assert counts[("true", elastic.partition)] == 1.0
    assert sum(v for (e, _p), v in counts.items() if e == "false") == len(rigid_ones)
    sums = {lab["elastic"]: v for lab, v in s["slurm_elastic_job_completion_seconds_sum"]}
    assert sums["true"] == seconds(elastic.end_time, elastic.submit_time) > 0
    assert sums["false"] == sum(seconds(j.end_time, j.submit_time) for j in rigid_ones)
    waits = {lab["elastic"]: v for lab, v in s["slurm_elastic_job_wait_seconds_sum"]}
    assert waits["true"] == max(0.0, seconds(elastic.start_time, elastic.submit_time))
    assert waits["false"] == sum(max(0.0, seconds(j.start_time, j.submit_time)) for j in rigid_ones)
