"""Wall time of ``slurm-elastic simulate`` end to end, as a ratio to the CLI's bare start-up in the same run.

    .venv/bin/python bench/bench_simulator.py [--repeat N]

Cases: one Pollux workload (160 jobs, 16 x 4 GPUs) under each base scheduler, and each ITP cluster file on
8-GPU nodes sized so that the trace's mean GPU demand is 80% of the cluster (and its largest job fits).
Targets (docs/performance.md): a Pollux workload under 10 s, an ITP cluster file under 2 minutes.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_elastic.sim.traces import traces_dir  # noqa: E402

_SCRIPT = Path(sys.executable).with_name("slurm-elastic")
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from slurm_elastic.cli import main; main()"]


def _time(args: list[str], repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True, timeout=600)
        best = min(best, time.perf_counter() - start)
    return best


def _itp_nodes(archive: Path, member: str) -> tuple[int, int]:
    with tarfile.open(archive, "r:*") as tar:
        handle = tar.extractfile(member)
        assert handle is not None
        rows = list(csv.DictReader(io.StringIO(handle.read().decode())))
    submits = [float(r["submission_time"]) for r in rows]
    demand = sum(float(r["duration"]) * int(r["num_gpu"]) for r in rows) / (max(submits) - min(submits))
    largest = max(int(r["num_gpu"]) for r in rows)
    return len(rows), max(math.ceil(largest / 8), math.ceil(demand / 0.8 / 8))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    root = traces_dir()
    startup = _time([*CLI, "--version"], max(3, args.repeat))
    print(f"baseline: CLI start-up {startup:.2f} s")
    print(f"{'case':<44}{'jobs':>7}{'cluster':>10}{'wall (s)':>10}{'x start-up':>12}")
    pollux = str(root / "pollux" / "workloads" / "workload-6.csv")
    for scheduler in ("fifo", "greedy", "backfill"):
        cmd = [*CLI, "simulate", pollux, "--format", "pollux", "--nodes", "16", "--gpus-per-node", "4"]
        wall = _time([*cmd, "--scheduler", scheduler, "--json"], args.repeat)
        print(f"{'pollux workload-6 ' + scheduler:<44}{160:>7}{'16x4':>10}{wall:>10.2f}{wall / startup:>12.1f}")
    archive = root / "itp" / "raw-traces.tar.gz"
    for number in range(1, 11):
        member = f"cluster{number:02d}.csv"
        jobs, nodes = _itp_nodes(archive, member)
        cmd = [*CLI, "simulate", f"{archive}#{member}", "--format", "itp", "--nodes", str(nodes)]
        wall = _time([*cmd, "--gpus-per-node", "8", "--json"], args.repeat)
        print(f"{'itp ' + member + ' backfill':<44}{jobs:>7}{f'{nodes}x8':>10}{wall:>10.2f}{wall / startup:>12.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
