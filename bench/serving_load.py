#!/usr/bin/env python3
"""A bounded load generator for the serve_http template: a daily demand curve compressed to seconds, on loopback.

The request rate follows ``DIURNAL`` (24 hourly shares of the peak: a night trough, a morning ramp, a midday and
an evening peak), interpolated linearly and scaled to ``--base-rps`` .. ``--peak-rps``; one day lasts
``--day-s`` seconds. Arrivals are open-loop (Poisson at the current rate), so a slow service sees its queue
grow as a real one would. Bounded: at most ``--duration-s`` seconds and ``--max-inflight`` requests in flight
(an arrival beyond that is counted as ``shed``, never sent). SIGTERM ends it early: it sends nothing more,
waits for the answers and writes the summary.

Every request is recorded; ``--out`` gets a JSON summary: sent, ok, failed (an answer other than 200 or no
answer: the service lost it), shed, and per ``--bucket-s`` bucket the offered rate, answered rate and p99::

    python3 bench/serving_load.py --router-file WORKDIR/.slurm-elastic/serve-JOB/router.json \\
        --day-s 120 --base-rps 5 --peak-rps 60 --duration-s 120 --out load.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import ClientError, ClientSession, ClientTimeout

#: Share of the peak rate at each hour of the day (00:00 .. 23:00): a diurnal web-service curve.
DIURNAL: tuple[float, ...] = (0.25, 0.18, 0.12, 0.10, 0.10, 0.12, 0.20, 0.35, 0.55, 0.75, 0.88, 0.95,
                              1.00, 0.97, 0.92, 0.88, 0.85, 0.88, 0.95, 0.98, 0.90, 0.70, 0.50, 0.35)


def rate_at(t: float, *, day_s: float, base_rps: float, peak_rps: float, start_hour: float = 0.0,
            profile: tuple[float, ...] = DIURNAL) -> float:
    """Requests/s at ``t`` seconds into the run: the profile, interpolated, between base (its minimum) and peak."""
    if day_s <= 0:
        raise ValueError("day_s must be > 0")
    hours = len(profile)
    h = (start_hour + t / day_s * hours) % hours
    i = int(h)
    share = profile[i] + (profile[(i + 1) % hours] - profile[i]) * (h - i)
    low, high = min(profile), max(profile)
    scaled = (share - low) / (high - low) if high > low else 1.0
    return base_rps + (peak_rps - base_rps) * scaled


@dataclass
class Record:
    sent_at: float  # seconds into the run
    latency_ms: float | None  # None: failed
    status: int


@dataclass
class Run:
    records: list[Record] = field(default_factory=list)
    shed: int = 0
    offered: list[tuple[float, float]] = field(default_factory=list)  # (t, rate)


def router_url(args: argparse.Namespace) -> str:
    if args.url:
        return str(args.url)
    d = json.loads(Path(args.router_file).read_text())
    parts = urlsplit(d["url"])
    return f"http://{args.host or parts.hostname}:{parts.port}"  # --host 127.0.0.1: on loopback


async def generate(url: str, args: argparse.Namespace) -> Run:
    run = Run()
    rng = random.Random(args.seed)
    inflight: set[asyncio.Task[None]] = set()
    t0 = time.monotonic()

    async def one(session: ClientSession, at: float) -> None:
        started = time.monotonic()
        try:
            async with session.post(f"{url}/infer", json={"x": [rng.random() for _ in range(8)]}) as r:
                await r.read()
                ok = r.status == 200
                status = r.status
        except (TimeoutError, ClientError, OSError):
            ok, status = False, 0
        run.records.append(Record(at, (time.monotonic() - started) * 1000 if ok else None, status))

    stop = asyncio.Event()  # SIGTERM: send nothing more, wait for the answers, write the summary
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    timeout = ClientTimeout(total=args.request_timeout_s)
    async with ClientSession(timeout=timeout) as session:
        next_at = 0.0
        while next_at < args.duration_s and not stop.is_set():
            now = time.monotonic() - t0
            if next_at > now:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), next_at - now)
                if stop.is_set():
                    break
            rate = rate_at(next_at, day_s=args.day_s, base_rps=args.base_rps, peak_rps=args.peak_rps,
                           start_hour=args.start_hour)
            run.offered.append((next_at, rate))
            if len(inflight) >= args.max_inflight:
                run.shed += 1
            else:
                task = asyncio.create_task(one(session, next_at))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
            next_at += rng.expovariate(rate) if rate > 0 else 0.1
        if inflight:
            await asyncio.wait(inflight)
    return run


def summarize(run: Run, bucket_s: float) -> dict[str, object]:
    ok = [r for r in run.records if r.latency_ms is not None]
    failed = [r for r in run.records if r.latency_ms is None]
    buckets: list[dict[str, float | int | None]] = []
    if run.offered:
        n = int(max(t for t, _ in run.offered) // bucket_s) + 1
        for b in range(n):
            lo, hi = b * bucket_s, (b + 1) * bucket_s
            lat = sorted(r.latency_ms for r in ok if lo <= r.sent_at < hi and r.latency_ms is not None)
            rates = [rate for t, rate in run.offered if lo <= t < hi]
            buckets.append({"t": lo, "offered_rps": round(sum(rates) / len(rates), 2) if rates else 0.0,
                            "answered_rps": round(len(lat) / bucket_s, 2),
                            "p99_ms": round(lat[max(0, math.ceil(len(lat) * 0.99) - 1)], 2) if lat else None,
                            "failed": sum(1 for r in failed if lo <= r.sent_at < hi)})
    lat_all = sorted(r.latency_ms for r in ok if r.latency_ms is not None)
    return {"sent": len(run.records), "ok": len(ok), "failed": len(failed), "shed": run.shed,
            "failed_statuses": sorted({r.status for r in failed}),
            "p99_ms": round(lat_all[max(0, math.ceil(len(lat_all) * 0.99) - 1)], 2) if lat_all else None,
            "buckets": buckets}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="the router's URL")
    where.add_argument("--router-file", help="the template's router.json")
    ap.add_argument("--host", help="connect to this host instead of router.json's (e.g. 127.0.0.1)")
    ap.add_argument("--day-s", type=float, default=120.0, help="seconds one day of the curve lasts")
    ap.add_argument("--start-hour", type=float, default=0.0)
    ap.add_argument("--base-rps", type=float, default=5.0)
    ap.add_argument("--peak-rps", type=float, default=50.0)
    ap.add_argument("--duration-s", type=float, default=120.0)
    ap.add_argument("--max-inflight", type=int, default=256)
    ap.add_argument("--request-timeout-s", type=float, default=15.0)
    ap.add_argument("--bucket-s", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the JSON summary here (else stdout)")
    args = ap.parse_args(argv)
    if not (0 <= args.base_rps <= args.peak_rps) or args.peak_rps <= 0 or args.duration_s <= 0 \
            or args.max_inflight < 1 or args.bucket_s <= 0:
        ap.error("need 0 <= base-rps <= peak-rps, peak-rps > 0, duration-s > 0, max-inflight >= 1, bucket-s > 0")
    summary = summarize(asyncio.run(generate(router_url(args), args)), args.bucket_s)
    text = json.dumps(summary, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    print(f"serving_load: sent={summary['sent']} ok={summary['ok']} failed={summary['failed']} "
          f"shed={summary['shed']} p99_ms={summary['p99_ms']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
