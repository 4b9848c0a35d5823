#!/usr/bin/env python3
"""A small HTTP inference service that keeps the elastic contract (serve_http.sbatch; README.md).

Every task (one per node: the leader's nodes and every extension job's) is a **replica**: an aiohttp server
whose ``POST /infer`` runs a tiny CPU model (a numpy matrix-vector product) one request at a time, held to at
least ``--service-ms`` so that a replica's capacity is known (``1000 / service_ms`` requests/s) on a machine
where the CPU is shared. A replica announces itself with a file in the job's serving directory
(``<working dir>/.slurm-elastic/serve-<leader id>/replica-*.json``) once it listens, and removes it when it
stops.

The leader's first task also runs the **router** (``router.json`` in the same directory says where): it
discovers replicas from their files as extension jobs bring them up and take them away, sends each request to
the replica with the fewest requests in flight, and retries a request whose replica went away on another one (a
request is only lost when no replica answers it for ``--request-timeout-s``). Every ``--publish-s`` it
publishes requests/s, p50/p99 latency (of the requests answered in that interval, measured at the router),
queue depth and the replica count with :func:`slurm_elastic.serving.publish`, and logs the same line.

Resizes (slurm_elastic/resize.py): a **grow** notice is acknowledged at once (a new replica joins when it is
up; nothing to checkpoint). A **shrink** notice ``from -> to`` drains the replicas on the nodes the shrink will
release -- the controller's removal order (slurm_elastic/policy/shrink.py): extension jobs newest first, each
from its last node to its first, then the leader's nodes from the last one, never the router's -- i.e. stops
sending them requests, waits until their requests in flight are answered, then acknowledges, so the controller
takes the nodes with nothing in flight there. Drained replicas that are still up when the notice is withdrawn
or its hold expires take requests again. The grace signal (forwarded by slurm_elastic.launch) only wakes the
router to read the notice at once; replicas ignore it.

Addresses: the router and every replica listen on, and advertise, **their node's address in Slurm** (its
``NodeAddr``, from ``scontrol -o show node $SLURMD_NODENAME``: the address Slurm itself reaches the node by, so
it resolves from the other nodes and is the cluster network's), never every interface: on a node with a public and
a cluster interface the service stays on the cluster's. ``SLURM_ELASTIC_SERVE_ADDR`` (an address, or a name with
``{node}`` for the node's name, e.g. ``{node}-ib``), or ``--bind`` / ``--advertise``, sets another; without
Slurm's answer the host name is used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from aiohttp import ClientError, ClientSession, ClientTimeout, web

from slurm_elastic import resize, serving
from slurm_elastic.goodput import DIR_NAME


def log(text: str) -> None:
    print(f"serve[{os.environ.get('SLURMD_NODENAME', '?')}]: {text}", flush=True)


def state_dir() -> Path:
    """The job's state directory: next to the resize notice (the template sets its path), else under $PWD."""
    notice = resize.default_path()
    return Path(notice).parent if notice else Path.cwd() / DIR_NAME


def leader_id() -> str:
    return os.environ.get("SLURM_ELASTIC_PARENT") or os.environ.get("SLURM_JOB_ID", "0")


def serve_dir() -> Path:
    return state_dir() / f"serve-{leader_id()}"


def write_atomic(path: Path, record: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


# --- replica ---------------------------------------------------------------------------------------------------
class Model:
    """The CPU model: y = tanh(W x), W fixed by a seed (the same on every replica)."""

    def __init__(self, size: int) -> None:
        rng = np.random.default_rng(17)
        self.w = rng.standard_normal((size, size)) / np.sqrt(size)
        self.size = size

    def __call__(self, x: list[float] | None) -> float:
        v = np.resize(np.asarray(x if x else [1.0], dtype=float), self.size)
        return float(np.tanh(self.w @ v).sum())


async def run_replica(args: argparse.Namespace) -> tuple[web.AppRunner, Path]:
    model = Model(args.matrix)
    one_at_a_time = asyncio.Lock()
    ident = f"{os.environ.get('SLURM_JOB_ID', '0')}-{os.environ.get('SLURMD_NODENAME', socket.gethostname())}"
    counts = {"inflight": 0, "served": 0}

    async def infer(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        counts["inflight"] += 1
        try:
            async with one_at_a_time:
                started = time.monotonic()
                y = model(body.get("x") if isinstance(body, dict) else None)
                rest = args.service_ms / 1000 - (time.monotonic() - started)
                if rest > 0:
                    await asyncio.sleep(rest)
        finally:
            counts["inflight"] -= 1
        counts["served"] += 1
        return web.json_response({"y": y, "replica": ident})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "replica": ident, **counts})

    app = web.Application()
    app.add_routes([web.post("/infer", infer), web.get("/health", health)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.bind, args.replica_port)
    await site.start()
    port = runner.addresses[0][1]
    url = f"http://{args.advertise}:{port}"
    start = os.environ.get("SLURM_JOB_START_TIME", "")
    record = {"id": ident, "url": url, "node": os.environ.get("SLURMD_NODENAME", ""),
              "job": int(os.environ.get("SLURM_JOB_ID", "0")), "node_index": int(os.environ.get("SLURM_NODEID", "0")),
              "extension": os.environ.get("SLURM_ELASTIC_ROLE") == "extension",
              "job_start": float(start) if start.isdigit() else time.time(), "pid": os.getpid()}
    directory = serve_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"replica-{ident}.json"
    write_atomic(path, record)
    log(f"replica up id={ident} url={url}")
    return runner, path


# --- router ----------------------------------------------------------------------------------------------------
@dataclass
class Replica:
    id: str
    url: str
    node: str
    job: int
    node_index: int
    extension: bool
    job_start: float
    inflight: int = 0
    draining: str | None = None  # the shrink notice's id while drained
    served: int = 0

    def removal_key(self) -> tuple[int, float, int, int]:
        """Sorts in the controller's removal order (policy/shrink.py): extensions newest first, each from its
        last node to its first (node index 0 is its batch host), then the leader's nodes from the last."""
        last = -self.node_index if self.node_index else 1
        if self.extension:
            return (0, -self.job_start, -self.job, last)
        return (1, 0.0, 0, last)


@dataclass
class Window:
    latencies_ms: list[float] = field(default_factory=list)
    failed: int = 0
    retried: int = 0


class Router:
    def __init__(self, args: argparse.Namespace, own_replica: str) -> None:
        self.args = args
        self.own = own_replica  # the router's node never goes (the keep host)
        self.replicas: dict[str, Replica] = {}
        self.changed = asyncio.Event()
        self.waiting = 0  # requests at the router: waiting for a replica or in flight
        self.window = Window()
        self.totals = {"ok": 0, "failed": 0, "retried": 0}
        self.window_start = time.monotonic()
        self.wake = asyncio.Event()
        self.session: ClientSession | None = None
        self.drain_for: str | None = None  # the shrink notice whose replicas were picked to drain

    # discovery
    async def scan(self) -> None:
        seen: set[str] = set()
        for path in sorted(serve_dir().glob("replica-*.json")):
            try:
                d = json.loads(path.read_text())
                rep = Replica(id=str(d["id"]), url=str(d["url"]), node=str(d["node"]), job=int(d["job"]),
                              node_index=int(d["node_index"]), extension=bool(d["extension"]),
                              job_start=float(d["job_start"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            seen.add(rep.id)
            if rep.id not in self.replicas and await self.healthy(rep):
                self.replicas[rep.id] = rep
                log(f"router: replica joined id={rep.id} ({self.active_count()} taking requests)")
                self.changed.set()
        for rid in [r for r in self.replicas if r not in seen]:
            self.drop(rid, "its file is gone")

    def drop(self, rid: str, why: str) -> None:
        if self.replicas.pop(rid, None) is not None:
            log(f"router: replica left id={rid} ({why}; {self.active_count()} taking requests)")

    async def healthy(self, rep: Replica) -> bool:
        assert self.session is not None
        try:
            async with self.session.get(f"{rep.url}/health", timeout=ClientTimeout(total=2)) as r:
                return r.status == 200
        except (TimeoutError, ClientError, OSError):
            return False

    def active(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.draining is None]

    def active_count(self) -> int:
        return len(self.active())

    # requests
    async def pick(self, deadline: float) -> Replica | None:
        while True:
            candidates = self.active()
            if candidates:
                return min(candidates, key=lambda r: (r.inflight, r.served))
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.5))

    async def infer(self, request: web.Request) -> web.Response:
        assert self.session is not None
        body = await request.read()
        started = time.monotonic()
        deadline = started + self.args.request_timeout_s
        self.waiting += 1
        try:
            tries = 0
            while time.monotonic() < deadline:
                rep = await self.pick(deadline)
                if rep is None:
                    break
                tries += 1
                rep.inflight += 1
                try:
                    async with self.session.post(f"{rep.url}/infer", data=body,
                                                 headers={"Content-Type": "application/json"}) as r:
                        payload = await r.read()
                        if r.status == 200:
                            rep.served += 1
                            took = (time.monotonic() - started) * 1000
                            self.window.latencies_ms.append(took)
                            self.totals["ok"] += 1
                            if tries > 1:
                                self.window.retried += 1
                                self.totals["retried"] += 1
                            return web.Response(body=payload, content_type="application/json",
                                                headers={"X-Replica": rep.id, "X-Tries": str(tries)})
                except (TimeoutError, ClientError, OSError) as e:
                    log(f"router: replica {rep.id} failed a request ({type(e).__name__}): retrying elsewhere")
                    self.drop(rep.id, "it failed a request")
                finally:
                    rep.inflight -= 1
            self.window.failed += 1
            self.totals["failed"] += 1
            return web.json_response({"error": "no replica answered"}, status=503)
        finally:
            self.waiting -= 1

    async def status(self, request: web.Request) -> web.Response:
        reps = [{"id": r.id, "node": r.node, "job": r.job, "inflight": r.inflight, "served": r.served,
                 "draining": r.draining} for r in self.replicas.values()]
        return web.json_response({"replicas": reps, "queue_depth": self.waiting, **self.totals})

    # publishing
    def publish(self) -> None:
        now = time.monotonic()
        w, self.window = self.window, Window()
        span = max(now - self.window_start, 1e-3)
        self.window_start = now
        lat = sorted(w.latencies_ms)
        p50 = percentile(lat, 50) if lat else None
        p99 = percentile(lat, 99) if lat else None
        rps = len(lat) / span
        serving.publish(rps, p50_ms=p50, p99_ms=p99, queue_depth=self.waiting, replicas=self.active_count())
        log(f"serving rps={rps:.1f} p50_ms={p50 or 0:.1f} p99_ms={p99 or 0:.1f} queue={self.waiting} "
            f"replicas={self.active_count()} draining={len(self.replicas) - self.active_count()} "
            f"failed={w.failed} retried={w.retried}")

    # resizes
    async def on_notice(self) -> None:
        n = resize.read_notice()
        now = time.time()
        for r in list(self.replicas.values()):  # the notice that drained them is withdrawn, replaced or expired
            if r.draining is not None and (n is None or n.id != r.draining or now > n.hold_until):
                if await self.healthy(r):
                    r.draining = None
                    log(f"router: replica {r.id} takes requests again (notice {n.id if n else 'gone'})")
                    self.changed.set()
                else:
                    self.drop(r.id, "gone after its drain")
        pending = resize.notice()
        if pending is None:
            return
        if pending.kind == "grow":
            if resize.acknowledge():
                log(f"router: grow notice {pending.id} acknowledged (a replica joins when it is up)")
            return
        if pending.id != self.drain_for:
            self.drain_for = pending.id
            going = max(0, pending.from_nodes - pending.to_nodes)
            order = sorted((r for r in self.replicas.values() if r.id != self.own), key=Replica.removal_key)
            for r in order[:going]:
                r.draining = pending.id
            log(f"router: shrink notice {pending.id} {pending.from_nodes}->{pending.to_nodes}: draining "
                f"{[r.id for r in order[:going]]}")
        victims = [r for r in self.replicas.values() if r.draining == pending.id]
        left = sum(r.inflight for r in victims)
        if left and time.time() < pending.deadline - 1.0:
            return  # the next pass looks again
        acked = resize.acknowledge()
        log(f"router: drained {[r.id for r in victims]} ({left} still in flight); notice "
            f"{'acknowledged' if acked else 'not acknowledged'}")

    async def check_health(self, draining_only: bool) -> None:
        """Drop replicas that no longer answer: a drained one is not sent requests, so only this finds it gone
        when its job ends before its file is removed."""
        for r in list(self.replicas.values()):
            if (r.draining is not None or not draining_only) and r.inflight == 0 and not await self.healthy(r):
                self.drop(r.id, "its health check failed")

    async def loop(self, stop: asyncio.Event) -> None:
        next_publish = time.monotonic() + self.args.publish_s
        next_health = next_drained = time.monotonic()
        while not stop.is_set():
            await self.scan()
            await self.on_notice()
            now = time.monotonic()
            if now >= next_drained:  # drained replicas every 0.5 s, all of them every 5 s
                everyone = now >= next_health
                await self.check_health(draining_only=not everyone)
                next_drained = now + 0.5
                next_health = now + 5.0 if everyone else next_health
            if time.monotonic() >= next_publish:
                self.publish()
                next_publish += self.args.publish_s
            self.wake.clear()
            draining = any(r.draining for r in self.replicas.values())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), 0.05 if draining else 0.25)


async def run_router(args: argparse.Namespace, own_replica: str, stop: asyncio.Event) -> None:
    router = Router(args, own_replica)
    async with ClientSession(timeout=ClientTimeout(total=args.request_timeout_s)) as session:
        router.session = session
        app = web.Application()
        app.add_routes([web.post("/infer", router.infer), web.get("/status", router.status)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, args.bind, args.router_port)
        await site.start()
        port = runner.addresses[0][1]
        write_atomic(serve_dir() / "router.json", {"url": f"http://{args.advertise}:{port}", "port": port,
                                                   "job": leader_id(), "pid": os.getpid()})
        log(f"router up url=http://{args.advertise}:{port}")
        asyncio.get_running_loop().add_signal_handler(args.signum, router.wake.set)
        try:
            await router.loop(stop)
        finally:
            await runner.cleanup()


async def amain(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(args.signum, lambda: None)  # the grace signal must not end a replica
    runner, registration = await run_replica(args)
    is_router = os.environ.get("SLURM_ELASTIC_ROLE", "leader") == "leader" and os.environ.get("SLURM_PROCID") == "0"
    parent = os.getppid()

    async def orphaned() -> None:  # the launcher (the step's task) is gone: so is the step
        while os.getppid() == parent:
            await asyncio.sleep(0.5)
        stop.set()

    watch = loop.create_task(orphaned())
    try:
        if is_router:
            own = f"{os.environ.get('SLURM_JOB_ID', '0')}-{os.environ.get('SLURMD_NODENAME', socket.gethostname())}"
            await run_router(args, own, stop)
        else:
            await stop.wait()
    finally:
        watch.cancel()
        registration.unlink(missing_ok=True)  # the router stops sending here at its next scan
        await runner.cleanup()


def node_addr(scontrol_line: str) -> str | None:
    """``NodeAddr`` of one ``scontrol -o show node`` line (None when it has none)."""
    m = re.search(r"(?:^|\s)NodeAddr=(\S+)", scontrol_line)
    return m.group(1) if m else None


def serve_address(env: dict[str, str] | os._Environ[str]) -> str:
    """Where this node's router or replica listens and what it advertises: ``SLURM_ELASTIC_SERVE_ADDR`` (the
    site's: an address, or a name with ``{node}`` for the Slurm node name, e.g. ``{node}-ib``), else the node's
    NodeAddr in Slurm, else the host name."""
    node = env.get("SLURMD_NODENAME")
    if env.get("SLURM_ELASTIC_SERVE_ADDR"):
        return env["SLURM_ELASTIC_SERVE_ADDR"].replace("{node}", node or socket.gethostname())
    if node:
        try:
            out = subprocess.run(["scontrol", "-o", "show", "node", node], capture_output=True, text=True,
                                 timeout=15, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        addr = node_addr(out)
        if addr:
            return addr
    return socket.gethostname()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--service-ms", type=float, default=20.0, help="least time a replica takes per request")
    ap.add_argument("--matrix", type=int, default=64, help="the model's size (W is N x N)")
    ap.add_argument("--publish-s", type=float, default=2.0)
    ap.add_argument("--request-timeout-s", type=float, default=10.0)
    ap.add_argument("--bind", help="the address to listen on (default: SLURM_ELASTIC_SERVE_ADDR, else the "
                    "node's NodeAddr in Slurm, else the host name)")
    ap.add_argument("--advertise", default=os.environ.get("SLURM_ELASTIC_SERVE_HOST"),
                    help="the address others reach this node by (default: the one it listens on)")
    ap.add_argument("--router-port", type=int, default=0, help="0: any free port (router.json says which)")
    ap.add_argument("--replica-port", type=int, default=0)
    ap.add_argument("--signal", default="USR1", help="the job's grace signal")
    args = ap.parse_args()
    if args.service_ms < 0 or args.matrix < 1 or args.publish_s <= 0 or args.request_timeout_s <= 0:
        ap.error("--service-ms >= 0, --matrix >= 1, --publish-s > 0 and --request-timeout-s > 0")
    args.signum = signal.Signals["SIG" + args.signal.upper().removeprefix("SIG")]
    if args.bind is None:
        args.bind = serve_address(os.environ)
    if args.advertise is None:
        args.advertise = args.bind if args.bind not in ("0.0.0.0", "::", "") else socket.gethostname()
    asyncio.run(amain(args))
    sys.exit(0)


if __name__ == "__main__":
    main()
