"""The operating CLI for real: the controller process serves its API socket; root, alice and bob run the real
``slurm-elastic`` command as themselves (runuser), so the kernel's peer credentials decide what each may do.

Ordinary users run the CLI on Debian's python from .venv-jobs (scripts/bootstrap installs the project's runtime
dependencies there; the project comes from PYTHONPATH), because .venv's interpreter lives under /root.
The controller runs in dry-run: it decides and records, and never changes the cluster.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.agents_harness import REPO, Agents
from tests.cluster.controller_harness import (
    ControllerProcess,
    controller_config,
    elastic_script,
    running_controller,
    wait_until,
)
from tests.cluster.harness import TestCluster
from tests.cluster.prometheus_harness import running_prometheus

pytestmark = pytest.mark.cluster

DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 3 --window 10s --cooldown 15s --grace 3s --signal USR2"
METRICS_PORT = 19818
JOBS_PYTHON = REPO / ".venv-jobs" / "bin" / "python"


@pytest.fixture
def api_dir() -> Iterator[Path]:
    # Not under pytest's tmp_path: that is 0700 root, and alice and bob must reach the socket.
    d = Path(tempfile.mkdtemp(prefix="se-ops-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Cli:
    def __init__(self, cluster: TestCluster, socket: Path) -> None:
        self.cluster = cluster
        self.socket = socket

    def __call__(self, user: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = [f"SLURM_ELASTIC_SOCKET={self.socket}", f"PYTHONPATH={REPO}", "PATH=/usr/bin:/bin"]
        if user == "root":
            cmd = ["env", *env, sys.executable, "-m", "slurm_elastic.cli", *args]
        else:
            assert JOBS_PYTHON.exists(), f"{JOBS_PYTHON} missing: run scripts/bootstrap"
            cmd = ["runuser", "-u", user, "--", "env", *env, str(JOBS_PYTHON), "-m", "slurm_elastic.cli", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/tmp", check=False)

    def ok(self, user: str, *args: str) -> str:
        cp = self(user, *args)
        assert cp.returncode == 0, f"{user}: slurm-elastic {' '.join(args)} -> {cp.returncode}: {cp.stderr}"
        return cp.stdout

    def refused(self, user: str, *args: str) -> str:
        cp = self(user, *args)
        assert cp.returncode == 1, f"{user}: slurm-elastic {' '.join(args)} -> {cp.returncode}: {cp.stdout}"
        assert len(cp.stderr.strip().splitlines()) == 1, cp.stderr
        return cp.stderr


@pytest.fixture
def running(agents: Agents, clean_cluster: TestCluster, tmp_path: Path,
            api_dir: Path) -> Iterator[tuple[ControllerProcess, Cli, int]]:
    cluster = agents.cluster
    marker = cluster.jobs_dir / f"marker-{uuid.uuid4().hex[:8]}"
    marker.touch()
    marker.chmod(0o666)
    job = cluster.submit(elastic_script(10, DIRECTIVES, marker), "-N1", "--gres=gpu:2", "--time=30", user="alice")
    cluster.wait_state(job, {"RUNNING"})
    sock = api_dir / "controller.sock"
    cfg = controller_config(tmp_path, agents, dry_run=True, api_socket=str(sock), metrics_port=METRICS_PORT)
    with running_controller(cluster, cfg, dry_run=True) as ctl:
        wait_until("the API socket", sock.exists, 60, ctl)
        wait_until(f"decisions for job {job}", lambda: len(ctl.decisions(job)) >= 2, 90, ctl)
        yield ctl, Cli(cluster, sock), job


def test_reads_as_root_alice_and_bob(running: tuple[ControllerProcess, Cli, int]) -> None:
    ctl, cli, job = running
    # root sees everything
    status = json.loads(cli.ok("root", "status", "--json"))
    assert status["controller"] == "up" and status["lease_holder"] and status["managed_jobs"] >= 1
    assert status["last_cycle"] is not None and status["agents"] >= 1
    assert str(job) in [line.split("|")[0] for line in cli.ok("root", "jobs", "-P", "-n").splitlines()]
    explain = json.loads(cli.ok("root", "explain", str(job), "--json"))
    src = {s["key"]: s["source"] for s in explain["settings"]}
    assert src["window_s"] == "directive" and src["min_samples"] == "global"
    assert explain["decisions"] and explain["decisions"][0]["inputs"]
    assert cli.ok("root", "decisions", "list", "--job", str(job), "-P").startswith("time|job|action")
    agents = json.loads(cli.ok("root", "agents", "--json"))
    assert agents and all(a["reachable"] for a in agents)
    # alice: her own job, in every format
    rows = [r.split("|") for r in cli.ok("alice", "jobs", "-P", "-n").splitlines()]
    assert [r[0] for r in rows] == [str(job)] and rows[0][1] == "alice"
    assert "SETTING" in cli.ok("alice", "explain", str(job))
    assert json.loads(cli.ok("alice", "decisions", "list", "--job", str(job), "--json"))
    assert json.loads(cli.ok("alice", "status", "--json"))["managed_jobs"] == 1
    # bob: not alice's job
    assert cli.ok("bob", "jobs", "-P", "-n").strip() == ""
    assert "permission denied" in cli.refused("bob", "explain", str(job))
    assert "permission denied" in cli.refused("bob", "decisions", "list", "--job", str(job))
    assert json.loads(cli.ok("bob", "decisions", "list", "--json")) == []
    # The state DB is the controller's: bob cannot bypass the API by opening it himself.
    cli.refused("bob", "jobs", "--url", ctl.db_url)
    db_file = Path(ctl.db_url.removeprefix("sqlite:///"))
    assert db_file.stat().st_mode & 0o777 == 0o600


def test_changes_only_for_root_and_recorded_with_who(running: tuple[ControllerProcess, Cli, int]) -> None:
    ctl, cli, job = running
    for user in ("alice", "bob"):
        assert "permission denied" in cli.refused(user, "policy", "set", "scale_up_above=70")
        assert "permission denied" in cli.refused(user, "pause", "--all")
        assert "permission denied" in cli.refused(user, "resume", "--job", str(job))
        assert "permission denied" in cli.refused(user, "policy", "rollback", "1")
    assert cli("alice", "pause").returncode == 2  # usage
    # root changes the policy: validated, versioned with who, picked up by the running controller
    assert "out of range" in cli.refused("root", "policy", "set", "scale_up_above=700")
    assert "policy version 1 stored by root" in cli.ok("root", "policy", "set", "scale_up_above=70")
    assert "policy version 2 stored by root" in cli.ok("root", "policy", "set", "cooldown_s=20")
    history = json.loads(cli.ok("alice", "policy", "history", "--json"))
    assert [(v["version"], v["author"]) for v in history] == [(2, "root"), (1, "root")]
    assert "+cooldown_s = 20" in cli.ok("alice", "policy", "diff")
    assert "policy version 3 stored by root (rollback to 1)" in cli.ok("root", "policy", "rollback", "1")
    shown = cli.ok("bob", "policy", "show")
    assert "# policy version 3 by root" in shown and "cooldown_s = 20" not in shown and "scale_up_above = 70" in shown
    wait_until("the controller to use policy version 3", lambda: "policy version 3 by root" in ctl.log_text(), 60,
               ctl)
    # pause alice's job: decisions go on, recorded as PAUSED holds
    assert "paused job" in cli.ok("root", "pause", "--job", str(job), "--reason", "maintenance")
    wait_until("a PAUSED decision", lambda: any(d.reason == "PAUSED" for d in ctl.decisions(job)), 60, ctl)
    assert "maintenance" in cli.ok("alice", "explain", str(job))
    assert "resumed job" in cli.ok("root", "resume", "--job", str(job))
    assert "was not paused" in cli.ok("root", "resume", "--job", str(job))
    assert "root (uid 0) pause" in ctl.log_text() and "refused pause" in ctl.log_text()


def exposed_names(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every series name a scrape exposes (counter _total, histogram _bucket/_sum/_count included), with samples;
    a family with no samples yet still counts as existing."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(fam.type, ("",))
        for suffix in suffixes:
            out.setdefault(fam.name + suffix, [])
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def scrape(url: str, token: str | None = None) -> str:
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 - a fixed local http URL
        return str(resp.read().decode())


def test_controller_metrics_and_the_dashboard_against_real_scrapes(running: tuple[ControllerProcess, Cli, int],
                                                                   agents: Agents) -> None:
    from slurm_elastic.testing.promql_names import metric_names

    ctl, _cli, job = running
    url = f"http://127.0.0.1:{METRICS_PORT}/metrics"
    wait_until("a cycle in the metrics",
               lambda: any(v > 0 for _, v in exposed_names(scrape(url))
                           .get("slurm_elastic_controller_cycle_duration_seconds_count", [])), 60, ctl)
    # Without the token: no per-job series (job ids, user names); with it: all of them.
    public = exposed_names(scrape(url))
    assert "slurm_elastic_job_nodes" not in public and "slurm_elastic_controller_lease_held" in public
    ctl_names = exposed_names(scrape(url, agents.metrics_token))
    assert ctl_names["slurm_elastic_controller_lease_held"] == [({}, 1.0)]
    assert ctl_names["slurm_elastic_controller_managed_jobs"][0][1] >= 1
    assert any(labels["jobid"] == str(job) for labels, _ in ctl_names["slurm_elastic_job_nodes"])
    assert sum(v for _, v in ctl_names["slurm_elastic_controller_decisions_total"]) >= 1
    assert {lab["result"] for lab, _ in ctl_names["slurm_elastic_controller_cycles_total"]} >= {"ok"}
    for name in ("slurm_elastic_controller_actions_total", "slurm_elastic_controller_gpus_granted_total",
                 "slurm_elastic_controller_gpus_reclaimed_total", "slurm_elastic_controller_agent_scrape_errors_total",
                 "slurm_elastic_controller_agent_staleness_seconds", "slurm_elastic_pending_wait_seconds"):
        assert name in ctl_names, name
    agent_names: dict[str, list[tuple[dict[str, str], float]]] = {}
    for node in agents.cluster.nodes:
        agent_names.update(exposed_names(scrape(agents.metrics_url(node), agents.metrics_token)))
    dashboard = json.loads((REPO / "docs" / "grafana" / "slurm-elastic.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    used = set().union(*(metric_names(e) for e in exprs))
    missing = used - set(ctl_names) - set(agent_names)
    assert not missing, f"dashboard queries reference metrics nobody exposes: {sorted(missing)}"
    assert len(used) >= 12


PROMETHEUS_PORT = 19090


def prom_query(expr: str) -> list[dict[str, object]]:
    import urllib.parse

    body = json.loads(scrape(f"http://127.0.0.1:{PROMETHEUS_PORT}/api/v1/query?"
                             + urllib.parse.urlencode({"query": expr})))
    assert body["status"] == "success", body
    result = body["data"]["result"]
    assert isinstance(result, list)
    return result


def test_a_real_prometheus_answers_the_dashboard_queries(running: tuple[ControllerProcess, Cli, int],
                                                         agents: Agents, tmp_path: Path) -> None:
    """Debian's Prometheus (scripts/bootstrap installs it) scrapes the controller and the agents with the metrics
    bearer token (as docs/deployment.md configures it); the dashboard's core queries return data."""
    ctl, _cli, job = running
    # A short rigid job ends while Prometheus scrapes: the finished-job histograms get their first series.
    short = agents.cluster.submit("#!/bin/sh\nsleep 1\n", "-N1", "--gres=gpu:1", "--time=1", user="bob")
    targets = ", ".join(f'"{agents.metrics_address(n)}"' for n in agents.cluster.nodes)
    auth = f"{{type: Bearer, credentials_file: {agents.metrics_token_file}}}"
    with running_prometheus(tmp_path, PROMETHEUS_PORT, f"""\
  - job_name: controller
    authorization: {auth}
    static_configs: [{{targets: ["127.0.0.1:{METRICS_PORT}"]}}]
  - job_name: agents
    authorization: {auth}
    static_configs: [{{targets: [{targets}]}}]
"""):
        def ready() -> bool:
            try:
                return len(prom_query("up == 1")) == 1 + len(agents.cluster.nodes)
            except OSError:
                return False

        wait_until("Prometheus to scrape every target", ready, 90, ctl)
        dashboard = json.loads((REPO / "docs" / "grafana" / "slurm-elastic.json").read_text())
        queries = {t["expr"] for p in dashboard["panels"] for t in p["targets"]
                   if p["title"] in {"Cluster GPU utilization", "Per-job GPU utilization vs size",
                                     "Decisions by reason", "Cycle latency", "Completion time of finished jobs",
                                     "Queue wait of finished jobs"}}
        queries = {q.replace('=~"$job"', f'=~"{job}"') for q in queries}

        for q in sorted(queries):
            try:
                wait_until(f"data for the dashboard query {q}", lambda q=q: bool(prom_query(q)), 90, ctl)
            except AssertionError as e:
                mine = [line for line in scrape(f"http://127.0.0.1:{METRICS_PORT}/metrics", agents.metrics_token)
                        .splitlines()
                        if line.startswith("slurm_elastic_job")]
                raise AssertionError(f"{e}\ncontroller job series: {mine}") from None
        assert agents.cluster.wait_state(short, {"COMPLETED"}) == "COMPLETED"
        wait_until("the finished job in Prometheus", lambda: any(
            isinstance(r["value"], list) and float(r["value"][1]) >= 1
            for r in prom_query('slurm_elastic_job_completion_seconds_count{elastic="false"}')), 60, ctl)
        series = [r["metric"] for r in prom_query(f'slurm_elastic_job_nodes{{jobid="{job}"}}')]
        assert any(isinstance(m, dict) and m.get("jobid") == str(job) for m in series)
