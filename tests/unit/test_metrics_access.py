"""Safe telemetry defaults: /metrics of the agent and of the controller listen on 127.0.0.1 unless opened, and
the series that name jobs and people (job, user, account labels) go only to a scraper with the bearer token."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import BaseTestServer, TestServer
from prometheus_client.parser import text_string_to_metric_families

from slurm_elastic.agent.aggregate import JobHistory
from slurm_elastic.agent.auth import (
    PER_JOB_LABELS,
    MetricsAccess,
    RequestVerifier,
    generate_key_file,
    load_token,
)
from slurm_elastic.agent.config import load_config
from slurm_elastic.agent.errors import AuthError, KeyFileError
from slurm_elastic.agent.server import AgentApp, serve
from slurm_elastic.controller.config import parse_controller_config
from slurm_elastic.controller.daemon import start_metrics
from slurm_elastic.controller.metrics import ControllerMetrics
from slurm_elastic.errors import ConfigError
from tests.unit.test_agent_auth import KEY, StubSampler
from tests.unit.test_agent_metrics import node_report

TOKEN = "s3cr3t-metrics-token-0123456789"
Samples = dict[str, list[dict[str, str]]]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, [])
        for s in family.samples:
            out[family.name].append(dict(s.labels))
    return out


def per_job_labels(samples: Samples) -> set[str]:
    return {k for labels in samples.values() for lab in labels for k in lab} & PER_JOB_LABELS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening_addresses(port: int) -> set[str]:
    """Local addresses of the TCP sockets listening on ``port``, read from the kernel (/proc/net/tcp{,6})."""
    found = set()
    for name in ("tcp", "tcp6"):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) != port or fields[3] != "0A":  # 0A: LISTEN
                continue
            if len(address) == 8:
                found.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(address)[::-1]))
            else:
                raw = bytes.fromhex(address)
                found.add(socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))))
    return found


# ---- who gets which view (pure) ----------------------------------------------------------------------------


def test_the_token_decides_the_view() -> None:
    access = MetricsAccess(TOKEN.encode())
    assert access.view(None) == "reduced"
    assert access.view(f"Bearer {TOKEN}") == "full"
    assert access.view(f"bearer  {TOKEN} ") == "full"  # the scheme is case-insensitive (RFC 7235)
    refused = {f"Bearer {TOKEN}x": "bad_token", f"Bearer {TOKEN[:-1]}": "bad_token", "Bearer ": "malformed_credentials",
               f"Basic {TOKEN}": "malformed_credentials", TOKEN: "malformed_credentials",
               "Bearer \u00e9\u00e9": "bad_token"}
    for header, reason in refused.items():
        with pytest.raises(AuthError) as info:
            access.view(header)
        assert info.value.reason == reason, header
    assert MetricsAccess(TOKEN.encode(), "all").view(None) == "full"
    with pytest.raises(AuthError, match="bearer token is required"):
        MetricsAccess(TOKEN.encode(), "none").view(None)
    # Without a configured token, credentials are refused rather than quietly ignored.
    with pytest.raises(AuthError) as info:
        MetricsAccess(None).view(f"Bearer {TOKEN}")
    assert info.value.reason == "no_token_configured"
    with pytest.raises(ValueError, match="anonymous"):
        MetricsAccess(None, "open")


def test_token_file_checks(tmp_path: Path) -> None:
    path = tmp_path / "metrics.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match="metrics token file .* mode 0644.*chmod 600"):
        load_token(path)
    path.chmod(0o600)
    assert load_token(path) == TOKEN.encode()  # trimmed, as Prometheus trims its credentials_file
    for bad, message in ((b"short", "at least 16"), (b"with a space inside it", "printable ASCII")):
        path.write_bytes(bad)
        with pytest.raises(KeyFileError, match=message):
            load_token(path)
    with pytest.raises(KeyFileError, match="does not exist.*--generate-key"):
        load_token(tmp_path / "none")
    generate_key_file(tmp_path / "new.token")
    assert len(load_token(tmp_path / "new.token")) >= 16


# ---- the agent ------------------------------------------------------------------------------------------------


def agent_app(access: MetricsAccess) -> AgentApp:
    sampler = StubSampler(node_report(JobHistory(60.0), 100.0, running=True))  # GPU 0 runs job 42 of alice, nlp
    return AgentApp(sampler, RequestVerifier(KEY), metrics_access=access)


async def get(s: aiohttp.ClientSession, server: BaseTestServer, path: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with s.get(server.make_url(path), headers=headers) as resp:
        return resp.status, await resp.text()


def test_agent_metrics_need_the_token_for_job_user_and_account() -> None:
    async def main() -> None:
        async with TestServer(agent_app(MetricsAccess(TOKEN.encode())).build_metrics(), host="127.0.0.1") as server, \
                aiohttp.ClientSession() as s:
            status, text = await get(s, server, "/metrics")
            assert status == 200
            reduced = parse(text)
            assert per_job_labels(reduced) == set() and "alice" not in text and "nlp" not in text
            assert not any(name.startswith("slurm_elastic_job_") for name in reduced)
            # node- and GPU-level series stay: the cluster utilization panel works without the token
            assert {lab["gpu"] for lab in reduced["DCGM_FI_DEV_GPU_UTIL"]} == {"0"}
            assert reduced["slurm_elastic_agent_nvml_up"] == [{"node": "n1"}]

            for wrong in (TOKEN + "x", "", "other-token-of-enough-length"):
                status, text = await get(s, server, "/metrics", wrong)
                assert status == 401 and "DCGM" not in text and "n1" not in text

            status, text = await get(s, server, "/metrics", TOKEN)
            assert status == 200
            full = parse(text)
            assert per_job_labels(full) == {"job", "user", "account"}
            assert {"job": "42", "user": "alice", "account": "nlp"}.items() <= full["DCGM_FI_DEV_GPU_UTIL"][0].items()
            assert full["slurm_elastic_job_gpus_allocated"][0]["user"] == "alice"

    asyncio.run(main())


def test_agent_anonymous_none_and_all() -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            async with TestServer(agent_app(MetricsAccess(TOKEN.encode(), "none")).build_metrics(),
                                  host="127.0.0.1") as server:
                status, _ = await get(s, server, "/metrics")
                assert status == 401
                assert (await get(s, server, "/metrics", TOKEN))[0] == 200
            async with TestServer(agent_app(MetricsAccess(None, "all")).build_metrics(), host="127.0.0.1") as server:
                status, text = await get(s, server, "/metrics")
                assert status == 200 and per_job_labels(parse(text)) == {"job", "user", "account"}

    asyncio.run(main())


def test_agent_api_listener_serves_no_metrics() -> None:
    async def main() -> None:
        async with TestServer(agent_app(MetricsAccess(None, "all")).build(), host="127.0.0.1") as server, \
                aiohttp.ClientSession() as s:
            assert (await get(s, server, "/metrics"))[0] == 404
            assert (await get(s, server, "/healthz"))[0] == 503  # routed: the stub sample is stale

    asyncio.run(main())


def test_agent_metrics_listener_binds_localhost_by_default() -> None:
    config = load_config(None, {}, "n1")
    assert config.metrics_listen == "127.0.0.1"
    metrics_port = free_port()

    async def main() -> None:
        stop = asyncio.Event()
        ready = asyncio.Event()
        app = agent_app(MetricsAccess(None))
        task = asyncio.create_task(serve(app, "127.0.0.1", free_port(), stop, lambda _: ready.set(),
                                         metrics=(config.metrics_listen, metrics_port)))
        await asyncio.wait_for(ready.wait(), 30)
        try:
            assert listening_addresses(metrics_port) == {"127.0.0.1"}
            async with aiohttp.ClientSession() as s, \
                    s.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
                assert resp.status == 200 and "DCGM_FI_DEV_GPU_UTIL" in await resp.text()
        finally:
            stop.set()
            await task

    asyncio.run(main())


def test_agent_runs_on_when_the_metrics_port_is_taken(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]

        async def main() -> None:
            stop, ready = asyncio.Event(), asyncio.Event()
            task = asyncio.create_task(serve(agent_app(MetricsAccess(None)), "127.0.0.1", 0, stop,
                                             lambda _: ready.set(), metrics=("127.0.0.1", busy)))
            await asyncio.wait_for(ready.wait(), 30)
            stop.set()
            await task

        asyncio.run(main())
    assert "running without /metrics" in caplog.text


# ---- the controller ------------------------------------------------------------------------------------------


def controller_metrics() -> ControllerMetrics:
    m = ControllerMetrics()
    m.jobs([(10, "alice", "gpu", 2, 80.0)])
    m.pending({"gpu": [30.0]})
    m.cycles.labels("ok").inc()
    return m


def http_get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token is not None else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 - a local http URL
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        assert e.headers["WWW-Authenticate"].startswith("Bearer ")
        return e.code, e.read().decode()


@contextlib.contextmanager
def controller_serving(tmp_path: Path, extra: str) -> Iterator[tuple[int, ControllerMetrics]]:
    port = free_port()
    cfg = parse_controller_config(f"version = 1\n[metrics]\nport = {port}\n{extra}")
    metrics = controller_metrics()
    server = start_metrics(cfg, metrics)
    assert server is not None
    try:
        yield port, metrics
    finally:
        server.shutdown()
        server.server_close()


def test_controller_defaults_bind_localhost_with_reduced_anonymous_view(tmp_path: Path) -> None:
    cfg = parse_controller_config("version = 1\n")
    assert (cfg.metrics.address, cfg.metrics.port, cfg.metrics.token_file, cfg.metrics.anonymous) == (
        "127.0.0.1", 9818, None, "reduced")
    with controller_serving(tmp_path, "") as (port, _):
        assert listening_addresses(port) == {"127.0.0.1"}
        status, text = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        samples = parse(text)
        assert per_job_labels(samples) == set() and "alice" not in text
        assert "slurm_elastic_job_nodes" not in samples and "slurm_elastic_job_utilization_percent" not in samples
        assert samples["slurm_elastic_pending_jobs"] == [{"partition": "gpu"}]
        assert {"result": "ok"} in samples["slurm_elastic_controller_cycles"]
        # no token is configured: credentials are refused, not ignored
        assert http_get(f"http://127.0.0.1:{port}/metrics", TOKEN)[0] == 401


def test_controller_metrics_with_token(tmp_path: Path) -> None:
    token_file = tmp_path / "metrics.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    with controller_serving(tmp_path, f'token_file = "{token_file}"\n') as (port, _):
        url = f"http://127.0.0.1:{port}/metrics"
        assert "alice" not in http_get(url)[1]
        status, text = http_get(url, TOKEN + "x")
        assert status == 401 and "slurm_elastic" not in text
        status, text = http_get(url, TOKEN)
        assert status == 200
        samples = parse(text)
        assert samples["slurm_elastic_job_nodes"] == [{"jobid": "10", "user": "alice", "partition": "gpu"}]
        assert "slurm_elastic_controller_cycles" in samples
    with controller_serving(tmp_path, f'token_file = "{token_file}"\nanonymous = "none"\n') as (port, _):
        assert http_get(f"http://127.0.0.1:{port}/metrics")[0] == 401
        assert http_get(f"http://127.0.0.1:{port}/metrics", TOKEN)[0] == 200


def test_controller_metrics_config_is_checked(tmp_path: Path) -> None:
    for text, message in (('anonymous = "open"', "metrics.anonymous: one of reduced, none, all"),
                          ('address = ""', "metrics.address: must not be empty"),
                          ("token_file = 5", "metrics.token_file: wrong type")):
        with pytest.raises(ConfigError, match=message):
            parse_controller_config(f"version = 1\n[metrics]\n{text}\n")
    loose = tmp_path / "loose.token"
    loose.write_text(TOKEN)
    loose.chmod(0o644)
    cfg = parse_controller_config(f'version = 1\n[metrics]\nport = {free_port()}\ntoken_file = "{loose}"\n')
    with pytest.raises(KeyFileError, match="0644"):
        start_metrics(cfg, controller_metrics())
    assert start_metrics(replace(cfg, metrics=replace(cfg.metrics, port=0)), controller_metrics()) is None
