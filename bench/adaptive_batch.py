"""Adaptive batch size in the simulator: every Pollux job opted in vs every job at its submitted batch.

Four runs on the same workload, scheduler and cluster, all measured here (ratios against the rigid, fixed-batch
baseline of this run): rigid at fixed batch, rigid with each job co-adapting its batch to the GPUs it asked for,
elastic at fixed batch and elastic with adaptive batch, both elastic arms under the same production policy
(``slurm_elastic.policy.decide`` through the simulator's adapter). Opted-in jobs publish goodput, so the
policy's throughput-based rules (``speedup_growth``, ``goodput``) rank their grows and shrinks by goodput gain.
Per job: each job's JCT over its JCT in the rigid, fixed-batch run, both floored at 10
minutes (sim/metrics.py ``slowdown``): the share of jobs later by > 1.25x and > 2x, and the worst.
Prints Markdown (docs/performance.md, "Adaptive batch size").

    .venv/bin/python bench/adaptive_batch.py [--workloads 6] [--scheduler greedy] [--policy bench/sim-policy.toml]
        [--set speedup_growth=true ...] [--reasons]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_elastic.policy import config_from_mapping  # noqa: E402
from slurm_elastic.sim.config import SimConfig  # noqa: E402
from slurm_elastic.sim.loaders import load_workload  # noqa: E402
from slurm_elastic.sim.metrics import Metrics, slowdown, summarize  # noqa: E402
from slurm_elastic.sim.perfmodel.factory import build_models  # noqa: E402
from slurm_elastic.sim.policy_adapter import ProductionPolicy  # noqa: E402
from slurm_elastic.sim.run import simulate_one  # noqa: E402
from slurm_elastic.sim.traces import traces_dir  # noqa: E402

POLLUX = {"Pollux (co-adapts batch and GPUs), artifact": 2446.0,
          "Pollux's allocator at fixed batch, artifact": 3323.0}


def _value(text: str) -> Any:
    return tomllib.loads(f"v = {text}")["v"]


def _numbers(text: str) -> list[int]:
    """``6``, ``1,6`` or ``1-8``."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="6", help="comma-separated Pollux workload numbers, or a range 1-8")
    ap.add_argument("--set-name", default="workloads", help="workloads, workloads-0.5 or workloads-1.5")
    ap.add_argument("--scheduler", choices=["greedy", "backfill"], default="greedy")
    ap.add_argument("--policy", type=Path, default=ROOT / "bench" / "sim-policy.toml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="policy key over the policy file (TOML value), e.g. speedup_growth=true")
    ap.add_argument("--reasons", action="store_true",
                    help="print what the elastic runs' grows and shrinks were decided for (reason counts)")
    ap.add_argument("--runs", default="all",
                    help="which runs beside the rigid, fixed-batch baseline (always run): all, or a comma-separated "
                         "subset of rigid-adaptive, elastic-fixed, elastic-adaptive")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    args = ap.parse_args()
    base = tomllib.loads(args.policy.read_text(encoding="utf-8"))
    for item in args.set:
        key, _, raw = item.partition("=")
        base[key.strip()] = _value(raw.strip())
    cfg = config_from_mapping(base, "adaptive-batch bench")
    sim = SimConfig(args.nodes, args.gpus_per_node, scheduler=args.scheduler)
    extra = ", ".join(args.set) or "none"
    print(f"\n### Adaptive batch size, {args.nodes} x {args.gpus_per_node} GPUs, {args.scheduler} base "
          f"(policy {args.policy.name}, overrides: {extra})\n")
    print("| workload | run | avg JCT (s) | vs rigid | p99 JCT (s) | vs rigid | > 1.25x | > 2x | worst "
          "| resizes per job | sim s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    counts: list[tuple[str, str]] = []
    for n in _numbers(args.workloads):
        workload = load_workload(str(traces_dir() / "pollux" / args.set_name / f"workload-{n}.csv"), "pollux")
        rigid: Metrics | None = None
        rigid_run = None
        for label, adaptive, elastic in (("rigid, fixed batch", False, False),
                                         ("rigid, adaptive batch", True, False),
                                         ("elastic, fixed batch", False, True),
                                         ("elastic, adaptive batch", True, True)):
            key = f"{label.split(',')[0]}-{'adaptive' if adaptive else 'fixed'}"
            if rigid is not None and args.runs != "all" and key not in args.runs.split(","):
                continue
            models = build_models(workload, args.gpus_per_node, random.Random(0), adaptive_batch=adaptive)
            policy = ProductionPolicy(cfg, sim) if elastic else None
            start = time.perf_counter()
            run = simulate_one(workload, sim, models, policy=policy)
            m = summarize(run)
            took = time.perf_counter() - start
            rigid, rigid_run = rigid or m, rigid_run or run
            sd = slowdown(rigid_run, run)
            print(f"| {args.set_name}/workload-{n} | {label} | {m.avg_jct:,.0f} | {m.avg_jct / rigid.avg_jct:.2f}x "
                  f"| {m.p99_jct:,.0f} | {m.p99_jct / rigid.p99_jct:.2f}x | {sd.later_125:.1%} | {sd.later_2:.1%} "
                  f"| {sd.worst:.2f}x | {m.resizes:.2f} | {took:.0f} |", flush=True)
            if args.reasons and policy is not None:
                counts.append((label, ", ".join(f"{k} {v}" for k, v in sorted(policy.actions.items()))))
    if args.workloads == "6" and args.set_name == "workloads":
        for label, value in POLLUX.items():
            print(f"| workload-6 | {label} | {value:,.0f} | | | | | | | | |")
    for label, text in counts:
        print(f"\n{label}: {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
