"""How good the linear-sync speedup model (slurm_elastic/policy/speedup.py) is against the Pollux traces.

For every (application, global batch) of the Pollux workloads 1-8 and every whole-node size n from 1 up to the
job's largest valid size (4 GPUs per node by default), the *true* speedup of growing to n + 1 nodes is the
ratio of the throughputs the simulator's Pollux model reads from the traces' scalability.csv/placements.csv
(step and sync times per placement and per-GPU batch, at the job's fixed global batch), and the *predicted*
one is what speedup_growth computes from the GPU utilization at n nodes alone (compute share of a step). Prints
a Markdown table per application: mean absolute error of the speedup, mean signed error of the marginal
efficiency, and how often the grow/no-grow call at goodput_min_marginal_efficiency (0.5) agrees.
``--sync-growth 0`` measures the constant-sync (Amdahl) form instead of the shipped linear one (1).

    .venv/bin/python bench/speedup_model.py [--gpus-per-node 4] [--threshold 0.5] [--sync-growth 1]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_elastic.policy.speedup import efficiency_of, model_speedup  # noqa: E402
from slurm_elastic.sim.perfmodel.appdata import load_app  # noqa: E402
from slurm_elastic.sim.perfmodel.pollux import PolluxApplication, PolluxJobPerf  # noqa: E402
from slurm_elastic.sim.traces import pollux_app_dir, traces_dir  # noqa: E402


def _jobs() -> set[tuple[str, int]]:
    found: set[tuple[str, int]] = set()
    for n in range(1, 9):
        path = ROOT / "traces" / "pollux" / "workloads" / f"workload-{n}.csv"
        with path.open(encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                found.add((row["application"], int(row["batch_size"])))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--sync-growth", type=float, default=1.0, help="sync time ~ nodes ** this (model: 1)")
    args = parser.parse_args()
    gpn = args.gpus_per_node
    apps: dict[str, PolluxApplication] = {}
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    for name, batch in sorted(_jobs()):
        app = apps.get(name)
        if app is None:
            app = apps[name] = PolluxApplication(load_app(pollux_app_dir(traces_dir(), name)))
        perf = PolluxJobPerf(app, batch)
        top = perf.max_gpus // gpn
        for n in range(1, top):
            small, big = (gpn,) * n, (gpn,) * (n + 1)
            true = perf.throughput(big) / perf.throughput(small)
            pred = model_speedup(100.0 * perf.utilization(small), n, 1, args.sync_growth)
            rows.setdefault(name, []).append((true, pred, efficiency_of(true, n, 1), efficiency_of(pred, n, 1)))
    thr = args.threshold
    print(f"\n{gpn} GPUs per node; sync time ~ nodes ** {args.sync_growth:g}; grow call at marginal efficiency "
          f">= {thr}\n")
    print("| application | (batch, n -> n+1) pairs | true speedup (mean) | predicted (mean) | mean abs error | "
          "efficiency error (mean, signed) | same grow call |")
    print("|---|---|---|---|---|---|---|")
    every: list[tuple[float, float, float, float]] = []
    for name, got in sorted(rows.items()):
        every += got
        print(_row(name, got, thr))
    print(_row("**all**", every, thr))
    return 0


def _row(name: str, got: list[tuple[float, float, float, float]], thr: float) -> str:
    k = len(got)
    agree = sum((te >= thr) == (pe >= thr) for _, _, te, pe in got)
    return (f"| {name} | {k} | {sum(t for t, _, _, _ in got) / k:.3f} | {sum(p for _, p, _, _ in got) / k:.3f} | "
            f"{sum(abs(p - t) for t, p, _, _ in got) / k:.3f} | {sum(pe - te for _, _, te, pe in got) / k:+.2f} | "
            f"{agree} / {k} ({agree / k:.0%}) |")


if __name__ == "__main__":
    sys.exit(main())
