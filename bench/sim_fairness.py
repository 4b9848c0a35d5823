"""Per-job fairness of the elastic policies against rigid Slurm: the allocator (``allocator = true``) beside the
rule walk (the packaged defaults), on the Pollux workloads, 16 x 4 GPUs, both base schedulers.

Every ratio is against the rigid run of the same trace and seeded models, measured in this run. Per job: elastic
JCT / rigid JCT with both floored at 10 minutes (sim/metrics.py ``slowdown``): the share of jobs later than rigid,
later by > 1.25x and > 2x, and the worst; and the time-weighted mean of GPUs stranded on partly used nodes
(sim/metrics.py ``stranded_gpus``) in the rigid run and the elastic one.
Prints Markdown (docs/performance.md, "Fairness").

    .venv/bin/python bench/sim_fairness.py [--sets workloads,workloads-0.5,workloads-1.5] [--workloads 1-8]
        [--schedulers greedy,backfill] [--set KEY=VALUE ...]   (extra policy keys for the allocator column)
        [--worst N]   (each row's N latest jobs against rigid, and why: molded, waits, the GPU counts it ran at)
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

from slurm_elastic.policy import PolicyConfig, config_from_mapping  # noqa: E402
from slurm_elastic.sim.config import SimConfig  # noqa: E402
from slurm_elastic.sim.loaders import load_workload  # noqa: E402
from slurm_elastic.sim.metrics import SLOWDOWN_FLOOR_S, slowdown, summarize  # noqa: E402
from slurm_elastic.sim.perfmodel.factory import build_models  # noqa: E402
from slurm_elastic.sim.policy_adapter import ProductionPolicy  # noqa: E402
from slurm_elastic.sim.run import simulate_one  # noqa: E402
from slurm_elastic.sim.traces import traces_dir  # noqa: E402

#: The allocator column: the packaged defaults plus these (speedup_growth values its grows).
ALLOCATOR = {"allocator": True, "speedup_growth": True}


def _workloads(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def _row(label: str, b: Any, e: Any, sd: Any) -> str:
    return (f"| {label} | {e.avg_jct / b.avg_jct:.2f}x | {e.p99_jct / b.p99_jct:.2f}x | {sd.later:.1%} "
            f"| {sd.later_125:.1%} | {sd.later_2:.1%} | {sd.worst:.2f}x | {b.stranded_gpus:.2f} "
            f"| {e.stranded_gpus:.2f} |")


def _worst(rigid: Any, run: Any, n: int) -> str:
    """The ``n`` jobs of ``run`` latest against ``rigid`` (10-minute floor, as ``slowdown``), one line each."""
    base = {j.job_id: j for j in rigid.jobs}
    floor = SLOWDOWN_FLOOR_S
    ranked = sorted(run.jobs, key=lambda j: -max(j.jct, floor) / max(base[j.job_id].jct, floor))[:n]
    lines = []
    for j in ranked:
        r = base[j.job_id]
        lines.append(f"    {max(j.jct, floor) / max(r.jct, floor):.2f}x {j.job_id} ({j.requested_gpus} GPUs"
                     f"{', molded' if j.molded else ''}): rigid waited {r.wait:.0f}s, "
                     f"ran {r.end_time - r.start_time:.0f}s;"
                     f" elastic waited {j.wait:.0f}s, ran {j.end_time - j.start_time:.0f}s at {list(j.gpus_seen)} GPUs")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="workloads")
    ap.add_argument("--workloads", default="1-8")
    ap.add_argument("--schedulers", default="greedy,backfill")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--policies", default="walk,allocator", help="the columns to run (walk, allocator, or both)")
    ap.add_argument("--worst", type=int, default=0, metavar="N",
                    help="under each row, its N latest jobs against rigid: GPUs asked, molded, waits and run "
                    "times in both runs, and the GPU counts it ran at")
    args = ap.parse_args(argv)
    extra = {k: tomllib.loads(f"v = {v}")["v"] for k, v in (s.split("=", 1) for s in args.set)}
    walk: PolicyConfig = config_from_mapping({"version": 1})
    alloc: PolicyConfig = config_from_mapping({"version": 1, **ALLOCATOR, **extra})
    started = time.perf_counter()
    for sched in args.schedulers.split(","):
        print(f"\n### {sched} base: elastic / rigid, per job against rigid (10-minute floor)\n")
        print("| workload, policy | avg JCT | p99 JCT | later | > 1.25x | > 2x | worst | stranded GPUs rigid "
              "| elastic |")
        print("|---|---|---|---|---|---|---|---|---|")
        for wset in args.sets.split(","):
            for n in _workloads(args.workloads):
                workload = load_workload(str(traces_dir() / "pollux" / wset / f"workload-{n}.csv"), "pollux")
                models = build_models(workload, 4, random.Random(0))
                rigid = simulate_one(workload, SimConfig(16, 4, scheduler=sched), models)  # type: ignore[arg-type]
                b = summarize(rigid)
                for label, cfg in (("walk", walk), ("allocator", alloc)):
                    if label not in args.policies.split(","):
                        continue
                    sim = SimConfig(16, 4, scheduler=sched, moldable_start=True)  # type: ignore[arg-type]
                    run = simulate_one(workload, sim, models, policy=ProductionPolicy(cfg, sim))
                    print(_row(f"{wset}/{n} {label}", b, summarize(run), slowdown(rigid, run)), flush=True)
                    if args.worst:
                        print(_worst(rigid, run, args.worst), flush=True)
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
