"""The Prometheus metrics source on replies recorded from a real Prometheus (scripts/record-prometheus-replies):
dcgm-exporter's series with its HPC job mapping and the agents' own series, before and after targets went away;
the HTTP path against a loopback server; [metrics_source] in the controller's config; and controller cycles on
this source that shrink an idle job, grow a busy one and hold on missing data (on Slurm replies recorded from the
live test cluster)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic.controller.collect import CollectResult, merge_job
from slurm_elastic.controller.config import ControllerConfig, MetricsSourceConfig, parse_controller_config
from slurm_elastic.controller.daemon import build_collector
from slurm_elastic.controller.prometheus import (
    PrometheusError,
    PrometheusSource,
    Series,
    parse_vector,
    queries,
    reports_from,
)
from slurm_elastic.errors import ConfigError
from slurm_elastic.store.records import ActionKind, ActionState, DecisionFilter
from tests.unit import reliability_scenarios  # noqa: F401 - registers the recorded scenario
from tests.unit.slurm_replay import STEP_S, replay
from tests.unit.storehelpers import FakeClock

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "prometheus"
URL = "http://prometheus.test:9090"
DCGM = MetricsSourceConfig(kind="prometheus", url=URL, window_s=30)
AGENT = MetricsSourceConfig(kind="prometheus", url=URL, series="agent")
NODES = {"gpu001": "http://gpu001:9817", "gpu002": "http://gpu002:9817", "gpu009": "http://gpu009:9817"}


def recorded(sub: str, cfg: MetricsSourceConfig) -> dict[str, list[Series]]:
    return {name: parse_vector((FIXTURES / sub / f"{name}.json").read_bytes()) for name in queries(cfg)}


# --- replies -----------------------------------------------------------------------------------------------------
def test_a_recorded_vector_parses_and_error_and_matrix_replies_are_refused() -> None:
    mean = parse_vector((FIXTURES / "dcgm" / "mean.json").read_bytes())
    assert {(s.labels["Hostname"], s.labels["hpc_job"]): s.value for s in mean} == {
        ("gpu001.cluster.example", "101"): 80.0, ("gpu001.cluster.example", "102"): 5.0,
        ("gpu002", "101"): 82.0, ("gpu002", "103"): 0.0}
    error = json.loads((FIXTURES / "error-bad_data.json").read_text())
    with pytest.raises(PrometheusError, match="bad_data: invalid parameter"):
        parse_vector(json.dumps(error["body"]))
    with pytest.raises(PrometheusError, match="expected an instant vector, got 'matrix'"):
        parse_vector((FIXTURES / "matrix.json").read_bytes())
    with pytest.raises(PrometheusError, match="not JSON"):
        parse_vector(b"<html>502 Bad Gateway</html>")
    nan = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"a": "1"}, "value": [1.0, "NaN"]}, {"metric": {"a": "2"}, "value": [1.0, "7"]}]}}
    assert parse_vector(json.dumps(nan)) == [Series({"a": "2"}, 7.0)]  # NaN is missing data, never a number


def test_the_queries_use_the_configured_labels_and_matchers() -> None:
    cfg = MetricsSourceConfig(kind="prometheus", url=URL, node_label="instance_host", job_label="slurm_job",
                              matchers='cluster="a"', window_s=90)
    q = queries(cfg)
    assert q["mean"] == ('avg by (instance_host, slurm_job) (avg_over_time('
                         'DCGM_FI_DEV_GPU_UTIL{slurm_job!="", cluster="a"}[90s]))')
    assert q["last"] == ('min by (instance_host, slurm_job) (timestamp('
                         'DCGM_FI_DEV_GPU_UTIL{slurm_job!="", cluster="a"}))')
    assert q["memory"] == 'sum by (instance_host, slurm_job) (DCGM_FI_DEV_FB_USED{slurm_job!="", cluster="a"})'
    assert queries(AGENT)["nodes"] == "slurm_elastic_agent_nvml_up"


# --- dcgm-exporter ---------------------------------------------------------------------------------------------------
def test_dcgm_series_become_per_node_job_reports() -> None:
    replies = recorded("dcgm", DCGM)
    now = max(s.value for s in replies["last"]) + 1
    result = reports_from(DCGM, replies, NODES, now)
    # gpu001's exporter says gpu001.cluster.example: the short name is the Slurm node.
    assert set(result.reports) == {"gpu001", "gpu002"}
    assert result.errors == {"gpu009": "no series in Prometheus for this node"}
    assert result.via == URL and result.url("gpu001", NODES) == URL
    assert result.gpu_count("gpu001") == 4 and result.gpu_count("gpu002") == 3
    jobs = {j.job_id: j for j in result.reports["gpu001"].jobs}
    assert set(jobs) == {101, 102}  # the idle GPU 3 has no hpc_job: no job
    j = jobs[101]
    assert (j.gpus_allocated, j.gpus_in_use, j.util_mean_percent, j.util_max_percent) == (2, 2, 80.0, 90.0)
    assert j.memory_used_mib == 120_000 and j.util_sample_count >= 8 and j.last_sample_at <= now
    idle = {j.job_id: j for j in result.reports["gpu002"].jobs}[103]
    assert (idle.util_mean_percent, idle.gpus_allocated, idle.gpus_in_use) == (0.0, 1, 0)
    # The two-node job merges as the agents' reports do: GPU-weighted mean, every node covered.
    merged = merge_job(101, [(101, "gpu001"), (101, "gpu002")], result.reports)
    assert merged.coverage == 1.0 and merged.util_mean_percent == pytest.approx(81.0)
    assert merged.util_max_percent == 90.0 and merged.gpus_allocated == 4
    assert merged.last_sample_at == min(j.last_sample_at, idle.last_sample_at)


def test_a_stopped_dcgm_exporter_is_missing_data_not_zero() -> None:
    replies = recorded("dcgm-stale", DCGM)
    result = reports_from(DCGM, replies, NODES, 2e9)
    assert "gpu002" not in result.reports and result.errors["gpu002"] == "no series in Prometheus for this node"
    # Its range queries still hold the old samples, but without a latest sample no job is reported there.
    assert any(s.labels["Hostname"] == "gpu002" for s in replies["mean"])
    merged = merge_job(101, [(101, "gpu001"), (101, "gpu002")], result.reports)
    assert merged.coverage == 0.5 and merged.nodes_missing == ("gpu002",)  # the cycle stores nothing for it
    assert merge_job(102, [(102, "gpu001")], result.reports).coverage == 1.0


# --- the agents' series ----------------------------------------------------------------------------------------------
def test_agent_series_with_exported_job_and_with_honor_labels() -> None:
    nodes = {"n1": "", "n2": "", "n3": ""}
    result = reports_from(AGENT, recorded("agent", AGENT), nodes, 2e9)
    assert set(result.reports) == {"n1", "n2"} and set(result.errors) == {"n3"}
    n1 = {j.job_id: j for j in result.reports["n1"].jobs}  # scraped as usual: the job id is in exported_job
    n2 = {j.job_id: j for j in result.reports["n2"].jobs}  # honor_labels: true: in job
    assert set(n1) == {201, 202} and set(n2) == {201}
    assert (n1[201].util_mean_percent, n1[201].util_max_percent, n1[201].gpus_allocated) == (90.0, 95.0, 2)
    assert (n1[202].util_mean_percent, n1[202].sample_count, n1[202].memory_used_mib) == (3.0, 12, 39_000)
    assert result.gpu_count("n1") == 4
    merged = merge_job(201, [(201, "n1"), (201, "n2")], result.reports)
    assert merged.coverage == 1.0 and merged.util_mean_percent == pytest.approx(90.0)
    stale = reports_from(AGENT, recorded("agent-stale", AGENT), nodes, 2e9)
    assert "n1" not in stale.reports and "n1" in stale.errors
    assert merge_job(201, [(201, "n1"), (201, "n2")], stale.reports).coverage == 0.5


# --- over HTTP -------------------------------------------------------------------------------------------------------
class FakePrometheus:
    """A loopback HTTP server answering /api/v1/query with ``answer(expr) -> (status, JSON document)``."""

    def __init__(self, answer: Callable[[str], tuple[int, Any]]) -> None:
        self.answer = answer
        self.seen: list[tuple[str, str | None]] = []  # (query, Authorization header)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                expr = form["query"][0]
                outer.seen.append((expr, self.headers.get("Authorization")))
                status, doc = outer.answer(expr)
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_prometheus() -> Iterator[Callable[[Callable[[str], tuple[int, Any]]], FakePrometheus]]:
    made: list[FakePrometheus] = []

    def make(answer: Callable[[str], tuple[int, Any]]) -> FakePrometheus:
        made.append(FakePrometheus(answer))
        return made[-1]

    yield make
    for p in made:
        p.close()


def serve_recorded(sub: str, cfg: MetricsSourceConfig) -> Callable[[str], tuple[int, Any]]:
    by_expr = {expr: json.loads((FIXTURES / sub / f"{name}.json").read_text()) for name, expr in queries(cfg).items()}
    return lambda expr: (200, by_expr[expr])


def test_the_source_posts_every_query_with_the_token_and_reads_the_replies(fake_prometheus: Any) -> None:
    prom = fake_prometheus(serve_recorded("dcgm", DCGM))
    cfg = MetricsSourceConfig(kind="prometheus", url=prom.url, window_s=30)
    result = PrometheusSource(cfg, token=b"s3cret-token-0123456789", clock=lambda: 2e9)(NODES)
    assert sorted(q for q, _ in prom.seen) == sorted(queries(cfg).values())
    assert {auth for _, auth in prom.seen} == {"Bearer s3cret-token-0123456789"}
    assert result == reports_from(cfg, recorded("dcgm", DCGM), NODES, 2e9)


def test_a_failing_query_fails_the_whole_collection(fake_prometheus: Any) -> None:
    error = json.loads((FIXTURES / "error-bad_data.json").read_text())
    ok = serve_recorded("dcgm", DCGM)
    prom = fake_prometheus(lambda expr: (400, error["body"]) if expr.startswith("max by") else ok(expr))
    result = PrometheusSource(MetricsSourceConfig(kind="prometheus", url=prom.url, window_s=30))(NODES)
    assert result.reports == {} and set(result.errors) == set(NODES)
    assert "bad_data: invalid parameter" in result.errors["gpu001"] and "HTTP 400" in result.errors["gpu001"]
    assert result.errors["gpu001"].startswith(f"prometheus {prom.url}: query 'max by")


def test_unreachable_slow_and_non_json_servers_are_errors(fake_prometheus: Any) -> None:
    gone = fake_prometheus(lambda expr: (200, {}))
    gone.close()
    result = PrometheusSource(MetricsSourceConfig(kind="prometheus", url=gone.url, timeout_s=2))(NODES)
    assert result.reports == {} and "ClientConnectorError" in result.errors["gpu001"]
    slow_event = threading.Event()

    def slow(expr: str) -> tuple[int, Any]:
        slow_event.wait(3)
        return 200, {}

    slow_prom = fake_prometheus(slow)
    result = PrometheusSource(MetricsSourceConfig(kind="prometheus", url=slow_prom.url, timeout_s=0.3))(NODES)
    slow_event.set()
    assert "no answer within 0.3 s" in result.errors["gpu002"]
    matrix = json.loads((FIXTURES / "matrix.json").read_text())
    result = PrometheusSource(MetricsSourceConfig(kind="prometheus",
                                                  url=fake_prometheus(lambda e: (200, matrix)).url))(NODES)
    assert "expected an instant vector" in result.errors["gpu009"]


# --- config ----------------------------------------------------------------------------------------------------------
def config(section: str) -> ControllerConfig:
    return parse_controller_config(f"version = 1\n[metrics_source]\n{section}\n")


def test_metrics_source_config() -> None:
    assert parse_controller_config("version = 1\n").metrics_source == MetricsSourceConfig()
    cfg = config('kind = "prometheus"\nurl = "http://prom:9090/"\nseries = "agent"\nwindow_s = 120\n'
                 'token_file = "/etc/t"\nmatchers = \'cluster="a", rack=~"r1.*"\'')
    assert cfg.metrics_source == MetricsSourceConfig(kind="prometheus", url="http://prom:9090", series="agent",
                                                     window_s=120.0, token_file=Path("/etc/t"),
                                                     matchers='cluster="a", rack=~"r1.*"')
    for bad, message in [('kind = "dcgm"', "metrics_source.kind: one of agents, prometheus"),
                         ('kind = "prometheus"', "metrics_source.url: the Prometheus server's http(s) URL"),
                         ('series = "nvidia"', "metrics_source.series: one of dcgm, agent"),
                         ('job_label = "hpc job"', "metrics_source.job_label: a Prometheus label name"),
                         ('node_label = "x) or vector(1"', "metrics_source.node_label"),
                         ('matchers = \'a="x"} or vector(1) or up{b="y"\'', "metrics_source.matchers"),
                         ("window_s = 1", "metrics_source.window_s: 1 out of range"),
                         ('colour = "red"', "metrics_source.colour: unknown key")]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            config(bad)


def test_the_daemon_picks_prometheus_without_an_agent_key(tmp_path: Path) -> None:
    token = tmp_path / "prom.token"
    token.write_text("0123456789abcdef0123\n")
    token.chmod(0o600)
    cfg = config(f'kind = "prometheus"\nurl = "http://prom:9090"\ntoken_file = "{token}"')
    collector = build_collector(cfg)
    assert isinstance(collector, PrometheusSource) and collector._headers["Authorization"].endswith("0123")
    with pytest.raises(ConfigError, match=r"agents\.key_file: key file .*none\.key does not exist"):
        build_collector(parse_controller_config(f'version = 1\n[agents]\nkey_file = "{tmp_path / "none.key"}"\n'))


# --- controller cycles on the Prometheus source ----------------------------------------------------------------------
class DcgmWorld:
    """The per-(node, job) figures a Prometheus holding dcgm-exporter's series would answer, at the clock's time.

    It stands where a recorded scenario's agents stand (tests/unit/slurm_replay.py: UtilAgents): the scenario
    sets ``util`` and ``silent`` (any silent node: the server answers 503), and the controller collects through
    ``collector``, the real Prometheus source asking a loopback server that answers from this world."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.util: dict[tuple[str, int], float] = {}
        self.silent: set[str] = set()
        self.collector: Callable[[Mapping[str, str]], CollectResult] | None = None

    def __call__(self, agents: Mapping[str, str]) -> CollectResult:
        assert self.collector is not None
        return self.collector(agents)

    def answer(self, expr: str) -> tuple[int, Any]:
        if self.silent:
            return 503, {"status": "error", "errorType": "unavailable", "error": "TSDB not ready"}
        figure = next(name for name, q in queries(DCGM).items() if q == expr)
        now = self.clock().timestamp()
        values: dict[tuple[str, str], float] = {}
        for (node, job), util in self.util.items():
            values[(node, str(job))] = {"mean": util, "max": util, "gpus": 4, "in_use": 4, "samples": 6,
                                        "last": now - 1, "memory": 1000}.get(figure, 4)
        if figure == "gpus_per_node":
            result = [{"metric": {"Hostname": f"n{i}"}, "value": [now, "4"]} for i in range(1, 5)]
        else:
            result = [{"metric": {"Hostname": n, "hpc_job": j}, "value": [now, str(v)]}
                      for (n, j), v in values.items()]
        return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}


def test_controller_cycles_on_prometheus_shrink_grow_and_hold_without_data(fake_prometheus: Any) -> None:
    """The real controller and SlurmCli on Slurm replies recorded from the live cluster (the same scenario recorded
    with agents: the Slurm commands must come out the same with Prometheus as the metrics source)."""
    worlds: list[DcgmWorld] = []
    prom_urls: list[str] = []

    def world_on_prometheus(clock: FakeClock) -> DcgmWorld:
        world = DcgmWorld(clock)
        prom = fake_prometheus(world.answer)
        prom_urls.append(prom.url)
        source_cfg = MetricsSourceConfig(kind="prometheus", url=prom.url, window_s=30)
        world.collector = build_collector(ControllerConfig(interval_s=2.0, holder="test", metrics_source=source_cfg))
        worlds.append(world)
        return world

    r = replay("shrink_grow_then_no_metrics", world_on_prometheus)
    store, busy, idle = r.store, r.rec.jobs["busy"], r.rec.jobs["idle"]
    assert ["scancel", "--signal=USR1", "--full", str(idle)] in r.runner.calls  # the idle job is told it will shrink
    grows = [a for a in store.journal.list_actions(job_id=busy) if a.kind == ActionKind.GROW]
    assert len(grows) == 1 and grows[0].state == ActionState.APPLIED and len(r.runner.ran("runuser")) == 1
    kept = r.rec.nodes["idle"][0]
    assert ["scontrol", "update", f"JobId={idle}", f"NodeList={kept}"] in r.runner.calls
    (agent,) = [a for a in store.agents.list_agents() if a.node == kept]
    assert agent.url == prom_urls[0] and agent.version == "prometheus" and agent.gpu_count == 4
    # One sample per cycle from Prometheus (from the second: the first cycle registers the nodes) until it went
    # away, none after.
    times = [x.time for x in store.samples.samples(idle, since=r.rec.clock_start)]
    down_at = r.rec.clock_start + timedelta(seconds=14 * STEP_S)  # the scenario's 15th cycle
    assert len(times) >= 12 and all(b - a == timedelta(seconds=STEP_S) for a, b in zip(times, times[1:], strict=False))
    assert down_at - timedelta(seconds=2 * STEP_S) < times[-1] < down_at  # the last cycle before it
    (agent,) = [a for a in store.agents.list_agents() if a.node == kept]
    assert agent.last_error is not None and "unavailable: TSDB not ready" in agent.last_error
    during = store.decisions.list_decisions(DecisionFilter(since=down_at))
    assert during and all(d.action == "hold" for d in during)
    latest = max((d for d in during if d.job_id == idle), key=lambda d: d.id)
    assert latest.reason in {"WINDOW_NOT_FILLED", "STALE_METRICS", "NO_METRICS"}  # not enough data: hold
