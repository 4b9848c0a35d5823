"""A bounded sweep of policy settings on the Pollux workloads: which configuration to ship as the defaults.

Each variant is the base policy file with a few keys changed. Every variant runs on the chosen workloads
(1-4 by default: the defaults are chosen on these only, 5-8 and the 0.5x/1.5x sets are held out) on both base
schedulers (FIFO + greedy backfill and EASY backfill), 16 nodes x 4 GPUs; every ratio is against rigid on the
same base in the same run. Prints one Markdown row per variant: mean and worst change of average JCT, mean and
worst change of p99, and jobs waiting over 4 h (elastic / rigid), per base.

    .venv/bin/python bench/sweep_policy.py [--base bench/sim-policy.toml] [--workloads 1-4]
        [--only band,cooldown] [--variant 'name:key=value,key=value' ...]

About 1 s per simulation on an idle 2-core VM: the built-in grid (11 variants x 4 workloads x 2 bases) takes
about 2 minutes, 5-10 while other work runs. Values in ``--variant`` are TOML (``true``, ``90``, ``"USR1"``).
"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from sim_elastic import Bench, _workloads  # noqa: E402

from slurm_elastic.policy import config_from_mapping  # noqa: E402

SCHEDULERS = (("greedy", "greedy"), ("backfill", "EASY"))

#: (group, variant name, keys changed from the base). The base itself is always the first row.
GRID: tuple[tuple[str, str, Mapping[str, Any]], ...] = (
    ("seed", "seed: 40..80, no shrink_to_admit", {"shrink_to_admit": False, "scale_up_above": 80,
                                                  "scale_down_below": 40}),
    ("seed", "seed band 40..80 + shrink_to_admit", {"scale_up_above": 80, "scale_down_below": 40}),
    ("band", "band 10..90", {"scale_down_below": 10}),
    ("band", "band 30..90", {"scale_down_below": 30}),
    ("band", "band 20..95", {"scale_up_above": 95}),
    ("timing", "cooldown 600 s", {"cooldown_s": 600}),
    ("timing", "step 2", {"step": 2}),
    ("rules", "goodput on", {"goodput": True}),
    ("tail", "tail_protection (30%, 1 h)", {"tail_protection": True}),
    ("tail", "tail_protection 50%", {"tail_protection": True, "max_shrunk_share": 50}),
    ("tail", "victim_by_service", {"victim_by_service": True}),
)


def _parse_variant(text: str) -> tuple[str, str, dict[str, Any]]:
    name, _, body = text.partition(":")
    if not body:
        raise argparse.ArgumentTypeError(f"expected 'name:key=value,...', not {text!r}")
    keys: dict[str, Any] = {}
    for item in body.split(","):
        key, _, raw = item.partition("=")
        try:
            keys[key.strip()] = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError as exc:
            raise argparse.ArgumentTypeError(f"{item!r}: {exc}") from None
    return "cli", name, keys


def _cell(values: Sequence[float]) -> str:
    mean = sum(values) / len(values)
    return f"{mean * 100:+.0f}% (worst {max(values) * 100:+.0f}%)"


def sweep(bench: Bench, base: Mapping[str, Any], variants: Sequence[tuple[str, str, Mapping[str, Any]]],
          workloads: Sequence[int], bases: Sequence[tuple[str, str]] = SCHEDULERS) -> None:
    head = " | ".join(f"{label} Δ avg | {label} Δ p99 | {label} >4 h" for _, label in bases)
    print(f"| variant | {head} |")
    print("|---|" + "---|" * (3 * len(bases)))
    for _, name, keys in (("base", "base", {}), *variants):
        cfg = config_from_mapping({**base, **keys}, name)
        cells: list[str] = []
        for sched, _ in bases:
            d_avg: list[float] = []
            d_p99: list[float] = []
            starved = rigid_starved = 0
            for n in workloads:
                b = bench.run("workloads", n, None, scheduler=sched)
                e = bench.run("workloads", n, cfg, scheduler=sched)
                d_avg.append(e.avg_jct / b.avg_jct - 1)
                d_p99.append(e.p99_jct / b.p99_jct - 1)
                starved += e.starvation
                rigid_starved += b.starvation
            cells += [_cell(d_avg), _cell(d_p99), f"{starved} / {rigid_starved}"]
        label = name if not keys else f"{name} (`{', '.join(f'{k}={v}' for k, v in keys.items())}`)"
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, default=ROOT / "bench" / "sim-policy.toml")
    parser.add_argument("--workloads", type=_workloads, default=list(range(1, 5)))
    parser.add_argument("--only", default="", help="comma-separated grid groups (default: all)")
    parser.add_argument("--variant", type=_parse_variant, action="append", default=[],
                        help="'name:key=value,...' (TOML values); replaces the built-in grid")
    parser.add_argument("--bases", default="greedy,backfill", help="base schedulers: greedy, backfill (EASY)")
    parser.add_argument("--moldable-start", action="store_true",
                        help="elastic runs start waiting jobs on fewer nodes when that starts them now")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    args = parser.parse_args()
    base = tomllib.loads(args.base.read_text(encoding="utf-8"))
    groups = {g for g in args.only.split(",") if g}
    variants = args.variant or [v for v in GRID if not groups or v[0] in groups]
    bench = Bench(args.nodes, args.gpus_per_node)
    bench.moldable_start = args.moldable_start
    start = time.perf_counter()
    print(f"\nbase: {args.base.name}; workloads {args.workloads}; {args.nodes} x {args.gpus_per_node} GPUs; "
          "change against rigid on the same base; >4 h: jobs waiting over 4 h, elastic / rigid\n")
    bases = [b for b in SCHEDULERS if b[0] in args.bases.split(",")]
    sweep(bench, base, variants, args.workloads, bases)
    print(f"\n{bench.runs} simulations, {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
