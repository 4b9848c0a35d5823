"""``decide`` on generated large-ish snapshots gives exactly the decisions recorded in a golden file.

The golden file (tests/fixtures/policy/golden.json) was written by the policy as it was before its indexes for
big clusters (victim and freeing lists that skip exhausted entries, holders per partition set): those are
meant to change speed only, and this test fails on any change of any decision (action, target, reason,
message, inputs, plans). The snapshots mix what the walk indexes: overlapping partitions, typed and untyped
GPUs, wide elastic units with surplus, extension jobs (running and pending), metric shrinks, shrink-to-admit
history, reserves with reclaim, fair share, quotas, tail protection and victim-by-service.

A deliberate behaviour change rewrites the file: ``SLURM_ELASTIC_WRITE_GOLDEN=1 .venv/bin/pytest
tests/unit/test_policy_golden.py`` (then review the summary diff).
"""

from __future__ import annotations

import enum
import gc
import hashlib
import json
import os
import random
from collections import Counter
from dataclasses import fields, is_dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic.directives.spec import ElasticSpec
from slurm_elastic.policy import (
    Action,
    Decision,
    ElasticUnit,
    ExtensionJob,
    JobUtilization,
    Outcome,
    PolicyInput,
    ResizeRecord,
    config_from_mapping,
    decide,
)
from slurm_elastic.policy.model import AdmitBasis
from slurm_elastic.slurm.model import ClusterSnapshot, GresCount, Job, Node, Partition

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "policy" / "golden.json"
NOW = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
PARTS = ("gpu", "gpu", "train", "serve", "a100")


def _job(job_id: int, rnd: random.Random, *, nodes: tuple[str, ...], partition: str, gpus: int,
         gtype: str | None, count: int) -> Job:
    running = bool(nodes)
    return Job(
        job_id=job_id, name=f"j{job_id}", user=f"u{job_id % 23}", account=f"acct{job_id % 5}",
        partition=partition, qos=("normal", "high", "low")[job_id % 3], priority=rnd.randint(1, 2_000),
        state="RUNNING" if running else "PENDING",
        state_reason=None if running else rnd.choice(["Resources", "Priority"] + ["Dependency"] * 3),
        nodes=nodes, batch_host=nodes[0] if nodes else None, node_count=len(nodes) if running else count,
        tres_per_node=f"gres:gpu:{gpus}", gres_per_node=(GresCount("gpu", gtype, gpus),),
        time_limit_min=rnd.choice([None, 240, 1440]), submit_time=NOW - timedelta(hours=5),
        start_time=NOW - timedelta(seconds=rnd.randint(60, 40_000)) if running else None, end_time=None,
        comment="", admin_comment="",
    )


def build(seed: int, n_jobs: int, n_nodes: int, run_share: float = 0.5) -> PolicyInput:
    """``run_share`` of the jobs run (a third of those are wide, most running ones elastic), the rest wait."""
    rnd = random.Random(seed)
    names = [f"n{i}" for i in range(1, n_nodes + 1)]
    part_of: dict[str, tuple[str, ...]] = {}
    for n in names:
        p = rnd.choice(PARTS)
        part_of[n] = ("train", "serve") if p == "serve" and rnd.random() < 0.5 else (p,)  # overlapping
    typed = {n: "a100" if "a100" in part_of[n] else None for n in names}
    used = dict.fromkeys(names, 0)
    idle = list(names)
    rnd.shuffle(idle)
    keep_idle = n_nodes // 4
    jobs: list[Job] = []
    units: list[ElasticUnit] = []
    utilization: dict[int, JobUtilization] = {}
    history: list[ResizeRecord] = []
    next_ext = 1_000_000
    for job_id in range(1, n_jobs + 1):
        gpus = rnd.choice([1, 2, 4, 4, 4])
        taken: tuple[str, ...] = ()
        if rnd.random() < run_share and len(idle) > keep_idle:
            width = rnd.choice([1, 1, 2, 3, 4])
            picked = []
            for _ in range(min(width, len(idle) - keep_idle)):
                n = idle.pop()
                used[n] = gpus
                picked.append(n)
            taken = tuple(sorted(picked, key=lambda s: int(s[1:])))
        if taken:
            part = part_of[taken[0]][0]
            j = _job(job_id, rnd, nodes=taken, partition=part, gpus=gpus, gtype=typed[taken[0]], count=len(taken))
            jobs.append(j)
            if rnd.random() < 0.8:
                exts: list[ExtensionJob] = []
                r = rnd.random()
                if r < 0.15 and len(idle) > keep_idle:
                    en = idle.pop()
                    used[en] = gpus
                    exts.append(ExtensionJob(next_ext, "RUNNING", (en,), 1, NOW - timedelta(seconds=4000),
                                             NOW - timedelta(seconds=3990), en))
                    next_ext += 1
                elif r < 0.2:
                    exts.append(ExtensionJob(next_ext, "PENDING", (), 1, NOW - timedelta(seconds=30)))
                    next_ext += 1
                min_nodes = rnd.choice([1, 1, 2])
                spec = ElasticSpec(min_nodes=min(min_nodes, len(taken)), max_nodes=len(taken) + rnd.randint(0, 3),
                                   explicit=frozenset({"min_nodes", "max_nodes"}))
                shrunk = rnd.choice([None, 0.0, rnd.uniform(0, 30_000)])
                units.append(ElasticUnit(j, spec, tuple(exts), requested_nodes=len(taken) + rnd.randint(0, 2),
                                         shrunk_s=shrunk, attained_gpu_s=rnd.choice([None, rnd.uniform(0, 1e6)])))
                if rnd.random() < 0.9:
                    utilization[job_id] = JobUtilization(
                        job_id, rnd.choice([rnd.uniform(0, 100), 5.0, 95.0]), 100.0,
                        rnd.choice([300.0, 900.0, 900.0]),
                        rnd.randint(3, 60), NOW - timedelta(seconds=rnd.choice([5, 30, 30, 900])), gpus, gpus)
                if rnd.random() < 0.15:
                    history.append(ResizeRecord(NOW - timedelta(seconds=rnd.randint(10, 9000)), job_id,
                                                Action.GROW, 1, 2, Outcome.APPLIED, "OVERUTILIZED"))
        else:
            part = rnd.choice(PARTS)
            jobs.append(_job(job_id, rnd, nodes=(), partition=part if rnd.random() < 0.9 else "gpu,train",
                             gpus=gpus, gtype="a100" if part == "a100" else None, count=rnd.choice([1, 1, 2, 3])))
    pending = [j for j in jobs if j.is_pending]
    for j in rnd.sample(pending, min(len(pending), 15)):  # shrink-to-admit history: some back off
        victim = rnd.choice(units).unit_id
        basis = None if rnd.random() < 0.3 else AdmitBasis(j.job_id, "x", frozenset())
        history.append(ResizeRecord(NOW - timedelta(seconds=rnd.randint(10, 900)), victim, Action.SHRINK, 2, 1,
                                    Outcome.APPLIED, "SHRINK_TO_ADMIT", j.job_id, basis))
    node_objs = tuple(
        Node(name=n, state="IDLE" if used[n] == 0 else "ALLOCATED",
             state_flags=("DRAIN",) if rnd.random() < 0.02 else (), partitions=part_of[n], cpus=64, alloc_cpus=0,
             gres=(GresCount("gpu", typed[n], 4),), gres_used=(GresCount("gpu", typed[n], used[n]),))
        for n in names
    )
    partitions = tuple(Partition(p, tuple(n for n in names if p in part_of[n])) for p in sorted(set(PARTS)))
    return PolicyInput(ClusterSnapshot(NOW, tuple(jobs), node_objs, partitions), tuple(units), utilization,
                       tuple(history), {f"acct{i}": 1.0 + i for i in range(5)})


SCENARIOS: dict[str, tuple[int, int, int, float, dict[str, Any]]] = {
    "admit": (1, 3000, 900, 0.5, {"shrink_to_admit": True}),
    "admit-service": (2, 3000, 900, 0.5, {"shrink_to_admit": True, "victim_by_service": True}),
    "reserve-fair-quota": (3, 2500, 700, 0.5, {
        "shrink_to_admit": True, "fair_share": True, "max_actions_per_cycle": 40,
        "partition": {"serve": {"free_node_reserve": 80, "reclaim_reserve": True},
                      "train": {"free_node_reserve": 3, "reclaim_reserve": True}},
        "qos": {"low": {"max_extension_nodes_per_qos": 10}}}),
    "tail": (4, 2500, 700, 0.5, {"shrink_to_admit": True, "tail_protection": True, "max_shrunk_share": 20,
                            "tail_min_shrunk_s": 600}),
    "defaults": (5, 2000, 800, 0.5, {}),
    "grow-fair": (6, 700, 1200, 0.95, {"fair_share": True, "shrink_to_admit": True}),
}


def _plain(value: Any) -> Any:
    """A JSON-able, order-independent form of a decision or any part of it."""
    if isinstance(value, enum.Enum):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    return value


def summarize(decisions: list[Decision]) -> dict[str, Any]:
    lines = [json.dumps(_plain(d), sort_keys=True) for d in decisions]
    counts = Counter(f"{d.action}:{d.reason}" for d in decisions)
    return {"decisions": len(decisions), "sha256": hashlib.sha256("\n".join(lines).encode()).hexdigest(),
            "counts": dict(sorted(counts.items())),
            "per_unit": {str(d.unit_id): hashlib.sha256(line.encode()).hexdigest()[:10]
                         for d, line in zip(decisions, lines, strict=True) if d.is_action}}


def run(name: str) -> dict[str, Any]:
    seed, n_jobs, n_nodes, run_share, conf = SCENARIOS[name]
    cfg = config_from_mapping({"version": 1, "max_actions_per_cycle": 100_000, **conf}, f"<golden {name}>")
    return summarize(decide(build(seed, n_jobs, n_nodes, run_share), cfg, NOW))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_decisions_match_the_golden_file(name: str) -> None:
    got = run(name)
    if os.environ.get("SLURM_ELASTIC_WRITE_GOLDEN") == "1":
        data = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        data[name] = got
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(dict(sorted(data.items())), indent=1, sort_keys=True) + "\n")
        pytest.skip("golden file written")
    want = json.loads(GOLDEN.read_text())[name]
    assert got["counts"] == want["counts"]
    assert got["per_unit"] == want["per_unit"], "actions differ (unit id -> digest)"
    assert got["sha256"] == want["sha256"], "a hold's reason, message or inputs differ"


def test_the_scenarios_exercise_the_walk() -> None:
    """The golden file is only worth something if the snapshots make the walk shrink to admit and grow."""
    data = json.loads(GOLDEN.read_text())
    admits = sum(v for s in data.values() for k, v in s["counts"].items() if k == "shrink:SHRINK_TO_ADMIT")
    grows = sum(v for s in data.values() for k, v in s["counts"].items() if k.startswith("grow:"))
    reclaims = sum(v for s in data.values() for k, v in s["counts"].items() if k == "shrink:RESERVE_RECLAIM")
    assert admits >= 20 and grows >= 20 and reclaims >= 1, data


def test_decide_leaves_no_cyclic_garbage() -> None:
    """The controller runs decide() with cyclic GC paused (controller/cycle.py): that is only free if everything
    decide() allocates is freed by reference counting alone."""
    inp = build(7, 1500, 500)
    cfg = config_from_mapping({"version": 1, "shrink_to_admit": True, "fair_share": True,
                               "partition": {"serve": {"free_node_reserve": 40, "reclaim_reserve": True}}}, "<gc>")
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        decisions = decide(inp, cfg, NOW)
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()
    assert any(d.is_action for d in decisions)
