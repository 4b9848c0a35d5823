"""Elastic vs rigid on the Pollux workloads: the tables of docs/performance.md ("Elastic vs rigid").

Every elastic run calls the production policy (``slurm_elastic.policy.decide``) through
``slurm_elastic.sim.policy_adapter``; every ratio is elastic / rigid baseline, both measured in this run on the
same seeded models. Prints Markdown.

    .venv/bin/python bench/sim_elastic.py [--table main|sets|defaults|rules|rules-defaults|artifact|limits|all]
        [--policy bench/sim-policy.toml] [--workloads 1-8] [--rules speedup_growth,...] [--moldable-start]
        [--nodes 16] [--gpus-per-node 4]

One row of ``main`` is also one CLI call:
``slurm-elastic simulate traces/pollux/workloads/workload-N.csv --format pollux --nodes 16
--gpus-per-node 4 --policy bench/sim-policy.toml --json``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_elastic.policy import PolicyConfig, config_from_mapping, default_config  # noqa: E402
from slurm_elastic.policy.schema import DEFAULTS  # noqa: E402
from slurm_elastic.sim.config import SimConfig  # noqa: E402
from slurm_elastic.sim.engine import SimResult  # noqa: E402
from slurm_elastic.sim.loaders import load_workload  # noqa: E402
from slurm_elastic.sim.metrics import Metrics, Slowdown, slowdown, summarize  # noqa: E402
from slurm_elastic.sim.perfmodel.base import JobPerf  # noqa: E402
from slurm_elastic.sim.perfmodel.factory import build_models  # noqa: E402
from slurm_elastic.sim.policy_adapter import AdapterSettings, ProductionPolicy  # noqa: E402
from slurm_elastic.sim.run import simulate_one  # noqa: E402
from slurm_elastic.sim.traces import traces_dir  # noqa: E402
from slurm_elastic.sim.workload import Workload  # noqa: E402

# The switched rules: (label, key, value when on, value when off). Each is flipped, one at a time, against a base.
RULES: tuple[tuple[str, str, Any, Any], ...] = (
    ("shrink_to_admit", "shrink_to_admit", True, False),
    ("fair_share", "fair_share", True, False),
    ("restart_cost", "restart_cost_aware", True, False),
    ("goodput", "goodput", True, False),
    ("reserve", "free_node_reserve", 1, 0),
    ("extend_time_limit", "extend_time_limit_on_shrink", True, False),
    ("tail_protection", "tail_protection", True, False),
    ("victim_by_service", "victim_by_service", True, False),
    ("speedup_growth", "speedup_growth", True, False),
    ("victim_by_remaining", "victim_by_remaining", True, False),
    ("admit_keep_50", "admit_keep_percent", 50, 0),
)
ARTIFACT = {"rigid FIFO + greedy backfill": 6262, "Tiresias": 3470, "Pollux": 2446}


class Bench:
    def __init__(self, nodes: int, gpus_per_node: int, scheduler: str = "backfill") -> None:
        self.nodes, self.gpus_per_node = nodes, gpus_per_node
        self.scheduler = scheduler  # the base scheduler of every table but "artifact": backfill (EASY) or greedy
        self.moldable_start = False  # SimConfig.moldable_start for elastic runs (rigid baselines never mold)
        self._loaded: dict[tuple[str, int], tuple[Workload, dict[str, JobPerf]]] = {}
        self._baselines: dict[tuple[str, int, str], tuple[Metrics, SimResult]] = {}
        self.per_job: Slowdown | None = None  # the last elastic run's jobs against the same rigid run
        self.runs = 0
        self.seconds = 0.0

    def _workload(self, wset: str, n: int) -> tuple[Workload, dict[str, JobPerf]]:
        key = (wset, n)
        if key not in self._loaded:
            workload = load_workload(str(traces_dir() / "pollux" / wset / f"workload-{n}.csv"), "pollux")
            self._loaded[key] = (workload, build_models(workload, self.gpus_per_node, random.Random(0)))
        return self._loaded[key]

    def run(self, wset: str, n: int, cfg: PolicyConfig | None, *, scheduler: str | None = None,
            settings: AdapterSettings | None = None) -> Metrics:
        """One run's metrics; an elastic run (``cfg``) also sets :attr:`per_job` against the rigid run."""
        scheduler = scheduler or self.scheduler
        key = (wset, n, scheduler)
        if cfg is None and key in self._baselines:
            return self._baselines[key][0]
        workload, models = self._workload(wset, n)
        sim = SimConfig(self.nodes, self.gpus_per_node, scheduler=scheduler,  # type: ignore[arg-type]
                        moldable_start=self.moldable_start)
        policy = ProductionPolicy(cfg, sim, settings) if cfg is not None else None
        start = time.perf_counter()
        result = simulate_one(workload, sim, models, policy=policy)
        metrics = summarize(result)
        self.seconds += time.perf_counter() - start
        self.runs += 1
        if cfg is None:
            self._baselines[key] = (metrics, result)
        else:
            self.run(wset, n, None, scheduler=scheduler)
            self.per_job = slowdown(self._baselines[key][1], result)
        return metrics


def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def _pct(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.0f}%"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def table_compare(bench: Bench, wset: str, workloads: Sequence[int], cfg: PolicyConfig, title: str, *,
                  settings: AdapterSettings | None = None) -> None:
    print(f"\n### {title} ({bench.scheduler} base)\n")
    print("| workload | avg JCT rigid | avg JCT elastic | Δ avg | p50 rigid | p50 elastic | p99 rigid | p99 elastic "
          "| Δ p99 | starved rigid / elastic | resizes per job | jobs > 1.25x / > 2x rigid | worst job |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    d_avg: list[float] = []
    d_p99: list[float] = []
    l125: list[float] = []  # per job against rigid (10-minute floor): share > 1.25x, > 2x, the worst ratio
    l2: list[float] = []
    worst: list[float] = []
    starved = [0, 0]
    for n in workloads:
        b = bench.run(wset, n, None)
        e = bench.run(wset, n, cfg, settings=settings)
        sd = bench.per_job
        assert sd is not None
        l125.append(sd.later_125)
        l2.append(sd.later_2)
        worst.append(sd.worst)
        d_avg.append(e.avg_jct / b.avg_jct - 1)
        d_p99.append(e.p99_jct / b.p99_jct - 1)
        starved[0] += b.starvation
        starved[1] += e.starvation
        print(f"| {wset}/workload-{n} | {_fmt(b.avg_jct)} | {_fmt(e.avg_jct)} | {_pct(e.avg_jct, b.avg_jct)} "
              f"| {_fmt(b.p50_jct)} | {_fmt(e.p50_jct)} | {_fmt(b.p99_jct)} | {_fmt(e.p99_jct)} "
              f"| {_pct(e.p99_jct, b.p99_jct)} | {b.starvation} / {e.starvation} | {e.resizes:.2f} "
              f"| {sd.later_125:.1%} / {sd.later_2:.1%} | {sd.worst:.2f}x |")
    print(f"| **mean** | | | **{_mean(d_avg) * 100:+.0f}%** | | | | | **{_mean(d_p99) * 100:+.0f}%** "
          f"| **{starved[0]} / {starved[1]}** | | **{_mean(l125):.1%} / {_mean(l2):.1%}** | |")
    print(f"| **worst** | | | **{max(d_avg) * 100:+.0f}%** | | | | | **{max(d_p99) * 100:+.0f}%** | | "
          f"| **{max(l125):.1%} / {max(l2):.1%}** | **{max(worst):.2f}x** |")


def table_rules(bench: Bench, workloads: Sequence[int], base: Mapping[str, Any], name: str,
                only: Sequence[str] = ()) -> None:
    """One column per rule flipped against ``base``, then all on; ``only``: just those rules, no "all on"."""
    print(f"\n### Per rule, against {name}: avg JCT / p99 JCT, change from the rigid baseline\n")
    variants: list[tuple[str, PolicyConfig]] = [(name, config_from_mapping(base, name))]
    every: dict[str, Any] = {}
    for label, key, on, off in RULES:
        if only and label not in only:
            continue
        is_on = base.get(key, DEFAULTS[key]) == on  # a key not in the base has its packaged default
        every[key] = on
        variants.append((f"{label} {'off' if is_on else 'on'}",
                         config_from_mapping({**base, key: off if is_on else on}, label)))
    if not only:
        variants.append(("all on", config_from_mapping({**base, **every}, "all on")))
    print("| workload | rigid avg | " + " | ".join(label for label, _ in variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    sums: list[list[float]] = [[] for _ in variants]
    sums99: list[list[float]] = [[] for _ in variants]
    for n in workloads:
        b = bench.run("workloads", n, None)
        cells = []
        for i, (_, cfg) in enumerate(variants):
            e = bench.run("workloads", n, cfg)
            sums[i].append(e.avg_jct / b.avg_jct - 1)
            sums99[i].append(e.p99_jct / b.p99_jct - 1)
            cells.append(f"{_pct(e.avg_jct, b.avg_jct)} / {_pct(e.p99_jct, b.p99_jct)}")
        print(f"| workload-{n} | {_fmt(b.avg_jct)} | " + " | ".join(cells) + " |")
    print("| **mean** | | " + " | ".join(
        f"**{_mean(a) * 100:+.0f}% / {_mean(p) * 100:+.0f}%**" for a, p in zip(sums, sums99, strict=True)) + " |")


def table_artifact(bench: Bench, cfg: PolicyConfig) -> None:
    print("\n### Workload-6 beside the Pollux artifact (average JCT, 16 x 4 GPUs)\n")
    print("| scheduler | average JCT (s) | p99 JCT (s) | source |")
    print("|---|---|---|---|")
    for label, value in ARTIFACT.items():
        print(f"| {label} | {_fmt(value)} | | artifact simulator |")
    for sched, label in (("greedy", "FIFO + greedy backfill"), ("backfill", "EASY backfill")):
        b = bench.run("workloads", 6, None, scheduler=sched)
        e = bench.run("workloads", 6, cfg, scheduler=sched)
        print(f"| rigid, {label} | {_fmt(b.avg_jct)} | {_fmt(b.p99_jct)} | ours |")
        print(f"| elastic (production policy), {label} | {_fmt(e.avg_jct)} | {_fmt(e.p99_jct)} | ours |")


def _workloads(text: str) -> list[int]:
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", default="all",
                        choices=["main", "sets", "defaults", "rules", "rules-defaults", "artifact", "limits", "all"])
    parser.add_argument("--policy", type=Path, default=ROOT / "bench" / "sim-policy.toml")
    parser.add_argument("--workloads", type=_workloads, default=list(range(1, 9)))
    parser.add_argument("--scheduler", choices=["backfill", "greedy"], default="backfill",
                        help="base scheduler of rigid and elastic: EASY backfill or FIFO + greedy backfill")
    parser.add_argument("--rules", default="", help="--table rules/rules-defaults: only these comma-separated "
                        f"rules ({', '.join(r[0] for r in RULES)}), without the 'all on' column")
    parser.add_argument("--moldable-start", action="store_true",
                        help="elastic runs start waiting jobs on fewer whole nodes when that starts them now")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    args = parser.parse_args()
    only = [r for r in args.rules.split(",") if r]
    unknown = sorted(set(only) - {r[0] for r in RULES})
    if unknown:
        parser.error(f"unknown rule(s) {', '.join(unknown)}")
    base = tomllib.loads(args.policy.read_text(encoding="utf-8"))
    cfg = config_from_mapping(base, str(args.policy))
    bench = Bench(args.nodes, args.gpus_per_node, args.scheduler)
    bench.moldable_start = args.moldable_start
    steps: list[tuple[str, Callable[[], None]]] = [
        ("main", lambda: table_compare(bench, "workloads", args.workloads, cfg,
                                       f"Rigid vs elastic ({args.policy.name})")),
        ("sets", lambda: [table_compare(bench, s, args.workloads, cfg, f"{s}: rigid vs elastic ({args.policy.name})")
                          for s in ("workloads-0.5", "workloads-1.5")]),
        ("defaults", lambda: table_compare(bench, "workloads", args.workloads, default_config(),
                                           "Rigid vs elastic with the packaged policy defaults (no --policy)")),
        ("rules", lambda: table_rules(bench, args.workloads, base, args.policy.name, only)),
        ("rules-defaults", lambda: table_rules(bench, args.workloads, {"version": 1}, "the packaged defaults",
                                               only)),
        ("artifact", lambda: table_artifact(bench, cfg)),
        ("limits", lambda: table_compare(bench, "workloads", args.workloads, cfg,
                                         "Sensitivity: the policy sees no time limits (UNLIMITED jobs)",
                                         settings=AdapterSettings(time_limits=False))),
    ]
    wanted = {name for name, _ in steps} if args.table == "all" else {args.table}
    start = time.perf_counter()
    for name, step in steps:
        if name in wanted:
            step()
    print(f"\n{bench.runs} simulations, {bench.seconds:.0f} s simulating, {time.perf_counter() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
