"""The controller's metrics on their own registry, fed by real cycles over the in-memory Slurm (fake clock), and
the Grafana dashboard's queries parsed (the live check against real scrapes is tests/cluster/test_operating_cli.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from slurm_elastic.controller.config import ControllerConfig
from slurm_elastic.controller.cycle import Controller, outcome_class
from slurm_elastic.controller.metrics import ControllerMetrics, observe_cycle
from slurm_elastic.testing.promql_names import metric_names
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import POLICY, T0, Agents, FakeSlurm

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "slurm-elastic.json"


def samples(m: ControllerMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_cycles_feed_every_controller_metric() -> None:
    clock = FakeClock(T0)
    store = memory_store(clock)
    slurm, agents, metrics = FakeSlurm(clock), Agents(clock), ControllerMetrics()
    ctl = Controller(ControllerConfig(interval_s=2.0, holder="test"), POLICY, slurm=slurm,
                     store=store, collector=agents, clock=clock, metrics=metrics)
    slurm.add_job(10, ["n1"])
    agents.util[("n1", 10)] = 95.0
    agents.silent.add("n4")
    for _ in range(10):
        observe_cycle(ctl, ctl.run_cycle, T0)
        clock.advance(2.0)
    s = samples(metrics)
    assert s["slurm_elastic_controller_cycle_duration_seconds_count"] == [({}, 10.0)]
    assert s["slurm_elastic_controller_lease_held"] == [({}, 1.0)]
    assert ({"result": "ok"}, 10.0) in s["slurm_elastic_controller_cycles_total"]
    reasons = {lab["reason"] for lab, _ in s["slurm_elastic_controller_decisions_total"]}
    assert "UNDERUTILIZED" not in reasons and len(reasons) >= 1
    assert ({"action": "grow", "outcome": "ok"}, 1.0) in s["slurm_elastic_controller_actions_total"]
    assert s["slurm_elastic_controller_gpus_granted_total"][0][1] == 4.0
    assert s["slurm_elastic_controller_managed_jobs"] == [({}, 1.0)]
    assert {lab["node"] for lab, _ in s["slurm_elastic_controller_agent_scrape_errors_total"]} == {"n4"}
    assert {lab["jobid"] for lab, _ in s["slurm_elastic_job_nodes"]} == {"10"}
    # Losing the lease shows: another holder takes it after ours expired.
    clock.advance(1000)
    store.lease.acquire("other", timedelta(seconds=600))
    observe_cycle(ctl, ctl.run_cycle, T0)
    assert samples(metrics)["slurm_elastic_controller_lease_held"] == [({}, 0.0)]


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
    clock = FakeClock(T0)
    store = memory_store(clock)
    slurm, agents, metrics = FakeSlurm(clock), Agents(clock), ControllerMetrics()
    ctl = Controller(ControllerConfig(interval_s=2.0, holder="test"), POLICY, slurm=slurm,
                     store=store, collector=agents, clock=clock, metrics=metrics)
    slurm.add_job(10, ["n1"])
    agents.util[("n1", 10)] = 60.0
    observe_cycle(ctl, ctl.run_cycle, T0)
    # Elastic job 10 ends after 2 h (queued 10 min); rigid job 11, never seen running, after 30 min (queued 1 h).
    slurm.jobs[10] = replace(slurm.jobs[10], state="COMPLETED", submit_time=T0 - timedelta(hours=2),
                             start_time=T0 - timedelta(hours=2) + timedelta(minutes=10), end_time=T0)
    slurm.jobs[11] = replace(slurm.jobs[10], job_id=11, state="TIMEOUT", submit_time=T0 - timedelta(hours=1.5),
                             start_time=T0 - timedelta(minutes=30), end_time=T0)
    slurm.jobs[12] = replace(slurm.jobs[10], job_id=12, state="CANCELLED", start_time=None, end_time=T0)  # never ran
    for _ in range(3):  # listed for several cycles, observed once
        clock.advance(2.0)
        observe_cycle(ctl, ctl.run_cycle, T0)
    s = samples(metrics)
    counts = {(lab["elastic"], lab["partition"]): v for lab, v in s["slurm_elastic_job_completion_seconds_count"]}
    assert counts == {("true", "train"): 1.0, ("false", "train"): 1.0}
    sums = {lab["elastic"]: v for lab, v in s["slurm_elastic_job_completion_seconds_sum"]}
    assert sums == {"true": 7200.0, "false": 5400.0}
    waits = {lab["elastic"]: v for lab, v in s["slurm_elastic_job_wait_seconds_sum"]}
    assert waits == {"true": 600.0, "false": 3600.0}
    le = {(lab["elastic"], lab["le"]): v for lab, v in s["slurm_elastic_job_wait_seconds_bucket"]}
    assert (le[("true", "300.0")], le[("true", "900.0")], le[("false", "3600.0")]) == (0.0, 1.0, 1.0)
