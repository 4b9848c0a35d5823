"""Power saving in the simulator: energy (powered node-hours) and JCT, elastic against rigid in the same run.

The cluster (16 x 4 GPUs by default) has its last ``--cold-nodes`` nodes under Slurm's power saving
(slurm_elastic/sim/power.py): off while idle, booting for ``--resume-s`` when a job lands on one, off again after
``--suspend-s`` idle. Rigid and elastic (the production policy through the simulator's adapter, the same policy
file as bench/sim_elastic.py) run on the same seeded models. Energy is powered node-hours up to the later of the
two runs' ends (after a run ends its always-on nodes stay on), against the same window with every node always on
(no power saving); JCT also against the same runs without power saving, for the cost of the boots. Prints
Markdown (docs/performance.md, docs/power-saving.md).

    .venv/bin/python bench/sim_power.py [--workloads 1-8] [--cold-nodes 8] [--resume-s 23] [--suspend-s 600]

``--resume-s`` default 23: measured on the test cluster, from the extension's submission to its job running on
a powered-down node (resume 4.0 s + start 18.7 s, tests/cluster/test_power_saving_cluster.py). A physical node
boots in minutes: ``--resume-s 300`` shows that case.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_elastic.policy import PolicyConfig, config_from_mapping  # noqa: E402
from slurm_elastic.sim.config import SimConfig  # noqa: E402
from slurm_elastic.sim.engine import SimResult  # noqa: E402
from slurm_elastic.sim.loaders import load_workload  # noqa: E402
from slurm_elastic.sim.metrics import summarize  # noqa: E402
from slurm_elastic.sim.perfmodel.factory import build_models  # noqa: E402
from slurm_elastic.sim.policy_adapter import ProductionPolicy  # noqa: E402
from slurm_elastic.sim.power import PowerSaving  # noqa: E402
from slurm_elastic.sim.run import simulate_one  # noqa: E402
from slurm_elastic.sim.traces import traces_dir  # noqa: E402


def _workloads(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def _run(n: int, sim: SimConfig, cfg: PolicyConfig | None) -> SimResult:
    workload = load_workload(str(traces_dir() / "pollux" / "workloads" / f"workload-{n}.csv"), "pollux")
    models = build_models(workload, sim.gpus_per_node, random.Random(0))
    return simulate_one(workload, sim, models, policy=ProductionPolicy(cfg, sim) if cfg is not None else None)


def _pct(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.0f}%"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", type=Path, default=ROOT / "bench" / "sim-policy.toml")
    parser.add_argument("--workloads", type=_workloads, default=list(range(1, 9)))
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--cold-nodes", type=int, default=8)
    parser.add_argument("--resume-s", type=float, default=23.0)
    parser.add_argument("--suspend-s", type=float, default=600.0)
    parser.add_argument("--scheduler", choices=["backfill", "greedy"], default="backfill")
    args = parser.parse_args()
    cfg = config_from_mapping(tomllib.loads(args.policy.read_text(encoding="utf-8")), str(args.policy))
    power = PowerSaving(cold_nodes=args.cold_nodes, resume_s=args.resume_s, suspend_s=args.suspend_s)
    sim = SimConfig(args.nodes, args.gpus_per_node, scheduler=args.scheduler, power=power)
    plain = SimConfig(args.nodes, args.gpus_per_node, scheduler=args.scheduler)
    print(f"\n### Power saving: {args.cold_nodes} of {args.nodes} nodes off while idle (resume {args.resume_s:g} s, "
          f"off after {args.suspend_s:g} s idle), {args.scheduler} base, {args.policy.name}\n")
    print("| workload | avg JCT rigid | avg JCT elastic | Δ avg | makespan h rigid / elastic | node-h always on "
          "| node-h rigid | node-h elastic | Δ node-h | resumes rigid / elastic "
          "| JCT cost of the boots rigid / elastic |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    start = time.perf_counter()
    sums: dict[str, list[float]] = {k: [] for k in ("jct", "energy", "cost_r", "cost_e")}
    for n in args.workloads:
        r, e = _run(n, sim, None), _run(n, sim, cfg)
        r0, e0 = _run(n, plain, None), _run(n, plain, cfg)
        assert r.power is not None and e.power is not None
        mr, me = summarize(r), summarize(e)
        jr0, je0 = summarize(r0).avg_jct, summarize(e0).avg_jct
        end = max(r.power.horizon_s, e.power.horizon_s)
        er, ee, always = r.power.until(end), e.power.until(end), args.nodes * end
        sums["jct"].append(me.avg_jct / mr.avg_jct - 1)
        sums["energy"].append(ee / er - 1)
        sums["cost_r"].append(mr.avg_jct / jr0 - 1)
        sums["cost_e"].append(me.avg_jct / je0 - 1)
        print(f"| workload-{n} | {mr.avg_jct:,.0f} | {me.avg_jct:,.0f} | {_pct(me.avg_jct, mr.avg_jct)} "
              f"| {r.power.horizon_s / 3600:.1f} / {e.power.horizon_s / 3600:.1f} | {always / 3600:,.0f} "
              f"| {er / 3600:,.0f} ({_pct(er, always)}) | {ee / 3600:,.0f} ({_pct(ee, always)}) | {_pct(ee, er)} "
              f"| {r.power.resumes} / {e.power.resumes} | {_pct(mr.avg_jct, jr0)} / {_pct(me.avg_jct, je0)} |")

    def mean(k: str) -> str:
        return f"{sum(sums[k]) / len(sums[k]) * 100:+.0f}%"
    print(f"| **mean** | | | **{mean('jct')}** | | | | | **{mean('energy')}** | "
          f"| {mean('cost_r')} / {mean('cost_e')} |")
    print(f"\n{4 * len(args.workloads)} simulations in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
