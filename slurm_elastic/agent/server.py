"""The agent's HTTP side (aiohttp): ``GET /v1/node`` (signed requests only), ``GET /healthz``, and with a
:class:`~slurm_elastic.agent.mig_service.MigService`: ``GET /v1/mig`` and ``POST /v1/mig/apply`` (signed), on the
listener the controller reaches; ``GET /metrics`` on a listener of its own (``metrics_listen``, 127.0.0.1 unless
opened), whose series with job/user/account labels need the metrics token (:class:`MetricsAccess`).

Sampling runs in a worker thread on a fixed-rate schedule, so a slow or hung NVML never stalls serving: requests
always get the latest complete sample, whose JSON is encoded once per sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from slurm_elastic.agent.auth import HEADER_SIGNATURE, MetricsAccess, Verifier
from slurm_elastic.agent.errors import AuthError
from slurm_elastic.agent.metrics import CONTENT_TYPE, AgentCounters, ReportCollector, make_registry, render
from slurm_elastic.agent.mig_service import MigService
from slurm_elastic.agent.payload import NODE_PATH, NodeReport
from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.mig import wire
from slurm_elastic.mig.apply import MigApplyError
from slurm_elastic.mig.errors import LayoutError

log = logging.getLogger("slurm_elastic.agent")


def _json(status: int, obj: object, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=json.dumps(obj).encode(), content_type="application/json",
                        headers=headers)


class ReportSampler(Protocol):
    """What the app and its sampling loop use of a sampler; :class:`~slurm_elastic.agent.sampler.Sampler` is one."""

    @property
    def node(self) -> str: ...

    @property
    def interval_s(self) -> float: ...

    def sample_once(self) -> object: ...

    def latest(self) -> tuple[NodeReport | None, bytes | None]: ...

    def snapshot(self) -> tuple[NodeReport | None, AgentCounters]: ...


class AgentApp:
    def __init__(self, sampler: ReportSampler, verifier: Verifier, *, metrics_access: MetricsAccess | None = None,
                 clock: Callable[[], float] = time.time, mig: MigService | None = None) -> None:
        self.sampler = sampler
        self.mig = mig
        self.verifier = verifier
        self.metrics_access = metrics_access or MetricsAccess()
        self._clock = clock
        self.registries = {
            "full": make_registry(ReportCollector(sampler.node, sampler.snapshot)),
            "reduced": make_registry(ReportCollector(sampler.node, sampler.snapshot, per_job=False)),
        }

    def build(self) -> web.Application:
        """The controller's side: signed JSON and the health check."""
        app = web.Application(client_max_size=64 * 1024)
        app.router.add_get(NODE_PATH, self.handle_node)
        app.router.add_get("/healthz", self.handle_health)
        app.router.add_get(wire.MIG_PATH, self.handle_mig)
        app.router.add_post(wire.APPLY_PATH, self.handle_mig_apply)
        return app

    def build_metrics(self) -> web.Application:
        """Prometheus' side: ``/metrics`` and the health check."""
        app = web.Application(client_max_size=4 * 1024)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_get("/healthz", self.handle_health)
        return app

    async def _authenticate(self, request: web.Request) -> str | web.Response:
        body = await request.read()
        args = (request.method, request.raw_path, request.headers, body, self._clock())
        try:
            if self.verifier.blocking:
                return await asyncio.to_thread(self.verifier.verify, *args)
            return self.verifier.verify(*args)
        except AuthError as exc:
            log.info("401 for %s %s from %s: %s", request.method, request.raw_path, request.remote, exc.reason)
            return _json(401, {"error": "unauthorized", "reason": exc.reason},
                         {"WWW-Authenticate": f'{self.verifier.scheme} error="{exc.reason}"'})

    async def _signature(self, request_id: str, body: bytes) -> dict[str, str]:
        if self.verifier.blocking:
            return {HEADER_SIGNATURE: await asyncio.to_thread(self.verifier.sign_response, request_id, body)}
        return {HEADER_SIGNATURE: self.verifier.sign_response(request_id, body)}

    async def handle_node(self, request: web.Request) -> web.Response:
        nonce = await self._authenticate(request)
        if isinstance(nonce, web.Response):
            return nonce
        _, body = self.sampler.latest()
        if body is None:
            return _json(503, {"error": "no_sample_yet"})
        return web.Response(body=body, content_type="application/json", headers=await self._signature(nonce, body))

    async def _signed(self, status: int, obj: object, nonce: str) -> web.Response:
        body = wire.dumps(obj)
        return web.Response(status=status, body=body, content_type="application/json",
                            headers=await self._signature(nonce, body))

    async def handle_mig(self, request: web.Request) -> web.Response:
        nonce = await self._authenticate(request)
        if isinstance(nonce, web.Response):
            return nonce
        if self.mig is None:
            return await self._signed(
                404, {"error": "mig_unavailable", "message": "this agent serves no MIG endpoints"}, nonce)
        try:
            report = await asyncio.to_thread(self.mig.report)
        except SlurmElasticError as exc:
            return await self._signed(500, {"error": "mig_read_failed", "message": str(exc)}, nonce)
        return await self._signed(200, wire.report_to_obj(report), nonce)

    async def handle_mig_apply(self, request: web.Request) -> web.Response:
        """Apply a layout: only what is missing is done, so a repeated request changes nothing (idempotent)."""
        nonce = await self._authenticate(request)
        if isinstance(nonce, web.Response):
            return nonce
        if self.mig is None or not self.mig.allow_apply:
            return await self._signed(
                403, {"error": "mig_apply_disabled", "message": "mig_apply is off on this agent"}, nonce)
        try:
            layout = wire.apply_request_from_obj(wire.loads(await request.read()))
        except wire.MigWireError as exc:
            return await self._signed(400, {"error": "bad_request", "message": str(exc)}, nonce)
        log.info("MIG apply requested from %s: %s", request.remote, wire.node_layout_to_obj(layout))
        try:
            answer = await asyncio.to_thread(self.mig.apply, layout)
        except LayoutError as exc:
            return await self._signed(400, {"error": "invalid_layout", "message": str(exc), "problems": [
                {"code": p.code.value, "message": p.message} for p in exc.problems]}, nonce)
        except MigApplyError as exc:
            log.error("MIG apply failed: %s", exc)
            return await self._signed(
                409, {"error": "apply_failed", "message": str(exc), "changes": list(exc.changes)}, nonce)
        except SlurmElasticError as exc:
            log.error("MIG apply failed: %s", exc)
            return await self._signed(500, {"error": "apply_failed", "message": str(exc), "changes": []}, nonce)
        return await self._signed(200, wire.answer_to_obj(answer), nonce)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        try:
            view = self.metrics_access.view(request.headers.get("Authorization"))
        except AuthError as exc:
            log.info("401 for /metrics from %s: %s", request.remote, exc.reason)
            return web.Response(status=401, text=f"unauthorized: {exc.reason}\n", headers={
                "WWW-Authenticate": f'Bearer realm="slurm-elastic metrics", error="{exc.reason}"'})
        body = await asyncio.to_thread(render, self.registries[view])
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def handle_health(self, request: web.Request) -> web.Response:
        """Liveness without data: 200 while samples are fresh (three intervals), 503 otherwise."""
        report, _ = self.sampler.latest()
        fresh = report is not None and report.sampled_at is not None and \
            self._clock() - report.sampled_at <= 3 * self.sampler.interval_s
        return web.Response(status=200 if fresh else 503, text="ok\n" if fresh else "stale\n")


async def sample_forever(sampler: ReportSampler, stop: asyncio.Event) -> None:
    """Samples at a fixed rate (missed ticks are skipped, not bunched up); one failure never stops the loop."""
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while not stop.is_set():
        try:
            await asyncio.to_thread(sampler.sample_once)
        except Exception:  # a bug in one sample must not kill the agent; it is logged with its traceback
            log.exception("sample failed")
        next_at += sampler.interval_s
        now = loop.time()
        if next_at < now:
            next_at = now + sampler.interval_s - (now - next_at) % sampler.interval_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=next_at - now)


async def _listen(application: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """A started runner and the port it got (``port`` 0 picks a free one)."""
    runner = web.AppRunner(application, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    bound = port
    server = getattr(site, "_server", None)
    if server is not None and getattr(server, "sockets", None):
        bound = server.sockets[0].getsockname()[1]
    return runner, bound


async def serve(app: AgentApp, host: str, port: int, stop: asyncio.Event | None = None,
                ready: Callable[[int], None] | None = None, *,
                metrics: tuple[str, int] | None = None) -> None:
    """Serves until ``stop`` is set or SIGTERM/SIGINT arrives. ``ready(port)`` is called once listening.

    ``metrics`` (address, port) adds the ``/metrics`` listener. Failing to bind it is logged and the agent runs
    on without it: the controller's side matters more than telemetry (the controller does the same)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    runner, bound = await _listen(app.build(), host, port)
    runners = [runner]
    log.info("agent for node %s listening on %s:%d", app.sampler.node, host, bound)
    if metrics is not None:
        m_host, m_port = metrics
        try:
            m_runner, m_bound = await _listen(app.build_metrics(), m_host, m_port)
        except OSError as exc:
            log.error("metrics: cannot listen on %s:%d: %s; running without /metrics", m_host, m_port,
                      exc.strerror or exc)
        else:
            runners.append(m_runner)
            log.info("metrics on http://%s:%d/metrics (without a token: %s)", m_host, m_bound,
                     app.metrics_access.anonymous)
    if ready:
        ready(bound)
    sampling = asyncio.create_task(sample_forever(app.sampler, stop))
    try:
        await stop.wait()
    finally:
        await sampling
        for r in runners:
            await r.cleanup()
