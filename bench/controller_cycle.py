"""CPU cost of one controller cycle at scale: parse Slurm's JSON, decide, write the decisions to the store.

A synthetic cluster of 10,000 jobs on 2,000 nodes x 8 GPUs (16,000 GPUs), printed the way Slurm 22.05's
``squeue --json`` and ``sinfo --json`` print it (openapi/v0.0.38; the records are the ones in
tests/fixtures/slurm/22.05 with their fields varied). 60% of the jobs run; 60% of those carry an elastic spec
in their admin_comment (as plugins/job_submit.lua stores it), a tenth of those with an extension job; the rest
are pending. Per repetition, timed as process CPU time:

1. ``json.loads`` of both documents alone: the baseline every ratio is against;
2. parse: ``json.loads`` + ``parse_squeue`` + ``parse_nodes`` into a ClusterSnapshot;
3. units: ``controller.units.build_units`` (elastic units from the admin_comment specs);
4. policy: ``policy.decide`` (every rule behind a switch on), given agent utilization built beforehand;
5. DB write: ``store.decisions.begin_cycle`` + ``record_decisions`` (every decision, holds included, as the
   controller records them) + ``finish_cycle`` on a fresh SQLite file.

Target: parse + units + policy + DB write <= 1 s of CPU.

    .venv/bin/python bench/controller_cycle.py [--jobs 10000] [--nodes 2000] [--gpus-per-node 8] [--repeat 3]
    .venv/bin/python bench/controller_cycle.py --sizes 1000,10000,25000,51000,100000 --repeat 1   # growth table
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_elastic.controller.extension import ExtensionTag  # noqa: E402
from slurm_elastic.controller.units import SpecCache, build_units  # noqa: E402
from slurm_elastic.policy import Decision, JobUtilization, PolicyInput, config_from_mapping, decide  # noqa: E402
from slurm_elastic.slurm.hostlist import compress  # noqa: E402
from slurm_elastic.slurm.model import ClusterSnapshot, Partition  # noqa: E402
from slurm_elastic.slurm.openapi import gc_paused, parse_nodes, parse_squeue  # noqa: E402
from slurm_elastic.store import NewDecision, SqlStore  # noqa: E402
from slurm_elastic.store.sqlstore import sqlite_url  # noqa: E402

try:
    import orjson as _orjson_module

    _orjson: Any = _orjson_module
except ImportError:  # measured only where installed
    _orjson = None

FIXTURES = ROOT / "tests" / "fixtures" / "slurm" / "22.05"
NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
PARTITIONS = ("gpu", "gpu", "gpu", "train", "serve")


def _templates() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    squeue = json.loads((FIXTURES / "squeue.json").read_text())
    sinfo = json.loads((FIXTURES / "sinfo.json").read_text())
    running = next(j for j in squeue["jobs"] if j["job_state"] == "RUNNING")
    pending = next(j for j in squeue["jobs"] if j["job_state"] == "PENDING")
    return squeue, sinfo, running, pending


def build_documents(n_jobs: int, n_nodes: int, gpus_per_node: int, seed: int) -> tuple[str, str]:
    """(squeue --json text, sinfo --json text) of the synthetic cluster."""
    rnd = random.Random(seed)
    squeue, sinfo, run_t, pend_t = _templates()
    node_t = sinfo["nodes"][0]
    names = [f"node{i:05d}" for i in range(n_nodes)]
    part_of = {n: rnd.choice(PARTITIONS) for n in names}
    used = dict.fromkeys(names, 0)
    idle = list(names)
    rnd.shuffle(idle)
    keep_idle = max(1, n_nodes // 33)
    shared: list[str] = []
    jobs: list[dict[str, Any]] = []
    n_running = int(n_jobs * 0.6)
    next_ext = n_jobs + 1
    epoch = int(NOW.timestamp())

    def whole() -> str | None:
        if len(idle) <= keep_idle:
            return None
        n = idle.pop()
        used[n] = gpus_per_node
        return n

    def job(job_id: int, nodes: list[str], gpus: int, partition: str, *, admin: str = "", comment: str = "",
            node_count: int | None = None) -> dict[str, Any]:
        j = copy.copy(run_t if nodes else pend_t)
        start = epoch - rnd.randint(60, 20_000)
        j.update(job_id=job_id, name=f"j{job_id}", user_name=f"u{job_id % 50}", user_id=2000 + job_id % 50,
                 account=f"acct{job_id % 7}", partition=partition, qos=("normal", "high", "low")[job_id % 3],
                 priority=rnd.randint(1, 100_000), nodes=compress(nodes) if nodes else "",
                 batch_host=nodes[0] if nodes else "", node_count=node_count or max(1, len(nodes)),
                 tres_per_node=f"gres:gpu:{gpus}", time_limit=rnd.choice([None, 240, 1440]),
                 submit_time=epoch - 18_000, start_time=start if nodes else epoch + 3600,
                 end_time=start + 86_400 if nodes else epoch + 90_000, admin_comment=admin, comment=comment,
                 job_state="RUNNING" if nodes else "PENDING",
                 state_reason="None" if nodes else rnd.choice(["Resources", "Priority", "Dependency"]))
        return j

    for job_id in range(1, n_jobs + 1):
        gpus = rnd.choice([1, 1, 1, 2, 2, 2, 4, 8])
        partition = rnd.choice(PARTITIONS)
        taken: list[str] = []
        if job_id <= n_running:
            width = rnd.choice([1, 1, 1, 2, 4]) if gpus == gpus_per_node else 1
            if width == 1 and gpus < gpus_per_node:
                while shared and used[shared[-1]] + gpus > gpus_per_node:
                    shared.pop()
                if not shared and len(idle) > keep_idle:
                    shared.append(idle.pop())
                if shared:
                    used[shared[-1]] += gpus
                    taken = [shared[-1]]
            else:
                taken = sorted(n for n in (whole() for _ in range(width)) if n is not None)
            partition = part_of[taken[0]] if taken else partition
        if not taken:
            jobs.append(job(job_id, [], gpus, partition, node_count=rnd.randint(1, 4)))
            continue
        admin = ""
        if rnd.random() < 0.6:
            admin = f"[elastic:v1 min=1 max={len(taken) + rnd.randint(0, 4)}]"
            if rnd.random() < 0.1 and (ext := whole()) is not None:
                tag = ExtensionTag(job_id, f"c1:{job_id}:grow:1").render()
                jobs.append(job(next_ext, [ext], gpus_per_node, partition, comment=tag))
                next_ext += 1
        jobs.append(job(job_id, taken, gpus, partition, admin=admin))
    nodes = []
    for n in names:
        d = copy.copy(node_t)
        state = "idle" if used[n] == 0 else ("allocated" if used[n] >= gpus_per_node else "mixed")
        d.update(name=n, hostname=n, state=state, state_flags=["DRAIN"] if rnd.random() < 0.01 else [],
                 partitions=[part_of[n]], cpus=128, alloc_cpus=16 * used[n] // max(1, gpus_per_node),
                 gres=f"gpu:{gpus_per_node}", gres_used=f"gpu:{used[n]}(IDX:0-{max(0, used[n] - 1)})",
                 tres=f"cpu=128,mem=1000000M,billing=128,gres/gpu={gpus_per_node}")
        nodes.append(d)
    return (json.dumps({"meta": squeue["meta"], "errors": [], "jobs": jobs}),
            json.dumps({"meta": sinfo["meta"], "errors": [], "nodes": nodes}))


def site_config() -> Any:
    return config_from_mapping({
        "version": 1, "shrink_to_admit": True, "fair_share": True, "restart_cost_aware": True, "goodput": True,
        "max_actions_per_cycle": 50, "partition": {"serve": {"free_node_reserve": 4}},
        "qos": {"low": {"max_extension_nodes_per_qos": 20}},
    }, "<bench>")


def new_decision(d: Decision) -> NewDecision:
    """What the controller's cycle stores for one decision (slurm_elastic/controller/cycle.py)."""
    inputs = dict(d.inputs)
    inputs["basis"] = str(d.basis)
    return NewDecision(job_id=d.unit_id, action=str(d.action), reason=str(d.reason), message=d.message,
                       inputs=inputs, current_nodes=d.current_nodes, target_nodes=d.target_nodes,
                       signal=d.signal, profile=d.profile, paused=d.reason == "PAUSED")


def _snapshot(squeue_text: str, sinfo_text: str) -> ClusterSnapshot:
    with gc_paused():  # as SlurmCli.snapshot() reads
        _, jobs = parse_squeue(json.loads(squeue_text))
        _, nodes = parse_nodes(json.loads(sinfo_text))
    parts = sorted({p for n in nodes for p in n.partitions})
    return ClusterSnapshot(NOW, jobs, nodes,
                           tuple(Partition(p, tuple(n.name for n in nodes if p in n.partitions)) for p in parts))


def _write(store: SqlStore, decisions: list[Decision]) -> int:
    cycle = store.decisions.begin_cycle(holder="bench")
    ids = store.decisions.record_decisions(cycle, [new_decision(d) for d in decisions])
    store.decisions.finish_cycle(cycle, decisions=len(ids), actions=sum(d.is_action for d in decisions))
    return len(ids)


def one_cycle(squeue_text: str, sinfo_text: str, cfg: Any, db: Path, seed: int) -> tuple[dict[str, float], str]:
    """CPU seconds per stage of one cycle, and what it handled."""
    times: dict[str, float] = {}
    clock = time.process_time
    t0 = clock()
    json.loads(squeue_text), json.loads(sinfo_text)
    times["json.loads"] = clock() - t0
    t0 = clock()
    snap = _snapshot(squeue_text, sinfo_text)
    times["parse"] = clock() - t0
    if _orjson is not None:  # the same parse on orjson's decoder (installed by hand: not a dependency)
        t0 = clock()
        with gc_paused():
            parse_squeue(_orjson.loads(squeue_text)), parse_nodes(_orjson.loads(sinfo_text))
        times["parse (orjson)"] = clock() - t0
    t0 = clock()
    result = build_units(snap, read_script=lambda _: None, is_known_key=lambda _job, _key: True, cache=SpecCache())
    times["units"] = clock() - t0
    rnd = random.Random(seed)
    util = {u.unit_id: JobUtilization(u.unit_id, rnd.uniform(0, 100), 100.0, 660.0, 12,
                                      NOW - timedelta(seconds=rnd.choice([5, 30, 400])), 8, 8)
            for u in result.units}
    t0 = clock()
    with gc_paused():  # as the controller's cycle calls it
        decisions = decide(PolicyInput(snap, result.units, util), cfg, NOW)
    times["policy"] = clock() - t0
    store = SqlStore.open(sqlite_url(db))
    try:
        t0 = clock()
        written = _write(store, decisions)
        times["DB write"] = clock() - t0
    finally:
        store.close()
    counts = (f"jobs={len(snap.jobs)} nodes={len(snap.nodes)} gpus={sum(n.gpus() for n in snap.nodes)} "
              f"units={len(result.units)} pending={sum(j.is_pending for j in snap.jobs)} "
              f"decisions={len(decisions)} actions={sum(d.is_action for d in decisions)} rows written={written}")
    return times, counts


def growth_table(sizes: list[int], gpus_per_node: int, repeat: int, seed: int) -> int:
    """One row per size (jobs; nodes = jobs / 5, as at the largest sites): median CPU s of each stage, and the
    cycle's growth against the size before it (1.00 x the jobs' growth = linear)."""
    cfg = site_config()
    print("| jobs / nodes / GPUs | json.loads | parse | units | policy | DB write | cycle CPU s | growth vs jobs |")
    print("|---|---|---|---|---|---|---|---|")
    prev: tuple[int, float] | None = None
    for n_jobs in sizes:
        n_nodes = max(10, n_jobs // 5)
        squeue_text, sinfo_text = build_documents(n_jobs, n_nodes, gpus_per_node, seed)
        stages: dict[str, list[float]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(max(1, min(repeat, 20))):
                times, _ = one_cycle(squeue_text, sinfo_text, cfg, Path(tmp) / f"bench-{rep}.db", rep)
                for key, value in times.items():
                    stages.setdefault(key, []).append(value)
        del squeue_text, sinfo_text
        med = {k: statistics.median(v) for k, v in stages.items()}
        total = med["parse"] + med["units"] + med["policy"] + med["DB write"]
        growth = "" if prev is None else f"{(total / prev[1]) / (n_jobs / prev[0]):.2f}"
        print(f"| {n_jobs:,} / {n_nodes:,} / {n_nodes * gpus_per_node:,} | {med['json.loads']:.2f} | "
              f"{med['parse']:.2f} | {med['units']:.2f} | {med['policy']:.2f} | {med['DB write']:.2f} | "
              f"**{total:.2f}** | {growth} |", flush=True)
        prev = (n_jobs, total)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=2_000)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sizes", default="", help="comma-separated job counts: the growth table (nodes = jobs / 5)")
    args = ap.parse_args()
    if args.sizes:
        return growth_table([int(x) for x in args.sizes.split(",") if x.strip()], args.gpus_per_node,
                            args.repeat, args.seed)
    squeue_text, sinfo_text = build_documents(args.jobs, args.nodes, args.gpus_per_node, args.seed)
    cfg = site_config()
    stages: dict[str, list[float]] = {}
    counts = ""
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(max(1, min(args.repeat, 20))):
            times, counts = one_cycle(squeue_text, sinfo_text, cfg, Path(tmp) / f"bench-{rep}.db", rep)
            for key, value in times.items():
                stages.setdefault(key, []).append(value)
    med = {k: statistics.median(v) for k, v in stages.items()}
    base = med["json.loads"]
    total = med["parse"] + med["units"] + med["policy"] + med["DB write"]
    print(counts)
    print(f"squeue --json {len(squeue_text) / 1e6:.1f} MB, sinfo --json {len(sinfo_text) / 1e6:.1f} MB; "
          f"median of {len(stages['parse'])} repetitions, process CPU time")
    print(f"{'stage':<12}{'CPU s':>8}{'x json.loads':>14}")
    for key in stages:
        print(f"{key:<12}{med[key]:>8.3f}{med[key] / base:>14.2f}")
    print(f"{'cycle':<12}{total:>8.3f}{total / base:>14.2f}   (parse + units + policy + DB write; target <= 1 s)")
    return 0 if total <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
