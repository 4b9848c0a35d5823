"""Serving next to training: SLO attainment and training GPU-hours/JCT for four ways to size the service.

A minute-by-minute model of one cluster (16 nodes x 4 GPUs by default) shared by one online service and the
Pollux training workloads (traces/pollux/, workloads 1..8 back to back and repeated, each shifted by 8 h):

* **Demand.** A diurnal curve (trough at 04:00, peak at 16:00, weekends at 60%), per-minute lognormal noise and
  short bursts, seeded. Two earlier weeks of the same process are the recorded history the forecast learns from.
* **Latency.** Each replica is one node of ``--gpus-per-node`` workers at ``--service-ms`` mean service time;
  the p99 of a minute is the 99th percentile response time of an M/M/c queue (c = workers of the replicas
  that are serving, Erlang C and the hypoexponential sojourn time), infinite when the load reaches capacity.
  SLO attainment is the share of minutes whose p99 is within ``--slo-ms``.
* **Sizing.** ``static``: replicas for the horizon's peak demand, always; ``window``: the time-window profile a
  site sets by hand (peak replicas 07:00-23:00 on weekdays, the night's peak otherwise, both measured on the
  history); ``reactive``: the production serving rules (``slurm_elastic.policy.serving.serving_call``, packaged
  defaults) on the service's published points, no forecast; ``forecast``: the same plus the seasonal profile
  (``slurm_elastic.policy.forecast``) one cold start ahead. A replica added by the elastic runs serves after
  the grace period (its node comes from training, which holds every node serving leaves) plus the cold start.
* **Training.** Jobs arrive as in the trace (``--workload-set``, workloads 1..8 repeated over the horizon), ask
  ceil(GPUs/4) nodes, run at the rate of the sim's Pollux performance models (``slurm_elastic.sim.perfmodel``)
  on their node count, grow up to twice their request into idle nodes and shrink, newest first, to one node
  and then to zero (suspended) when serving takes nodes; every resize costs ``--resize-cost`` seconds of
  progress. This is a simple elastic model, not the simulator's
  engine: it makes the serving strategies comparable on the same training side.

Prints Markdown tables (docs/serving.md). ``--forecast-table`` adds the forecast's error against simpler
predictors on the evaluation days; ``--sweep`` the elastic runs under other serving_risk_percent and
serving_headroom_percent values.

    .venv/bin/python bench/serving_sim.py [--days 7] [--nodes 16] [--seed 1] [--forecast-table]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_elastic.directives.spec import ElasticSpec  # noqa: E402
from slurm_elastic.policy import ElasticUnit, ServingLoad, ServingPoint, default_config  # noqa: E402
from slurm_elastic.policy.config import SettingsResolver, UnitSettings  # noqa: E402
from slurm_elastic.policy.forecast import DemandPoint, SeasonalProfile, peak_ahead  # noqa: E402
from slurm_elastic.policy.reasons import Action  # noqa: E402
from slurm_elastic.policy.serving import serving_call  # noqa: E402
from slurm_elastic.sim.loaders import load_workload  # noqa: E402
from slurm_elastic.sim.perfmodel.base import JobPerf  # noqa: E402
from slurm_elastic.sim.perfmodel.factory import build_models  # noqa: E402
from slurm_elastic.sim.traces import traces_dir  # noqa: E402
from slurm_elastic.slurm.model import Job  # noqa: E402

START = datetime(2026, 1, 5, tzinfo=UTC)  # a Monday
MINUTE = 60.0


# --- demand -------------------------------------------------------------------------------------------------


def demand_curve(days: int, start: datetime, *, peak: float, trough: float, seed: int) -> list[float]:
    """Requests/s per minute over ``days`` from ``start``."""
    rng = random.Random(seed)
    out: list[float] = []
    burst_left, burst = 0, 1.0
    for m in range(days * 1440):
        t = start + timedelta(minutes=m)
        hour = t.hour + t.minute / 60.0
        shape = (0.5 - 0.5 * math.cos(2 * math.pi * (hour - 4.0) / 24.0)) ** 1.5
        level = trough + (peak - trough) * shape
        if t.weekday() >= 5:
            level *= 0.6
        if burst_left == 0 and rng.random() < 1 / 720:  # about two bursts a day, 5-15 minutes, +10..25%
            burst_left, burst = rng.randint(5, 15), 1.0 + rng.uniform(0.10, 0.25)
        factor = burst if burst_left > 0 else 1.0
        burst_left = max(0, burst_left - 1)
        out.append(level * factor * math.exp(rng.gauss(0.0, 0.05)))
    return out


# --- M/M/c latency ------------------------------------------------------------------------------------------


def erlang_c(c: int, a: float) -> float:
    """Probability of waiting in M/M/c with offered load ``a`` = lambda/mu (< c)."""
    term, total = 1.0, 1.0
    for k in range(1, c):
        term *= a / k
        total += term
    last = term * a / c
    last_w = last * c / (c - a)
    return last_w / (total + last_w)


def p99_ms(rate: float, workers: int, service_ms: float) -> float:
    """99th percentile response time (ms) of M/M/``workers`` at ``rate`` req/s; inf at or beyond capacity."""
    mu = 1000.0 / service_ms
    if workers <= 0 or rate >= workers * mu:
        return math.inf
    if rate <= 0:
        return service_ms * math.log(100.0)
    pw = erlang_c(workers, rate / mu)
    theta = workers * mu - rate

    def tail(t: float) -> float:
        if abs(theta - mu) < 1e-9:
            hypo = math.exp(-mu * t) * (1 + mu * t)
        else:
            hypo = (mu * math.exp(-theta * t) - theta * math.exp(-mu * t)) / (mu - theta)
        return (1 - pw) * math.exp(-mu * t) + pw * hypo

    lo, hi = 0.0, 1.0
    while tail(hi) > 0.01:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if tail(mid) > 0.01:
            lo = mid
        else:
            hi = mid
    return hi * 1000.0


def replica_capacity(workers: int, service_ms: float, slo_ms: float) -> float:
    """The most req/s one replica carries with its p99 within the SLO."""
    lo, hi = 0.0, workers * 1000.0 / service_ms
    for _ in range(50):
        mid = (lo + hi) / 2
        if p99_ms(mid, workers, service_ms) <= slo_ms:
            lo = mid
        else:
            hi = mid
    return lo


def replicas_needed(rate: float, workers: int, service_ms: float, slo_ms: float, cap: int) -> int:
    for r in range(1, cap + 1):
        if p99_ms(rate, r * workers, service_ms) <= slo_ms:
            return r
    return cap


# --- training -----------------------------------------------------------------------------------------------


@dataclass
class TrainJob:
    job_id: str
    submit: float
    request: int
    perf: JobPerf
    total: float
    progress: float = 0.0
    nodes: int = 0
    lost_s: float = 0.0  # restart time still to pay
    started: float | None = None
    done: float | None = None

    def rate(self, gpus_per_node: int) -> float:
        if self.nodes <= 0:
            return 0.0
        epoch = 0
        while epoch < self.perf.num_epochs - 1 and self.progress >= self.perf.epoch_end(epoch):
            epoch += 1
        return self.perf.rate(tuple([gpus_per_node] * self.nodes), epoch)


def training_jobs(workloads: Sequence[int], nodes: int, gpus_per_node: int, seed: int, *,
                  workload_set: str) -> list[TrainJob]:
    jobs: list[TrainJob] = []
    rng = random.Random(seed)
    for i, n in enumerate(workloads):
        wl = load_workload(str(traces_dir() / "pollux" / workload_set / f"workload-{n}.csv"), "pollux")
        models = build_models(wl, gpus_per_node, rng)
        for spec in wl.jobs:
            perf = models[spec.job_id]
            request = max(1, min(nodes, math.ceil(spec.num_gpus / gpus_per_node)))
            jobs.append(TrainJob(f"w{i}-{spec.job_id}", i * 8 * 3600.0 + spec.submit_time, request, perf,
                                 perf.epoch_end(perf.num_epochs - 1)))
    jobs.sort(key=lambda j: (j.submit, j.job_id))
    return jobs


def allocate(active: list[TrainJob], capacity: int, now: float, resize_cost: float, start_delay: float) -> None:
    """FIFO: requests first, then spare nodes up to twice the request; a short capacity shrinks the newest."""
    want: dict[str, int] = {}
    left = capacity
    for j in active:  # arrival order
        give = min(j.request, left)
        if give < j.request and j.nodes == 0:
            give = 0 if left < 1 else give  # a waiting job starts on what is left (moldable), at least 1
        want[j.job_id] = give
        left -= give
    for j in active:
        if left <= 0:
            break
        if want[j.job_id] > 0:
            extra = min(left, 2 * j.request - want[j.job_id])
            want[j.job_id] += extra
            left -= extra
    for j in active:
        n = want[j.job_id]
        if n != j.nodes:
            if n > 0 and j.started is None:
                j.started = now
                j.lost_s = start_delay
            elif n > 0:
                j.lost_s = resize_cost
            j.nodes = n


# --- strategies ---------------------------------------------------------------------------------------------


@dataclass
class Serving:
    """The service's state in one run: replicas serving, replicas starting (ready at a minute)."""

    ready: int
    starting: list[int] = field(default_factory=list)  # minute each starting replica becomes ready

    @property
    def held(self) -> int:
        return self.ready + len(self.starting)


def make_unit(min_nodes: int, max_nodes: int, slo_ms: int) -> ElasticUnit:
    job = Job(job_id=1, name="serve", user="svc", account="svc", partition="gpu", qos=None, priority=1,
              state="RUNNING", state_reason=None, nodes=("n1",), batch_host="n1", node_count=1, tres_per_node=None,
              gres_per_node=(), time_limit_min=None, submit_time=START, start_time=START - timedelta(days=30),
              end_time=None, comment="", admin_comment="", het_job_id=None, het_job_offset=None)
    spec = ElasticSpec(min_nodes=min_nodes, max_nodes=max_nodes, serving=True, slo_p99_ms=slo_ms,
                       explicit=frozenset({"min_nodes", "max_nodes", "serving", "slo_p99_ms"}))
    return ElasticUnit(job=job, spec=spec)


@dataclass
class Result:
    name: str
    slo_minutes: float
    worst_p99: float
    serving_node_h: float
    train_gpu_h: float
    jct_h: float
    finished: int
    total: int
    resizes: int


def run(name: str, demand: Sequence[float], sizing: Callable[[int, Serving, list[ServingPoint]], int], *,
        args: argparse.Namespace, elastic: bool, jobs: list[TrainJob]) -> Result:
    nodes, gpn = args.nodes, args.gpus_per_node
    srv = Serving(ready=sizing(-1, Serving(0), []))
    points: list[ServingPoint] = []
    ok = 0
    worst = 0.0
    serving_node_min = 0
    train_gpu_s = 0.0
    resizes = 0
    pending = list(jobs)
    active: list[TrainJob] = []
    delay = (args.grace_s + args.cold_start_s) // 60
    for m, rate in enumerate(demand):
        now_s = m * MINUTE
        srv.ready += sum(1 for r in srv.starting if r <= m)
        srv.starting = [r for r in srv.starting if r > m]
        p99 = p99_ms(rate, srv.ready * gpn, args.service_ms)
        ok += p99 <= args.slo_ms
        worst = max(worst, min(p99, 1e6))
        at = START + timedelta(minutes=m)
        points.append(ServingPoint(at, rate, p99_ms=min(p99, 1e6), replicas=srv.ready))
        target = sizing(m, srv, points)
        if target > srv.held:
            srv.starting.extend([m + (delay if elastic else 0)] * (target - srv.held))
            resizes += 1
        elif target < srv.held:
            drop = srv.held - target
            while drop and srv.starting:
                srv.starting.pop()
                drop -= 1
            srv.ready -= drop
            resizes += 1
        serving_node_min += srv.held
        while pending and pending[0].submit <= now_s:
            active.append(pending.pop(0))
        allocate(active, nodes - srv.held, now_s, args.resize_cost, args.start_delay)
        for j in active:
            if j.nodes <= 0:
                continue
            train_gpu_s += j.nodes * gpn * MINUTE
            run_s = MINUTE
            if j.lost_s:
                paid = min(j.lost_s, run_s)
                j.lost_s -= paid
                run_s -= paid
            j.progress += j.rate(gpn) * run_s
            if j.progress >= j.total:
                j.done = now_s + MINUTE
        active = [j for j in active if j.done is None]
    finished = [j for j in jobs if j.done is not None and j.started is not None]
    jct = sum((j.done or 0) - j.submit for j in finished) / max(1, len(finished)) / 3600
    return Result(name, 100.0 * ok / len(demand), worst, serving_node_min / 60, train_gpu_s / 3600, jct,
                  len(finished), len(jobs), resizes)


def fresh(jobs: list[TrainJob]) -> list[TrainJob]:
    return [TrainJob(j.job_id, j.submit, j.request, j.perf, j.total) for j in jobs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--workload-set", default="workloads-0.5", choices=["workloads", "workloads-0.5", "workloads-1.5"])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--service-ms", type=float, default=5.0)
    ap.add_argument("--slo-ms", type=int, default=50)
    ap.add_argument("--peak-rps", type=float, default=4200.0)
    ap.add_argument("--trough-rps", type=float, default=300.0)
    ap.add_argument("--max-replicas", type=int, default=12)
    ap.add_argument("--grace-s", type=int, default=60)
    ap.add_argument("--cold-start-s", type=int, default=120)
    ap.add_argument("--resize-cost", type=float, default=60.0)
    ap.add_argument("--start-delay", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--forecast-table", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    gpn, svc, slo = args.gpus_per_node, args.service_ms, args.slo_ms
    history_start = START - timedelta(days=14)
    history = demand_curve(14, history_start, peak=args.peak_rps, trough=args.trough_rps, seed=args.seed + 1000)
    demand = demand_curve(args.days, START, peak=args.peak_rps, trough=args.trough_rps, seed=args.seed)
    slots = 900
    hist_points = [DemandPoint(history_start + timedelta(seconds=i * slots),
                               max(history[i * slots // 60:(i + 1) * slots // 60]))
                   for i in range(len(history) * 60 // slots)]
    profile = SeasonalProfile.fit(hist_points, bucket_s=slots)
    cap1 = replica_capacity(gpn, svc, slo)

    def need(rate: float) -> int:
        return replicas_needed(rate, gpn, svc, slo, args.max_replicas)

    static_r = need(max(history))
    day_peak = max(r for i, r in enumerate(history)
                   if (history_start + timedelta(minutes=i)).weekday() < 5
                   and 7 <= (history_start + timedelta(minutes=i)).hour < 23)
    night_peak = max(r for i, r in enumerate(history)
                     if not ((history_start + timedelta(minutes=i)).weekday() < 5
                             and 7 <= (history_start + timedelta(minutes=i)).hour < 23))
    day_r, night_r = need(day_peak), need(night_peak)

    def static(m: int, srv: Serving, pts: list[ServingPoint]) -> int:
        return static_r

    def window(m: int, srv: Serving, pts: list[ServingPoint]) -> int:
        t = START + timedelta(minutes=max(0, m + 1))
        return day_r if t.weekday() < 5 and 7 <= t.hour < 23 else night_r

    cfg = default_config()
    unit = make_unit(1, args.max_replicas, slo)
    base = SettingsResolver(cfg).unit(unit)

    def tuned(**values: int) -> UnitSettings:
        fields = {k: getattr(base, k) for k in base.__dataclass_fields__ if k != "provenance"}
        fields.update({"serving_cold_start_s": args.cold_start_s + args.grace_s, **values})
        return UnitSettings(**fields, provenance=base.provenance)

    settings = tuned()

    def elastic(with_forecast: bool, s: UnitSettings | None = None
                ) -> Callable[[int, Serving, list[ServingPoint]], int]:
        st = s or settings
        state: dict[str, datetime | None] = {"resize": None, "grow": None}

        def size(m: int, srv: Serving, pts: list[ServingPoint]) -> int:
            if m < 0:
                return need(demand[0])
            now = START + timedelta(minutes=m)
            lead = float(args.cold_start_s + args.grace_s)
            forecast = peak_ahead(profile, now, lead) if with_forecast else None
            load = ServingLoad(1, tuple(pts[-16:]), forecast_rps=forecast, forecast_lead_s=lead,
                               rps_per_replica=cap1)
            call = serving_call(unit, load, st, now, current=srv.held, last_resize=state["resize"],
                                last_grow=state["grow"])
            target = srv.held
            if call.action is Action.GROW:
                target = min(args.max_replicas, srv.held + call.want)
                state["grow"] = now
            elif call.action is Action.SHRINK:
                target = max(1, srv.held - call.want)
            if target != srv.held:
                state["resize"] = now
            return target

        return size

    tiles = [1 + i % 8 for i in range(args.days * 3)]  # workloads 1..8 over and over, 8 h each
    jobs = training_jobs(tiles, args.nodes, gpn, args.seed, workload_set=args.workload_set)
    results = [
        run("static (peak-sized)", demand, static, args=args, elastic=False, jobs=fresh(jobs)),
        run("time-window profile", demand, window, args=args, elastic=False, jobs=fresh(jobs)),
        run("elastic, reactive", demand, elastic(False), args=args, elastic=True, jobs=fresh(jobs)),
        run("elastic + forecast", demand, elastic(True), args=args, elastic=True, jobs=fresh(jobs)),
    ]
    base_gpu = results[0].train_gpu_h
    print(f"{args.days} days, {args.nodes} nodes x {gpn} GPUs, demand {args.trough_rps:.0f}..{args.peak_rps:.0f} "
          f"req/s, SLO p99 {slo} ms, service {svc} ms/request, one replica carries {cap1:.0f} req/s within the "
          f"SLO; static {static_r} replicas, window {day_r} (weekdays 07-23) / {night_r}; grace {args.grace_s} s "
          f"+ cold start {args.cold_start_s} s; {len(jobs)} training jobs (Pollux {args.workload_set} 1-8 repeated, "
          f"8 h apart); "
          f"seed {args.seed}\n")
    print("| sizing | SLO minutes | worst p99 | serving node-h | training GPU-h | vs static | training jobs done "
          "| avg JCT (done) | serving resizes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        worst = "overload" if r.worst_p99 >= 1e6 else f"{r.worst_p99:.0f} ms"
        print(f"| {r.name} | {r.slo_minutes:.2f}% | {worst} | {r.serving_node_h:.0f} | {r.train_gpu_h:.0f} | "
              f"{100 * (r.train_gpu_h / base_gpu - 1):+.1f}% | {r.finished}/{r.total} | {r.jct_h:.2f} h | "
              f"{r.resizes} |")
    if args.sweep:
        print()
        print("| serving_risk_percent | serving_headroom_percent | forecast | SLO minutes | worst p99 | "
              "training GPU-h vs static |")
        print("|---|---|---|---|---|---|")
        for risk, head in ((80, 50), (80, 60), (90, 60), (90, 70), (95, 75)):
            for fc in (False, True):
                r = run("", demand, elastic(fc, tuned(serving_risk_percent=risk, serving_headroom_percent=head)),
                        args=args, elastic=True, jobs=fresh(jobs))
                worst = "overload" if r.worst_p99 >= 1e6 else f"{r.worst_p99:.0f} ms"
                print(f"| {risk} | {head} | {'on' if fc else 'off'} | {r.slo_minutes:.2f}% | {worst} | "
                      f"{100 * (r.train_gpu_h / base_gpu - 1):+.1f}% |")
    if args.forecast_table:
        print()
        forecast_errors(profile, hist_points, demand, slots)
    print(f"\n({time.perf_counter() - t0:.1f} s)", file=sys.stderr)


def forecast_errors(profile: SeasonalProfile, hist: list[DemandPoint], demand: Sequence[float], slots: int) -> None:
    """Mean absolute percentage error and under-prediction share per slot of the evaluation days."""
    per = slots // 60
    actual = [max(demand[i * per:(i + 1) * per]) for i in range(len(demand) // per)]
    daily_only = SeasonalProfile.fit(hist, bucket_s=slots, use_week=False)
    mean_profile = SeasonalProfile.fit(hist, bucket_s=slots, quantile=0.5)
    rows: list[tuple[str, Callable[[int], float | None]]] = [
        ("week slot, p90 (used)", lambda i: profile.predict(START + timedelta(seconds=i * slots))),
        ("week slot, median", lambda i: mean_profile.predict(START + timedelta(seconds=i * slots))),
        ("day slot only, p90", lambda i: daily_only.predict(START + timedelta(seconds=i * slots))),
        ("last slot (persistence)", lambda i: actual[i - 1] if i > 0 else hist[-1].requests_per_s),
    ]
    print("| predictor | MAPE per 15-min slot | slots under-predicted by > 10% |")
    print("|---|---|---|")
    for name, fn in rows:
        errs, under = [], 0
        for i, a in enumerate(actual):
            p = fn(i)
            if p is None:
                continue
            errs.append(abs(p - a) / a)
            under += p < 0.9 * a
        print(f"| {name} | {100 * sum(errs) / len(errs):.1f}% | {100 * under / len(actual):.1f}% |")


if __name__ == "__main__":
    main()
