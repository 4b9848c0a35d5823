"""Wall time of the controller's collection from 2,000 agents on loopback, served by a few processes.

Each simulated agent is the real ``AgentApp`` (signed ``GET /v1/node``: HMAC check, replay cache, signed answer)
on its own loopback port, serving the JSON of a realistic report (8 GPUs, 2 jobs of 4 GPUs, a 60 s window of
5 s samples, built by the agent's own attribution and aggregation code). ``--servers`` processes host them
(2,000 / servers each). The controller side runs, per cycle:

* **collect**: ``slurm_elastic.controller.collect.collect`` (a fresh ``AgentClient`` per cycle, as the controller
  does: new connections, signed requests, signature check of each answer, payload validation);
* **raw GET** (the baseline, same run): plain aiohttp GETs of the same bodies from the same servers (an extra
  unauthenticated route), with the same concurrency and a fresh session per cycle, no signing, no checks;
* **serial estimate**: one signed, validated fetch of one agent at a time (median of ``--single`` fetches)
  times the number of agents: what a controller asking agents one after the other would take.

``--auth munge`` runs the same with MUNGE authentication (SE-MUNGE: a credential per request made by the
controller side, decoded by each agent, and one per answer made by the agent and decoded by the controller side,
all through the munged on ``--munge-socket``, as this process's uid); compare its ``x raw GET`` with a default
run's to get the cost of MUNGE over the shared key.

``--delay-ms`` and ``--loss-pct`` stand in for a slow, lossy link to every agent (this machine's kernel has no
sch_netem): each answer waits the delay before it is written, and that share of answers (seeded) waits
``--retransmit-s`` more (default 1 s: what a lost SYN cost on the namespace cluster, docs/reliability.md N4). Both
the raw GET and the collect pay it, so the ratio stays a same-run comparison; the wall time is what degrades.

Target: at most 3 s per collection cycle. Loopback only; every loop is bounded in count and time.

    .venv/bin/python bench/agent_fanout.py [--agents 2000] [--servers 3] [--cycles 3] [--concurrency 64]
        [--auth hmac|munge] [--munge-socket /run/munge/munge.socket.2]
        [--delay-ms 200] [--loss-pct 5] [--retransmit-s 1]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import queue
import random
import secrets
import statistics
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_elastic.agent.aggregate import JobHistory  # noqa: E402
from slurm_elastic.agent.attribution import attribute  # noqa: E402
from slurm_elastic.agent.auth import ClientAuth, HmacClientAuth, RequestVerifier, Verifier  # noqa: E402
from slurm_elastic.agent.client import AgentClient  # noqa: E402
from slurm_elastic.agent.model import DeviceReading, GpuAllocation, JobRef, ProcessReading  # noqa: E402
from slurm_elastic.agent.munge import Munge  # noqa: E402
from slurm_elastic.agent.munge_auth import MungeClientAuth, MungeRequestVerifier  # noqa: E402
from slurm_elastic.agent.payload import NodeReport, NvmlInfo, to_json_bytes  # noqa: E402
from slurm_elastic.agent.server import AgentApp  # noqa: E402
from slurm_elastic.controller.collect import collect  # noqa: E402

HOST = "127.0.0.1"
GPUS = 8
MAX_SERVE_S = 600.0  # a server process never outlives this, whatever happens to the parent
CYCLE_TIMEOUT_S = 60.0


def node_report(index: int, now: float) -> NodeReport:
    """A busy 8-GPU node: two 4-GPU jobs, one process per GPU, twelve 5 s samples in the window."""
    node = f"node{index:05d}"
    jobs = (100_000 + 2 * index, 100_001 + 2 * index)
    allocations = {g: GpuAllocation(g, jobs[g // 4], 2000 + index % 50, f"u{index % 50}", f"acct{index % 7}")
                   for g in range(GPUS)}
    pids = {10_000 + g: JobRef(jobs[g // 4], "cgroup") for g in range(GPUS)}
    history = JobHistory(60.0)
    gpus = ()
    for k in range(12):
        t = now - 55.0 + 5.0 * k
        devices = [
            DeviceReading(str(g), "gpu", g, f"GPU-{index}-{g}", "NVIDIA H100 80GB HBM3", g, 60_000, 81_559,
                          float((index + g + k) % 100), None, processes=(ProcessReading(10_000 + g, 59_000, None),))
            for g in range(GPUS)
        ]
        gpus, points = attribute(devices, allocations, pids)
        history.add(t, points)
    return NodeReport(node=node, agent_version="bench", generated_at=now, sampled_at=now, interval_s=5.0,
                      window_s=60.0, nvml=NvmlInfo("ok", "550.54.15", None), gpus=gpus, jobs=history.jobs(now),
                      errors=())


class _StubSampler:
    """What AgentApp needs of a sampler: the latest report and its JSON."""

    interval_s = 5.0

    def __init__(self, report: NodeReport) -> None:
        self.node = report.node
        self._report, self._body = report, to_json_bytes(report)

    def latest(self) -> tuple[NodeReport | None, bytes | None]:
        return self._report, self._body

    def snapshot(self) -> NodeReport:
        return self._report


def _verifier(key: bytes, munge_socket: str | None) -> Verifier:
    """The shared key's check, or MUNGE's (the controller side runs as our uid too)."""
    if munge_socket is None:
        return RequestVerifier(key)
    return MungeRequestVerifier(Munge(munge_socket), os.geteuid())


def _client_auth(key: bytes, munge_socket: str | None) -> ClientAuth:
    return HmacClientAuth(key) if munge_socket is None else MungeClientAuth(Munge(munge_socket), os.geteuid())


def _slow_link(delay_s: float, loss: float, retransmit_s: float, rng: random.Random) -> object:
    """aiohttp middleware: every answer waits ``delay_s``; a ``loss`` share waits ``retransmit_s`` more."""
    @web.middleware
    async def middleware(request: web.Request, handler: object) -> web.StreamResponse:
        wait = delay_s + (retransmit_s if rng.random() < loss else 0.0)
        if wait > 0:
            await asyncio.sleep(wait)
        return await handler(request)  # type: ignore[operator,no-any-return]
    return middleware


async def _serve(shard: int, indices: list[int], secret: tuple[bytes, str | None],
                 ports: mp.Queue[tuple[int, list[int]] | str], stop: mp.Event,  # type: ignore[type-arg]
                 *, link: tuple[float, float, float] = (0.0, 0.0, 1.0)) -> None:
    runners: list[web.AppRunner] = []
    bound: list[int] = []
    now = time.time()
    rng = random.Random(20261201 + shard)
    try:
        for index in indices:
            sampler = _StubSampler(node_report(index, now))
            app = AgentApp(sampler, _verifier(*secret)).build()  # type: ignore[arg-type]
            if link[0] > 0 or link[1] > 0:
                app.middlewares.append(_slow_link(*link, rng))  # type: ignore[arg-type]
            body = sampler.latest()[1] or b""

            async def raw(_: web.Request, body: bytes = body) -> web.Response:
                return web.Response(body=body, content_type="application/json")

            app.router.add_get("/raw", raw)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, HOST, 0, backlog=1024)
            await site.start()
            runners.append(runner)
            bound.append(runner.addresses[0][1])
        ports.put((shard, bound))
        deadline = time.monotonic() + MAX_SERVE_S
        while not stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        for runner in runners:
            await runner.cleanup()


def _server_main(shard: int, indices: list[int], secret: tuple[bytes, str | None],
                 ports: mp.Queue[tuple[int, list[int]] | str], stop: mp.Event,  # type: ignore[type-arg]
                 *, link: tuple[float, float, float] = (0.0, 0.0, 1.0)) -> None:
    try:
        asyncio.run(_serve(shard, indices, secret, ports, stop, link=link))
    except Exception as exc:  # report, so the parent does not wait for ports that never come
        ports.put(f"server failed: {type(exc).__name__}: {exc}")


async def _raw_cycle(urls: list[str], concurrency: int) -> tuple[int, int]:
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as session:
        async def one(url: str) -> int:
            async with sem, session.get(url + "/raw", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                return len(await resp.read())
        sizes = await asyncio.gather(*(one(u) for u in urls))
    return len(sizes), sum(sizes)


async def _single(url: str, auth: ClientAuth, count: int) -> list[float]:
    times: list[float] = []
    for _ in range(count):
        async with AgentClient(auth) as client:  # a fresh connection, as one agent of a cycle gets
            start = time.perf_counter()
            await client.fetch(url)
            times.append(time.perf_counter() - start)
    return times


def _timed(coro_factory: object, limit_s: float = CYCLE_TIMEOUT_S) -> tuple[float, float, object]:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    out = asyncio.run(asyncio.wait_for(coro_factory, limit_s))  # type: ignore[arg-type]
    return time.perf_counter() - wall0, time.process_time() - cpu0, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=2000)
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--single", type=int, default=50)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--auth", choices=("hmac", "munge"), default="hmac")
    ap.add_argument("--munge-socket", default="/run/munge/munge.socket.2")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="every answer waits this long (a slow link)")
    ap.add_argument("--loss-pct", type=float, default=0.0, help="this share of answers also waits --retransmit-s")
    ap.add_argument("--retransmit-s", type=float, default=1.0)
    args = ap.parse_args()
    if not (0 <= args.delay_ms <= 10_000 and 0 <= args.loss_pct <= 100 and 0 <= args.retransmit_s <= 10):
        ap.error("--delay-ms 0..10000, --loss-pct 0..100, --retransmit-s 0..10")
    link = (args.delay_ms / 1000, args.loss_pct / 100, args.retransmit_s)
    n_agents = max(1, min(args.agents, 10_000))
    n_servers = max(1, min(args.servers, 16))
    cycles = max(1, min(args.cycles, 20))
    key = secrets.token_bytes(32)
    munge_socket = args.munge_socket if args.auth == "munge" else None
    auth = _client_auth(key, munge_socket)
    ctx = mp.get_context("spawn")
    ports_q: mp.Queue[tuple[int, list[int]] | str] = ctx.Queue()
    stop = ctx.Event()
    shards = [list(range(i, n_agents, n_servers)) for i in range(n_servers)]
    procs = [ctx.Process(target=_server_main, args=(i, shard, (key, munge_socket), ports_q, stop),
                         kwargs={"link": link}, daemon=True)
             for i, shard in enumerate(shards)]
    setup0 = time.perf_counter()
    for p in procs:
        p.start()
    try:
        agents: dict[str, str] = {}
        for _ in shards:
            got = ports_q.get(timeout=300)
            if isinstance(got, str):
                print(got, file=sys.stderr)
                return 2
            shard_id, bound = got
            for index, port in zip(shards[shard_id], bound, strict=True):
                agents[f"node{index:05d}"] = f"http://{HOST}:{port}"
        agents = dict(sorted(agents.items()))
        print(f"{len(agents)} agents on {n_servers} server processes, ready in {time.perf_counter() - setup0:.1f} s; "
              f"{cycles} cycles, concurrency {args.concurrency}, auth {auth.scheme}; link delay "
              f"{args.delay_ms:g} ms, {args.loss_pct:g}% answers +{args.retransmit_s:g} s")
        urls = list(agents.values())
        single = asyncio.run(asyncio.wait_for(_single(urls[0], auth, max(1, min(args.single, 1000))),
                                              CYCLE_TIMEOUT_S))
        rows: dict[str, list[tuple[float, float]]] = {"raw GET": [], "collect": []}
        bad = 0
        body_bytes = 0
        limit_s = max(CYCLE_TIMEOUT_S, 0.02 * len(agents))  # a bound that still stops a stuck cycle
        for _ in range(cycles):
            wall, cpu, got_raw = _timed(_raw_cycle(urls, args.concurrency), limit_s)
            rows["raw GET"].append((wall, cpu))
            body_bytes = got_raw[1]  # type: ignore[index]
            print(f"  raw GET {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
            wall, cpu, res = _timed(collect(agents, auth, timeout_s=10.0), limit_s)
            print(f"  collect {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
            rows["collect"].append((wall, cpu))
            bad += len(res.errors)  # type: ignore[attr-defined]
            if res.errors:  # type: ignore[attr-defined]
                print("errors:", list(res.errors.items())[:3], file=sys.stderr)  # type: ignore[attr-defined]
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        try:
            while True:
                ports_q.get_nowait()
        except queue.Empty:
            pass
    raw_wall = statistics.median(w for w, _ in rows["raw GET"])
    serial = statistics.median(single) * len(agents)
    print(f"answers of {body_bytes / len(agents) / 1024:.1f} KiB each, {body_bytes / 1e6:.1f} MB per cycle")
    print(f"{'per cycle':<40}{'wall s':>8}{'client CPU s':>14}{'x raw GET':>11}")
    for label in ("raw GET", "collect"):
        wall = statistics.median(w for w, _ in rows[label])
        cpu = statistics.median(c for _, c in rows[label])
        print(f"{label:<40}{wall:>8.2f}{cpu:>14.2f}{wall / raw_wall:>11.2f}")
    print(f"{'serial estimate (one fetch x agents)':<40}{serial:>8.2f}{'':>14}{serial / raw_wall:>11.2f}")
    collect_wall = statistics.median(w for w, _ in rows["collect"])
    print(f"collect: {collect_wall:.2f} s per cycle for {len(agents)} agents (target <= 3 s), "
          f"{serial / collect_wall:.1f}x faster than one at a time; {bad} errors")
    return 0 if collect_wall <= 3.0 and bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
