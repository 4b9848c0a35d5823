"""Time one policy cycle on a big synthetic cluster: 10,000 jobs on 2,000 nodes.

Prints the time per ``decide()`` call and its ratio to the time it takes to build the same input (measured in
the same run, so the ratio means something on a noisy machine). No assertions: performance lives here, not
in the tests.

    .venv/bin/python bench/policy_cycle.py [--jobs 10000] [--nodes 2000] [--repeat 5] [--seed 1] [--allocator]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_elastic.directives.spec import ElasticSpec  # noqa: E402
from slurm_elastic.policy import (  # noqa: E402
    Action,
    ElasticUnit,
    ExtensionJob,
    JobUtilization,
    Outcome,
    PolicyConfig,
    PolicyInput,
    ResizeRecord,
    config_from_mapping,
    decide,
)
from slurm_elastic.slurm.model import ClusterSnapshot, GresCount, Job, Node, Partition  # noqa: E402

NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
PARTITIONS = ("gpu", "gpu", "gpu", "train", "serve")


def _job(job_id: int, rnd: random.Random, *, running: bool, nodes: tuple[str, ...], partition: str,
         gpus: int) -> Job:
    return Job(
        job_id=job_id, name=f"j{job_id}", user=f"u{job_id % 50}", account=f"acct{job_id % 7}",
        partition=partition, qos=("normal", "high", "low")[job_id % 3], priority=rnd.randint(1, 100_000),
        state="RUNNING" if running else "PENDING", state_reason=None if running else rnd.choice(
            ["Resources", "Priority", "Dependency", "QOSMaxGRESPerUser"]),
        nodes=nodes, batch_host=nodes[0] if nodes else None, node_count=max(1, len(nodes)) if running
        else rnd.randint(1, 4), tres_per_node=f"gres:gpu:{gpus}", gres_per_node=(GresCount("gpu", None, gpus),),
        time_limit_min=rnd.choice([None, 240, 1440]), submit_time=NOW - timedelta(hours=5),
        start_time=NOW - timedelta(seconds=rnd.randint(60, 20_000)) if running else None, end_time=None,
        comment="", admin_comment="",
    )


def build_input(n_jobs: int, n_nodes: int, seed: int) -> PolicyInput:
    """60% of the jobs run (small ones share nodes; 60% of them are elastic, some with extension jobs), the
    rest are pending; about 3% of the nodes stay idle."""
    rnd = random.Random(seed)
    names = [f"node{i:05d}" for i in range(n_nodes)]
    part_of = {n: rnd.choice(PARTITIONS) for n in names}
    gpus_per_node = 8
    used: dict[str, int] = dict.fromkeys(names, 0)
    idle = list(names)
    rnd.shuffle(idle)
    reserve_idle = max(1, n_nodes // 33)
    shared: list[str] = []  # nodes with some GPUs left for single-node jobs
    jobs: list[Job] = []
    units: list[ElasticUnit] = []
    utilization: dict[int, JobUtilization] = {}
    history: list[ResizeRecord] = []
    n_running = int(n_jobs * 0.6)
    next_ext = 10_000_000

    def whole_node() -> str | None:
        if len(idle) <= reserve_idle:
            return None
        n = idle.pop()
        used[n] = gpus_per_node
        return n

    for job_id in range(1, n_jobs + 1):
        taken: tuple[str, ...] = ()
        gpus = rnd.choice([1, 1, 1, 2, 2, 2, 4, 8])
        if job_id <= n_running:
            width = rnd.choice([1, 1, 1, 2, 4]) if gpus == 8 else 1
            if width == 1 and gpus < gpus_per_node:
                while shared and used[shared[-1]] + gpus > gpus_per_node:
                    shared.pop()
                if not shared and len(idle) > reserve_idle:
                    shared.append(idle.pop())
                if shared:
                    used[shared[-1]] += gpus
                    taken = (shared[-1],)
            else:
                picked = [whole_node() for _ in range(width)]
                taken = tuple(sorted(n for n in picked if n is not None))
        if taken:
            j = _job(job_id, rnd, running=True, nodes=taken, partition=part_of[taken[0]], gpus=gpus)
            jobs.append(j)
            if rnd.random() < 0.6:
                exts: list[ExtensionJob] = []
                if rnd.random() < 0.1 and (en := whole_node()) is not None:
                    exts.append(ExtensionJob(next_ext, "RUNNING", (en,), 1, NOW - timedelta(seconds=900),
                                             NOW - timedelta(seconds=890), en))
                    next_ext += 1
                spec = ElasticSpec(min_nodes=1, max_nodes=len(taken) + rnd.randint(0, 4),
                                   explicit=frozenset({"min_nodes", "max_nodes"}))
                units.append(ElasticUnit(j, spec, tuple(exts)))
                utilization[job_id] = JobUtilization(
                    job_id, rnd.uniform(0, 100), 100.0, rnd.choice([300.0, 600.0, 900.0]), rnd.randint(5, 120),
                    NOW - timedelta(seconds=rnd.choice([5, 30, 400])), gpus, gpus)
                if rnd.random() < 0.1:
                    history.append(ResizeRecord(NOW - timedelta(seconds=rnd.randint(10, 5000)), job_id,
                                                Action.GROW, 1, 2, Outcome.APPLIED, "OVERUTILIZED"))
        else:
            jobs.append(_job(job_id, rnd, running=False, nodes=(), partition=rnd.choice(PARTITIONS), gpus=gpus))
    nodes = tuple(
        Node(name=n, state="IDLE" if used[n] == 0 else ("ALLOCATED" if used[n] >= gpus_per_node else "MIXED"),
             state_flags=("DRAIN",) if rnd.random() < 0.01 else (), partitions=(part_of[n],), cpus=128,
             alloc_cpus=0, gres=(GresCount("gpu", None, gpus_per_node),),
             gres_used=(GresCount("gpu", None, used[n]),))
        for n in names
    )
    partitions = tuple(Partition(p, tuple(n for n in names if part_of[n] == p)) for p in sorted(set(PARTITIONS)))
    snapshot = ClusterSnapshot(NOW, tuple(jobs), nodes, partitions)
    return PolicyInput(snapshot, tuple(units), utilization, tuple(history),
                       {f"acct{i}": 1.0 + i for i in range(7)})


def site_config(allocator: bool = False) -> PolicyConfig:
    return config_from_mapping({
        "version": 1, "shrink_to_admit": True, "fair_share": True, "restart_cost_aware": True,
        "max_actions_per_cycle": 50, "partition": {"serve": {"free_node_reserve": 4}},
        "qos": {"low": {"max_extension_nodes_per_qos": 20}}, "allocator": allocator,
    }, "<bench>")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=2_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--allocator", action="store_true", help="the same site config with allocator = true")
    args = ap.parse_args()
    cfg = site_config(args.allocator)
    build_times, decide_times = [], []
    decisions = []
    for i in range(args.repeat):
        t0 = time.perf_counter()
        inp = build_input(args.jobs, args.nodes, args.seed + i)
        t1 = time.perf_counter()
        decisions = decide(inp, cfg, NOW)
        t2 = time.perf_counter()
        build_times.append(t1 - t0)
        decide_times.append(t2 - t1)
    build, dec = statistics.median(build_times), statistics.median(decide_times)
    acts = sum(d.is_action for d in decisions)
    print(f"jobs={args.jobs} nodes={args.nodes} units={len(inp.units)} "
          f"pending={sum(j.is_pending for j in inp.snapshot.jobs)} decisions={len(decisions)} actions={acts}")
    print(f"build input: {build * 1000:.1f} ms (median of {args.repeat})")
    print(f"decide():    {dec * 1000:.1f} ms (median of {args.repeat})")
    print(f"ratio decide/build: {dec / build:.2f}")


if __name__ == "__main__":
    main()
