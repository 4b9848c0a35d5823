"""GPU-granular growth (``gpu_granular_growth``) beside whole-node growth, in the project's simulator.

Both arms run the production policy (``slurm_elastic.policy.decide``) through the simulator's adapter with the same
policy file; the GPU-granular arm only sets ``gpu_granular_growth = true`` on top. Every ratio is measured in this
run: GPU-granular / whole-node average JCT on the same workload, models and seed, and the per-job columns (share of
jobs > 1.25x and > 2x later than rigid, the worst job) against the rigid run of the same batch mode, and the
time-weighted mean of free GPUs on partly used nodes (what GPU-granular growth can use at most).
Prints Markdown (docs/performance.md, "GPU-granular growth").

    .venv/bin/python bench/sim_gpu_granular.py [--adaptive 6] [--fixed 1-8] [--scheduler greedy]
        [--policy bench/sim-policy.toml] [--nodes 16] [--gpus-per-node 4]

``--adaptive``: workloads run with every job on adaptive batch (target: <= 0.90x whole-node on workload-6 greedy);
``--fixed``: workloads run at each job's fixed batch (target: no worse than whole-node on any). An empty value
skips that part.
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


def _numbers(text: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def run(n: int, adaptive: bool, sim: SimConfig, base: dict[str, Any], set_name: str) -> list[str]:
    """Rows for one workload: rigid, whole-node, GPU-granular (and the ratio)."""
    workload = load_workload(str(traces_dir() / "pollux" / set_name / f"workload-{n}.csv"), "pollux")
    mode = "adaptive" if adaptive else "fixed"
    rows: list[str] = []
    rigid_result = None
    rigid: Metrics | None = None
    whole: Metrics | None = None
    for label, granular, elastic in (("rigid", False, False), ("whole-node", False, True),
                                     ("GPU-granular", True, True)):
        models = build_models(workload, sim.gpus_per_node, random.Random(0), adaptive_batch=adaptive)
        cfg = config_from_mapping(base | {"gpu_granular_growth": granular}, "gpu-granular bench")
        policy = ProductionPolicy(cfg, sim) if elastic else None
        start = time.perf_counter()
        result = simulate_one(workload, sim, models, policy=policy)
        took = time.perf_counter() - start
        m = summarize(result)
        if rigid_result is None:
            rigid_result, rigid = result, m
        assert rigid is not None
        per = slowdown(rigid_result, result)
        vs_whole = f"{m.avg_jct / whole.avg_jct:.2f}x" if whole is not None and granular else ""
        if label == "whole-node":
            whole = m
        rows.append(f"| workload-{n} | {mode} | {label} | {m.avg_jct:,.0f} | {m.avg_jct / rigid.avg_jct:.2f}x | "
                    f"{vs_whole} | {m.p99_jct:,.0f} | {per.later_125 * 100:.1f}% | {per.later_2 * 100:.1f}% | "
                    f"{per.worst:.2f}x | {m.resizes:.2f} | {m.partial_free_gpus:.2f} | {took:.0f} |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adaptive", default="6", help="workloads with every job on adaptive batch, e.g. 6 or 1-8")
    ap.add_argument("--fixed", default="1-8", help="workloads at fixed batch")
    ap.add_argument("--set-name", default="workloads", help="workloads, workloads-0.5 or workloads-1.5")
    ap.add_argument("--scheduler", choices=["greedy", "backfill"], default="greedy")
    ap.add_argument("--policy", type=Path, default=ROOT / "bench" / "sim-policy.toml")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--gpus-per-node", type=int, default=4)
    args = ap.parse_args()
    base = tomllib.loads(args.policy.read_text(encoding="utf-8"))
    sim = SimConfig(args.nodes, args.gpus_per_node, scheduler=args.scheduler)
    print(f"\n### GPU-granular vs whole-node growth, {args.nodes} x {args.gpus_per_node} GPUs, {args.scheduler} "
          f"base (policy {args.policy.name})\n")
    print("| workload | batch | plan | avg JCT (s) | vs rigid | vs whole-node | p99 JCT (s) | > 1.25x rigid | "
          "> 2x rigid | worst job | resizes per job | free GPUs on partly used nodes | sim s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in _numbers(args.adaptive):
        for row in run(n, True, sim, base, args.set_name):
            print(row, flush=True)
    for n in _numbers(args.fixed):
        for row in run(n, False, sim, base, args.set_name):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
