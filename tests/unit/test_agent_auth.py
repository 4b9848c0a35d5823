"""Authentication end to end: key file checks, signed requests, 401s, replay and staleness, the client."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from slurm_elastic.agent.auth import (
    HEADER_NONCE,
    HEADER_SIGNATURE,
    RequestVerifier,
    generate_key_file,
    load_key,
    sign_request,
    sign_response,
)
from slurm_elastic.agent.client import AgentClient
from slurm_elastic.agent.errors import (
    AgentAuthError,
    AgentClientError,
    AgentHttpError,
    AgentPayloadError,
    AgentTimeoutError,
    AgentUnreachableError,
    AuthError,
    KeyFileError,
)
from slurm_elastic.agent.metrics import AgentCounters
from slurm_elastic.agent.payload import NODE_PATH, NodeReport, NvmlInfo, to_json_bytes
from slurm_elastic.agent.server import AgentApp

KEY = b"k" * 48
OTHER = b"o" * 48


# ---- the key file -----------------------------------------------------------------------------------------


def test_key_file_must_be_private(tmp_path: Path) -> None:
    key = tmp_path / "agent.key"
    key.write_bytes(KEY + b"\n")
    for mode in (0o644, 0o640, 0o604, 0o660):
        key.chmod(mode)
        with pytest.raises(KeyFileError, match=f"mode {mode:04o}.*chmod 600"):
            load_key(key)
    key.chmod(0o600)
    assert load_key(key) == KEY
    key.chmod(0o400)
    assert load_key(key) == KEY


def test_key_file_problems_are_clear(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="does not exist.*--generate-key"):
        load_key(tmp_path / "nope")
    short = tmp_path / "short"
    short.write_bytes(b"tooshort")
    short.chmod(0o600)
    with pytest.raises(KeyFileError, match="at least 32"):
        load_key(short)
    with pytest.raises(KeyFileError, match="not a regular file"):
        load_key(tmp_path)


def test_generated_key_is_private_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "new.key"
    generate_key_file(path)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert len(load_key(path)) >= 32
    with pytest.raises(FileExistsError):
        generate_key_file(path)


# ---- the verifier (pure, explicit clock) ------------------------------------------------------------------


def test_verifier_accepts_once_and_refuses_replay_stale_and_forged() -> None:
    v = RequestVerifier(KEY, max_skew_s=30)
    h = sign_request(KEY, "GET", NODE_PATH, b"", now=1000.0)
    assert v.verify("GET", NODE_PATH, h, b"", now=1005.0) == h[HEADER_NONCE]
    cases: list[tuple[dict[str, str], str, float, str]] = [
        (h, NODE_PATH, 1006.0, "replayed_nonce"),
        (sign_request(KEY, "GET", NODE_PATH, b"", now=900.0), NODE_PATH, 1000.0, "stale_timestamp"),
        (sign_request(KEY, "GET", NODE_PATH, b"", now=1100.0), NODE_PATH, 1000.0, "stale_timestamp"),
        (sign_request(OTHER, "GET", NODE_PATH, b"", now=1000.0), NODE_PATH, 1000.0, "bad_signature"),
        (sign_request(KEY, "GET", "/metrics", b"", now=1000.0), NODE_PATH, 1000.0, "bad_signature"),
        ({}, NODE_PATH, 1000.0, "missing_credentials"),
        ({**sign_request(KEY, "GET", NODE_PATH, b"", now=1000.0), "Authorization": "Basic Zm9v"}, NODE_PATH, 1000.0,
         "malformed_credentials"),
        (sign_request(KEY, "GET", NODE_PATH, b"", now=1000.0, nonce="short"), NODE_PATH, 1000.0,
         "malformed_credentials"),
    ]
    for headers, path, now, reason in cases:
        with pytest.raises(AuthError) as info:
            v.verify("GET", path, headers, b"", now=now)
        assert info.value.reason == reason


def test_forged_requests_do_not_fill_the_replay_cache() -> None:
    v = RequestVerifier(KEY, max_nonces=3)
    for _ in range(10):
        with pytest.raises(AuthError):
            v.verify("GET", NODE_PATH, sign_request(OTHER, "GET", NODE_PATH, b"", now=0.0), b"", now=0.0)
    for t in range(3):
        v.verify("GET", NODE_PATH, sign_request(KEY, "GET", NODE_PATH, b"", now=float(t)), b"", now=float(t))
    with pytest.raises(AuthError) as info:  # full of live nonces: fail closed
        v.verify("GET", NODE_PATH, sign_request(KEY, "GET", NODE_PATH, b"", now=3.0), b"", now=3.0)
    assert info.value.reason == "too_many_requests"
    # Once the window has passed, old nonces are forgotten and requests are accepted again.
    v.verify("GET", NODE_PATH, sign_request(KEY, "GET", NODE_PATH, b"", now=100.0), b"", now=100.0)


# ---- the server and the client ----------------------------------------------------------------------------


def report(node: str = "n1") -> NodeReport:
    return NodeReport(node=node, agent_version="0.1.0", generated_at=time.time(), sampled_at=time.time(),
                      interval_s=5.0, window_s=60.0, nvml=NvmlInfo("ok", "550.54.15", None), gpus=(), jobs=(),
                      errors=())


class StubSampler:
    """What AgentApp needs of a sampler: the latest report and counters."""

    node = "n1"
    interval_s = 5.0

    def __init__(self, r: NodeReport | None) -> None:
        self.r = r

    def sample_once(self) -> None:
        """The serving loop's tick: the report is fixed."""

    def latest(self) -> tuple[NodeReport | None, bytes | None]:
        return self.r, to_json_bytes(self.r) if self.r else None

    def snapshot(self) -> tuple[NodeReport | None, AgentCounters]:
        return self.r, AgentCounters(samples_total=1)


def run(coro_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(coro_fn())


def agent(r: NodeReport | None = None, *, key: bytes = KEY) -> TestServer:
    app = AgentApp(StubSampler(r or report()), RequestVerifier(key))
    return TestServer(app.build(), host="127.0.0.1")


def test_signed_request_gets_the_verified_payload() -> None:
    async def main() -> None:
        async with agent() as server, AgentClient(KEY, timeout_s=10) as client:
            got = await client.fetch(str(server.make_url("/")))
            assert got.node == "n1"

    run(main)


def test_unauthenticated_and_wrong_requests_get_401_and_no_data() -> None:
    async def main() -> None:
        async with agent() as server, aiohttp.ClientSession() as s:
            url = str(server.make_url(NODE_PATH))
            attempts = [
                {},
                sign_request(OTHER, "GET", NODE_PATH, b"", now=time.time()),
                sign_request(KEY, "GET", NODE_PATH, b"", now=time.time() - 3600),
                sign_request(KEY, "GET", "/v1/other", b"", now=time.time()),
            ]
            for headers in attempts:
                async with s.get(url, headers=headers) as resp:
                    body = await resp.read()
                    assert resp.status == 401
                    assert resp.headers["WWW-Authenticate"].startswith("SE-HMAC-SHA256 error=")
                    assert set(json.loads(body)) == {"error", "reason"}
                    assert b"n1" not in body and HEADER_SIGNATURE not in resp.headers
            good = sign_request(KEY, "GET", NODE_PATH, b"", now=time.time())
            async with s.get(url, headers=good) as resp:
                assert resp.status == 200
            async with s.get(url, headers=good) as resp:  # the same request again: a replay
                assert resp.status == 401
                assert json.loads(await resp.read())["reason"] == "replayed_nonce"

    run(main)


def test_client_errors_are_typed_and_the_fan_out_never_raises() -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="late")

    async def junk(request: web.Request) -> web.Response:
        body = b'{"schema": "something else"}'
        nonce = request.headers[HEADER_NONCE]
        return web.Response(body=body, headers={HEADER_SIGNATURE: sign_response(KEY, nonce, body)})

    async def unsigned(request: web.Request) -> web.Response:
        return web.Response(body=to_json_bytes(report()), content_type="application/json")

    async def boom(request: web.Request) -> web.Response:
        return web.Response(status=500, text="internal")

    def app_with(handler: Callable[[web.Request], Awaitable[web.Response]]) -> TestServer:
        app = web.Application()
        app.router.add_get(NODE_PATH, handler)
        return TestServer(app, host="127.0.0.1")

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]  # nothing listens once the socket is closed

    async def main() -> None:
        servers = {"good": agent(), "other-key": agent(key=OTHER), "slow": app_with(slow), "junk": app_with(junk),
                   "unsigned": app_with(unsigned), "error": app_with(boom)}
        for s in servers.values():
            await s.start_server()
        try:
            urls = {name: str(s.make_url("/")) for name, s in servers.items()}
            urls["down"] = f"http://127.0.0.1:{closed_port}"
            async with AgentClient(KEY, timeout_s=1.0) as client:
                results = await client.fetch_many(urls)
        finally:
            for s in servers.values():
                await s.close()
        assert isinstance(results["good"], NodeReport)
        expected = {"other-key": AgentAuthError, "slow": AgentTimeoutError, "junk": AgentPayloadError,
                    "unsigned": AgentAuthError, "error": AgentHttpError, "down": AgentUnreachableError}
        for name, cls in expected.items():
            assert isinstance(results[name], cls), (name, results[name])
            assert isinstance(results[name], AgentClientError)
            assert urls[name].rstrip("/") in str(results[name])

    run(main)


def test_health_and_no_sample_yet() -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            async with agent() as server, s.get(server.make_url("/healthz")) as resp:
                assert resp.status == 200
            app = AgentApp(StubSampler(None), RequestVerifier(KEY))
            async with TestServer(app.build(), host="127.0.0.1") as server:
                async with s.get(server.make_url("/healthz")) as resp:
                    assert resp.status == 503
                headers = sign_request(KEY, "GET", NODE_PATH, b"", now=time.time())
                async with s.get(server.make_url(NODE_PATH), headers=headers) as resp:
                    assert resp.status == 503

    run(main)


def test_agent_cli_refuses_a_loose_key_file(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.unit import vgpu_support

    state = tmp_path / "n1.state"
    key = tmp_path / "agent.key"
    key.write_bytes(KEY)
    key.chmod(0o644)
    env = vgpu_support.vgpu_env(state)
    out = subprocess.run([sys.executable, "-c", "from slurm_elastic.cli import main; main()", "agent", "--node", "n1",
                          "--key-file", str(key), "--port", "18999"], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 1
    assert out.stderr.strip() == (f"slurm-elastic agent: error: key file {key} has mode 0644, readable beyond its "
                                  f"owner: chmod 600 {key}")
