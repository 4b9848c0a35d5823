"""CPU cost of one controller cycle at scale: read Slurm's JSON, build the units, decide, write to the store;
the first cycle (a fresh state DB) and a steady one (the same replies again: nothing changed).

A synthetic cluster (default: 51,000 jobs on 10,000 nodes x 8 GPUs = 80,000 GPUs, then 100,000 jobs on 20,000
nodes), printed the way Slurm 22.05's ``squeue --json`` and ``sinfo --json`` print it (openapi/v0.0.38; the
records are the ones in tests/fixtures/slurm/22.05 with their fields varied). 60% of the jobs run; 60% of those
carry an elastic spec in their admin_comment (as plugins/job_submit.lua stores it), a tenth of those with an
extension job; the rest are pending. Per cycle, timed as process CPU time:

1. ``json.loads`` of both documents alone: the baseline every ratio is against (same bytes, same run);
2. parse: ``read_squeue`` + ``read_nodes`` (slurm/decode.py: typed decoding straight into Job/Node records,
   as ``SlurmCli.snapshot`` reads) into a ClusterSnapshot; ``parse (walk)``: the parser before it
   (``json.loads`` + the dict walk of slurm/openapi.py), measured on the first cycle for comparison;
3. units: ``controller.units.build_units`` (elastic units from the admin_comment specs);
4. policy: ``policy.decide`` (every rule behind a switch on), given agent utilization built beforehand;
5. DB write: what the cycle writes, on one SQLite file kept across the cycles: ``begin_cycle``, the units'
   rows (``jobs.observe_jobs``: by change), the decisions through the controller's ``HoldFilter`` (every grow
   and shrink, a hold when it changed: ``record_decisions``, one multi-row INSERT), ``finish_cycle``.

The steady cycle reads the same replies 30 s later: the policy decides the same (the bench does not act, so
its capped grows and shrinks come again and are written again, as actions always are); no hold and no unit
row changed, so none is written.

Targets: first cycle <= 1 s, steady <= 0.5 s at 51k jobs, 100k jobs <= 2 s, parse <= 1x json.loads.

    .venv/bin/python bench/controller_cycle.py                       # 51k/10k and 100k/20k, first + steady
    .venv/bin/python bench/controller_cycle.py --sizes 10000:2000 --repeat 3 --json out.json
    .venv/bin/python bench/controller_cycle.py --sizes 1000,10000,25000,51000,100000   # growth (nodes = jobs / 5)
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
from slurm_elastic.controller.hold_filter import HoldFilter  # noqa: E402
from slurm_elastic.controller.observe import job_observation  # noqa: E402
from slurm_elastic.controller.units import SpecCache, UnitsResult, build_units  # noqa: E402
from slurm_elastic.policy import Decision, JobUtilization, PolicyInput, config_from_mapping, decide  # noqa: E402
from slurm_elastic.slurm.decode import JobMemo, read_nodes, read_squeue  # noqa: E402
from slurm_elastic.slurm.hostlist import compress  # noqa: E402
from slurm_elastic.slurm.model import ClusterSnapshot, Partition  # noqa: E402
from slurm_elastic.slurm.openapi import gc_paused, walk_nodes, walk_squeue  # noqa: E402
from slurm_elastic.store import NewDecision, SqlStore  # noqa: E402
from slurm_elastic.store.sqlstore import sqlite_url  # noqa: E402

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


def _snapshot(squeue_text: str, sinfo_text: str, now: datetime = NOW, memo: JobMemo | None = None
              ) -> ClusterSnapshot:
    with gc_paused():  # as SlurmCli.snapshot() reads (with its memo of the last reply's jobs)
        _, jobs = read_squeue(squeue_text, memo)
        _, nodes = read_nodes(sinfo_text)
    parts = sorted({p for n in nodes for p in n.partitions})
    return ClusterSnapshot(now, jobs, nodes,
                           tuple(Partition(p, tuple(n.name for n in nodes if p in n.partitions)) for p in parts))


def _walk(squeue_text: str, sinfo_text: str) -> None:
    """The parse before slurm/decode.py: json.loads and the dict walk."""
    with gc_paused():
        walk_squeue(json.loads(squeue_text)), walk_nodes(json.loads(sinfo_text))


def _utilization(built: UnitsResult, now: datetime) -> dict[int, JobUtilization]:
    """Each unit's measured utilization: the same every cycle (a steady cluster), sampled 5-400 s ago."""
    out = {}
    for u in built.units:
        rnd = random.Random(u.unit_id)
        out[u.unit_id] = JobUtilization(u.unit_id, rnd.uniform(0, 100), 100.0, 660.0, 12,
                                        now - timedelta(seconds=rnd.choice([5, 30, 400])), 8, 8)
    return out


class Cycles:
    """Consecutive cycles of one controller on one state DB (the first on a fresh one)."""

    def __init__(self, db: Path, cfg: Any) -> None:
        self.store = SqlStore.open(sqlite_url(db))
        self.holds = HoldFilter(heartbeat_s=600.0)  # the controller's default hold_heartbeat_s
        self.specs = SpecCache()
        self.jobs_seen = JobMemo()  # as SlurmCli keeps it
        self.cfg = cfg

    def close(self) -> None:
        self.store.close()

    def write(self, built: UnitsResult, decisions: list[Decision], now: datetime) -> dict[str, int]:
        """What Controller.run_cycle writes: the cycle, the units' rows, the decisions through the hold filter."""
        cycle = self.store.decisions.begin_cycle(holder="bench")
        units = self.store.jobs.observe_jobs([job_observation(u, built.sources.get(u.unit_id))
                                              for u in built.units])
        recorded = self.holds.record(self.store, cycle, [new_decision(d) for d in decisions], now)
        self.store.decisions.finish_cycle(cycle, decisions=len(decisions),
                                          actions=sum(d.is_action for d in decisions))
        return {"unit rows": units, "decision rows": recorded.written,
                "holds not written": recorded.skipped}

    def cycle(self, squeue_text: str, sinfo_text: str, now: datetime, *, walk: bool) -> dict[str, Any]:
        """CPU seconds per stage of one cycle, and what it handled and wrote."""
        times: dict[str, float] = {}
        clock = time.process_time
        t0 = clock()
        json.loads(squeue_text), json.loads(sinfo_text)
        times["json.loads"] = clock() - t0
        t0 = clock()
        snap = _snapshot(squeue_text, sinfo_text, now, self.jobs_seen)
        times["parse"] = clock() - t0
        if walk:
            t0 = clock()
            _walk(squeue_text, sinfo_text)
            times["parse (walk)"] = clock() - t0
        t0 = clock()
        with gc_paused():  # as the controller's cycle builds them
            built = build_units(snap, read_script=lambda _: None, is_known_key=lambda _job, _key: True,
                                cache=self.specs)
        times["units"] = clock() - t0
        util = _utilization(built, now)
        t0 = clock()
        with gc_paused():  # as the controller's cycle calls it
            decisions = decide(PolicyInput(snap, built.units, util), self.cfg, now)
        times["policy"] = clock() - t0
        t0 = clock()
        with gc_paused():  # as the controller's cycle writes
            written = self.write(built, decisions, now)
        times["DB write"] = clock() - t0
        counts = {"jobs": len(snap.jobs), "nodes": len(snap.nodes), "gpus": sum(n.gpus() for n in snap.nodes),
                  "units": len(built.units), "pending": sum(j.is_pending for j in snap.jobs),
                  "decisions": len(decisions), "actions": sum(d.is_action for d in decisions), **written}
        return {"cpu_s": times, "counts": counts}


STAGES = ("parse", "units", "policy", "DB write")


def measure(n_jobs: int, n_nodes: int, gpus_per_node: int, repeat: int, seed: int) -> dict[str, Any]:
    """The first and the steady cycle at one size: median CPU s per stage over ``repeat`` runs, each on a fresh
    DB, and the ratios to json.loads of the same replies in the same run."""
    squeue_text, sinfo_text = build_documents(n_jobs, n_nodes, gpus_per_node, seed)
    cfg = site_config()
    runs: dict[str, list[dict[str, Any]]] = {"first": [], "steady": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(max(1, min(repeat, 20))):
            cycles = Cycles(Path(tmp) / f"bench-{rep}.db", cfg)
            try:
                runs["first"].append(cycles.cycle(squeue_text, sinfo_text, NOW, walk=rep == 0))
                runs["steady"].append(cycles.cycle(squeue_text, sinfo_text, NOW + timedelta(seconds=30),
                                                   walk=False))
            finally:
                cycles.close()
    out: dict[str, Any] = {"jobs": n_jobs, "nodes": n_nodes, "gpus": n_nodes * gpus_per_node,
                           "squeue_mb": round(len(squeue_text) / 1e6, 1), "sinfo_mb": round(len(sinfo_text) / 1e6, 1),
                           "repetitions": len(runs["first"])}
    for kind, results in runs.items():
        med = {k: statistics.median(r["cpu_s"][k] for r in results if k in r["cpu_s"])
               for k in results[0]["cpu_s"]}
        med["cycle"] = sum(med[k] for k in STAGES)
        med["cycle without policy"] = med["cycle"] - med["policy"]
        base = med["json.loads"]
        out[kind] = {"cpu_s": {k: round(v, 3) for k, v in med.items()},
                     "x_json_loads": {k: round(v / base, 2) for k, v in med.items()},
                     "counts": results[-1]["counts"]}
    return out


TARGETS = {("first", 51_000): 1.0, ("steady", 51_000): 0.5, ("first", 100_000): 2.0}


def print_size(r: dict[str, Any]) -> None:
    print(f"\n{r['jobs']:,} jobs / {r['nodes']:,} nodes / {r['gpus']:,} GPUs: squeue --json {r['squeue_mb']} MB, "
          f"sinfo --json {r['sinfo_mb']} MB; median of {r['repetitions']}, process CPU s (x json.loads)")
    keys = list(r["first"]["cpu_s"])
    print("| stage | first cycle | steady cycle |")
    print("|---|---|---|")
    for k in keys:
        cells = [f"{r[c]['cpu_s'][k]:.3f} ({r[c]['x_json_loads'][k]:.2f}x)" if k in r[c]["cpu_s"] else "-"
                 for c in ("first", "steady")]
        print(f"| {k} | {cells[0]} | {cells[1]} |")
    for c in ("first", "steady"):
        n = r[c]["counts"]
        print(f"{c}: units={n['units']} decisions={n['decisions']} actions={n['actions']} written: "
              f"{n['unit rows']} unit rows, {n['decision rows']} decision rows ({n['holds not written']} unchanged "
              f"holds not written)")


def growth_table(sizes: list[tuple[int, int]], gpus_per_node: int, repeat: int, seed: int) -> list[dict[str, Any]]:
    """One row per size: the first cycle's median CPU s per stage, and its growth against the size before
    (1.00 x the jobs' growth = linear)."""
    print("| jobs / nodes / GPUs | json.loads | parse | units | policy | DB write | first cycle | growth | steady |")
    print("|---|---|---|---|---|---|---|---|---|")
    prev: tuple[int, float] | None = None
    results = []
    for n_jobs, n_nodes in sizes:
        r = measure(n_jobs, n_nodes, gpus_per_node, repeat, seed)
        results.append(r)
        f = r["first"]["cpu_s"]
        growth = "" if prev is None else f"{(f['cycle'] / prev[1]) / (n_jobs / prev[0]):.2f}"
        print(f"| {n_jobs:,} / {n_nodes:,} / {r['gpus']:,} | {f['json.loads']:.2f} | {f['parse']:.2f} | "
              f"{f['units']:.2f} | {f['policy']:.2f} | {f['DB write']:.2f} | **{f['cycle']:.2f}** | {growth} | "
              f"{r['steady']['cpu_s']['cycle']:.2f} |", flush=True)
        prev = (n_jobs, f["cycle"])
    return results


def _sizes(text: str) -> list[tuple[int, int]]:
    """``51000:10000,100000`` -> [(51000, 10000), (100000, 20000)] (nodes default to jobs / 5)."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        jobs, _, nodes = part.partition(":")
        out.append((int(jobs), int(nodes) if nodes else max(10, int(jobs) // 5)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="51000:10000,100000:20000",
                    help="JOBS[:NODES],...  (nodes default to jobs / 5)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--growth", action="store_true", help="one table row per size (the first cycle's stages)")
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()
    sizes = _sizes(args.sizes)
    if args.growth:
        results = growth_table(sizes, args.gpus_per_node, args.repeat, args.seed)
    else:
        results = []
        for n_jobs, n_nodes in sizes:
            results.append(measure(n_jobs, n_nodes, args.gpus_per_node, args.repeat, args.seed))
            print_size(results[-1])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    missed = []
    for r in results:
        for (kind, jobs), target in TARGETS.items():
            if r["jobs"] == jobs and r[kind]["cpu_s"]["cycle"] > target:
                missed.append(f"{kind} cycle at {jobs:,} jobs: {r[kind]['cpu_s']['cycle']:.2f} s > {target} s")
    print("\ntargets: " + ("all met" if not missed else "; ".join(missed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
