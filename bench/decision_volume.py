"""Decision rows per day at site scale: every hold stored (the old rule) against holds stored by change.

A synthetic cluster (bench/controller_cycle.py's documents) cut to ``--units`` elastic units (2,000 by default)
goes through ``--cycles`` controller cycles of ``--interval-s`` (30 s). Each cycle the real policy decides
(``policy.decide``) on utilization the bench moves, and the controller's write path stores the decisions: the
controller's hold filter (controller/hold_filter.py) and ``store.decisions.record_decisions`` under a lease
token, on a fresh SQLite file per rule. Both rules see the same decisions in the same run: the old one is the
filter with ``hold_heartbeat_s = 0`` (every hold written), the new one ``--heartbeat-s`` (600 s).

Two workloads:

* ``steady``: each unit's window mean stays near its own level (uniform 25..85%, inside the default band), with
  +-1 point of jitter per cycle, as a 10-minute window mean does; metric ages and sample counts vary.
* ``changing``: the same, and each cycle ``--change`` of the units (10%) move to a new level, and 1% lose their
  metrics for one cycle (a STALE_METRICS hold, then back).

Rows per day are ``rows after the first cycle / cycles x 86,400 / interval_s`` (the first cycle writes every
unit's hold under both rules); ``MB/day`` from the SQLite file's growth per row. CPU is the process time of the
write path per cycle (median), and its ratio to the old rule's.

    .venv/bin/python bench/decision_volume.py [--units 2000] [--cycles 61] [--interval-s 30] [--heartbeat-s 600]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import controller_cycle as cc  # noqa: E402

from slurm_elastic.controller.hold_filter import HoldFilter  # noqa: E402
from slurm_elastic.controller.units import SpecCache, build_units  # noqa: E402
from slurm_elastic.policy import (  # noqa: E402
    ElasticUnit,
    JobUtilization,
    PolicyConfig,
    PolicyInput,
    config_from_mapping,
    decide,
)
from slurm_elastic.slurm.model import ClusterSnapshot  # noqa: E402
from slurm_elastic.store import SqlStore  # noqa: E402
from slurm_elastic.store.sqlstore import sqlite_url  # noqa: E402

WORKLOADS = ("steady", "changing")


class RuleResult:
    """Rows one rule wrote (the first cycle apart), the CPU of its write path per cycle, its DB file's size."""

    def __init__(self) -> None:  # a plain class: tests load this file without registering it as a module
        self.rows = 0
        self.first = 0
        self.cpu: list[float] = []
        self.db_bytes = 0


def site_units(n_units: int, seed: int) -> tuple[ClusterSnapshot, tuple[ElasticUnit, ...]]:
    """(snapshot, the first ``n_units`` elastic units) of a synthetic cluster big enough to hold them."""
    jobs = max(200, n_units * 6)  # about a fifth of the jobs are elastic units
    squeue, sinfo = cc.build_documents(jobs, max(40, jobs // 5), 8, seed)
    snap = cc._snapshot(squeue, sinfo)
    units = build_units(snap, read_script=lambda _: None, is_known_key=lambda _j, _k: True, cache=SpecCache()).units
    if len(units) < n_units:
        raise SystemExit(f"the synthetic cluster has {len(units)} units, fewer than {n_units}")
    return snap, tuple(units[:n_units])


def policy() -> PolicyConfig:
    """Explicit thresholds (not the packaged defaults, which may change); no shrink-to-admit: the bench applies
    no action, so a repeated shrink for the same pending job would be counted every cycle under both rules."""
    return config_from_mapping({"version": 1, "scale_up_above": 90, "scale_down_below": 20,
                                "shrink_to_admit": False, "window_s": 600, "min_samples": 10}, "<bench>")


def run(workload: str, tmp: Path, *, n_units: int, cycles: int, interval_s: float, heartbeat_s: float,
        change: float, seed: int) -> tuple[dict[str, RuleResult], Counter[str]]:
    snap, units = site_units(n_units, seed)
    cfg = policy()
    rnd = random.Random(seed)
    level = {u.unit_id: rnd.uniform(25, 85) for u in units}
    rules = {"old": HoldFilter(0), "new": HoldFilter(heartbeat_s)}
    stores = {name: SqlStore.open(sqlite_url(tmp / f"{workload}-{name}.db")) for name in rules}
    results = {name: RuleResult() for name in rules}
    actions: Counter[str] = Counter()
    try:
        tokens = {}
        for name, store in stores.items():
            lease = store.lease.acquire("bench", timedelta(days=1))
            assert lease is not None
            tokens[name] = lease.token()
        for c in range(cycles):
            now = cc.NOW + timedelta(seconds=c * interval_s)
            stale: set[int] = set()
            if workload == "changing" and c > 0:
                for uid in rnd.sample(sorted(level), int(len(level) * change)):
                    level[uid] = rnd.uniform(25, 85)
                stale = set(rnd.sample(sorted(level), len(level) // 100))
            util = {}
            for u in units:
                mean = min(100.0, max(0.0, level[u.unit_id] + rnd.uniform(-1.0, 1.0)))
                age = 400 if u.unit_id in stale else rnd.choice([5, 20, 35])
                util[u.unit_id] = JobUtilization(u.unit_id, round(mean, 2), min(100.0, mean + 10), 600.0,
                                                 rnd.randint(30, 40), now - timedelta(seconds=age), 8, 8)
            decisions = decide(PolicyInput(replace(snap, taken_at=now), units, util), cfg, now)
            actions.update(str(d.action) for d in decisions)
            new = [cc.new_decision(d) for d in decisions]
            for name, hf in rules.items():
                store = stores[name]
                t0 = time.process_time()
                cycle = store.decisions.begin_cycle(holder="bench")
                recorded = hf.record(store, cycle, new, now, fencing=tokens[name])
                store.decisions.finish_cycle(cycle, decisions=len(new), actions=0)
                results[name].cpu.append(time.process_time() - t0)
                if c == 0:
                    results[name].first = recorded.written
                else:
                    results[name].rows += recorded.written
    finally:
        for store in stores.values():
            store.close()
    for name in rules:
        results[name].db_bytes = (tmp / f"{workload}-{name}.db").stat().st_size
    return results, actions


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=2_000)
    ap.add_argument("--cycles", type=int, default=61)
    ap.add_argument("--interval-s", type=float, default=30.0)
    ap.add_argument("--heartbeat-s", type=float, default=600.0)
    ap.add_argument("--change", type=float, default=0.10, help="share of units that change level per cycle")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    per_day = 86_400 / args.interval_s
    print(f"{args.units} units, {args.cycles} cycles of {args.interval_s:g} s, hold_heartbeat_s "
          f"{args.heartbeat_s:g} (old rule: every hold); rows/day from cycles 2..{args.cycles}")
    print(f"{'workload':<10}{'rule':<5}{'first':>7}{'rows/cycle':>12}{'rows/day':>12}{'MB/day':>9}"
          f"{'CPU ms/cycle':>14}{'x old':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for workload in WORKLOADS:
            results, actions = run(workload, Path(tmp), n_units=args.units, cycles=args.cycles,
                                   interval_s=args.interval_s, heartbeat_s=args.heartbeat_s, change=args.change,
                                   seed=args.seed)
            old_cpu = statistics.median(results["old"].cpu)
            for name, r in results.items():
                per_cycle = r.rows / max(1, args.cycles - 1)
                total = r.first + r.rows
                mb = per_cycle * per_day * (r.db_bytes / max(1, total)) / 1e6
                cpu = statistics.median(r.cpu)
                print(f"{workload:<10}{name:<5}{r.first:>7}{per_cycle:>12.1f}{per_cycle * per_day:>12,.0f}"
                      f"{mb:>9.1f}{cpu * 1000:>14.1f}{cpu / old_cpu if old_cpu else 0:>8.2f}")
            old, new = results["old"].rows, results["new"].rows
            print(f"{workload:<10}decisions by action: {dict(sorted(actions.items()))}; "
                  f"new/old rows {new / max(1, old):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
