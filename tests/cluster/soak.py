"""The soak (docs/reliability.md, row S1) on the cluster whose nodes have their own network namespaces
(docker-slurm/netns-cluster.sh): run by tests/cluster/test_network_faults.py, long form through
``bench/reliability.py --soak HOURS``."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.slurm.hostlist import expand
from slurm_elastic.store.records import ActionKind, ActionState
from tests.cluster.controller_harness import running_controller, set_util, wait_until
from tests.cluster.harness import TestCluster
from tests.cluster.netns_harness import (
    ACTIVE,
    AGENT_PORT,
    OPEN,
    NetnsAgents,
    controller,
    elastic_job,
    netns,
    spawn_agent,
)

SOAK_S = float(os.environ.get("SLURM_ELASTIC_SOAK_S", "120"))
SOAK_SEED = int(os.environ.get("SLURM_ELASTIC_FAULT_SEED", "20261201"))


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _sacct_extensions(cluster: TestCluster, leaders: list[int]) -> dict[int, str]:
    names = ",".join(f"elastic-ext-{j}" for j in leaders)
    cp = cluster.run(["sacct", "-a", "-X", "-n", "-P", "-S", "now-1days", f"--name={names}", "-o", "JobID,State"],
                     check=True)
    return {int(line.split("|")[0]): line.split("|")[1] for line in cp.stdout.splitlines() if line.strip()}


def run_soak(net: NetnsAgents, net_cluster: TestCluster, tmp_path: Path) -> None:
    """Elastic jobs flip between busy and idle while, at seeded random moments, the controller is SIGKILLed and
    restarted, an agent is restarted, a node's link is cut for a few seconds (under SlurmdTimeout) or its agent port
    blocked; then the journal is checked against squeue and sacct."""
    import random
    from collections import Counter

    cluster, rng = net_cluster, random.Random(SOAK_SEED)
    cfg, prefix = controller(net, tmp_path)
    text = cfg.read_text().replace('holder = ""', 'holder = "soak"')  # restarted under one name, as systemd does
    cfg.write_text(text)
    leaders: dict[int, Path] = {}
    for k, user in enumerate(["alice", "bob", "alice"]):
        job, util_file = elastic_job(cluster, 90 if k % 2 == 0 else 10, "-N1", "--time=UNLIMITED", user=user)
        leaders[job] = util_file
    db = tmp_path / "state.db"
    events: Counter[str] = Counter()
    rss: list[tuple[float, float, int]] = []  # (soak time, age of the controller, KiB)
    db_size: list[tuple[float, int]] = []
    t0 = time.monotonic()
    next_flip, phase = t0 + 15, 0
    cut: tuple[str, float] | None = None
    while time.monotonic() - t0 < SOAK_S:
        with running_controller(cluster, cfg, prefix=prefix) as ctl:
            born = time.monotonic()
            end = born + rng.uniform(20, 90)
            while time.monotonic() < min(end, t0 + SOAK_S):
                now = time.monotonic()
                if now >= next_flip:
                    phase += 1
                    for k, util_file in enumerate(leaders.values()):
                        set_util(util_file, 90 if (k + phase) % 2 == 0 else 10)
                    events["flip"] += 1
                    next_flip = now + rng.uniform(12, 25)
                if cut is not None and now >= cut[1]:
                    netns("heal")
                    cut = None
                if cut is None and rng.random() < 0.02:  # ~ every 25 s at 0.5 s steps
                    node, kind = rng.choice(cluster.nodes), rng.choice(["link", "block", "agent"])
                    if kind == "agent":
                        net.procs[node].send_signal(signal.SIGKILL)
                        net.procs[node].wait()
                        net.procs[node] = spawn_agent(cluster, node, net.key_file)
                    else:
                        netns(*(["link", node, "down"] if kind == "link" else ["block", node, str(AGENT_PORT)]))
                        cut = (node, now + rng.uniform(2, 6))
                    events[kind] += 1
                kib = _rss_kib(ctl.proc.pid)
                if kib is not None:
                    rss.append((now - t0, now - born, kib))
                files = [f for f in (db, db.with_name(db.name + "-wal")) if f.exists()]  # WAL: rows land there first
                if files:
                    db_size.append((now - t0, sum(f.stat().st_size for f in files)))
                assert ctl.proc.poll() is None, ctl.log_text()[-3000:]
                time.sleep(0.5)
            ctl.proc.send_signal(signal.SIGKILL)
            ctl.proc.wait(timeout=30)
            events["kill"] += 1
    netns("heal")
    for util_file in leaders.values():
        set_util(util_file, 60)
    with running_controller(cluster, cfg, prefix=prefix) as ctl:
        wait_until("every intent to have an outcome", lambda: all(a.state not in OPEN for a in ctl.actions()),
                   120, ctl)
        wait_until("no pending extension", lambda: not any(
            parse_tag(str(j.get("comment") or "")) and j.get("job_state") in ACTIVE - {"RUNNING"}
            for j in _jobs(cluster)), 90, ctl)
        ctl.wait_settled()  # quiet cycles: the store holds the sizes Slurm has
        actions = ctl.actions()
        st = ctl.store()
        try:
            db_jobs = {j: st.jobs.get_job(j) for j in leaders}
            ext_records = {e.job_id: e for e in st.jobs.extensions(active_only=False)}
        finally:
            st.close()
        jobs = _jobs(cluster)
        tracebacks = ctl.log_text().count("Traceback")
    in_sacct = _sacct_extensions(cluster, list(leaders))
    cluster.cancel(*leaders)
    keys = {a.idempotency_key: a for a in actions if a.kind == ActionKind.GROW}
    tagged = [(j, parse_tag(str(j.get("comment") or ""))) for j in jobs if j.get("job_state") in ACTIVE]
    live_ext = [(j, t) for j, t in tagged if t is not None]
    duplicates = [k for k, n in Counter(t.key for _, t in live_ext).items() if n > 1]
    running = {int(str(j["job_id"])) for j, t in tagged if t is None and j.get("job_state") == "RUNNING"}
    orphans = [int(str(j["job_id"])) for j, t in live_ext
               if t.parent not in running or t.key not in keys or keys[t.key].state != ActionState.APPLIED]
    open_intents = [a.id for a in actions if a.state in OPEN]
    # Lost decisions: an extension Slurm ran that the journal does not know, or one the journal has that sacct lacks.
    untracked = sorted(set(in_sacct) - set(ext_records))
    unaccounted = sorted(set(ext_records) - set(in_sacct))
    mismatched = []
    for leader in leaders:
        mine = {leader} | {int(str(j["job_id"])) for j, t in live_ext if t.parent == leader}
        size = sum(len(expand(str(j.get("nodes") or ""))) for j in jobs
                   if j.get("job_state") == "RUNNING" and int(str(j["job_id"])) in mine)
        rec = db_jobs[leader]
        if rec is None or rec.current_nodes != size:
            mismatched.append((leader, rec.current_nodes if rec else None, size))
    applied = Counter(a.kind for a in actions if a.state == ActionState.APPLIED)
    resizes = applied[ActionKind.GROW] + applied[ActionKind.SHRINK]
    # Flat: the controller's RSS at the same age (>= 15 s) in the last third of the soak vs the first third; the
    # DB's growth per hour in the last third vs the first.
    third = SOAK_S / 3
    early = sorted(k for t, age, k in rss if t < third and age >= 15)
    late = sorted(k for t, age, k in rss if t >= 2 * third and age >= 15)
    rss_ratio = (late[len(late) // 2] / early[len(early) // 2]) if early and late else float("nan")
    growth = {}
    for name, lo, hi in (("first", 0.0, third), ("last", 2 * third, SOAK_S + 1)):
        pts = [(t, b) for t, b in db_size if lo <= t < hi]
        growth[name] = (pts[-1][1] - pts[0][1]) / max(pts[-1][0] - pts[0][0], 1) * 3600 if len(pts) > 1 else 0.0
    print(f"\nS1 soak {SOAK_S / 60:.0f} min, seed {SOAK_SEED}: events {dict(events)}; "
          f"{len(actions)} journaled actions, {resizes} resizes applied (grow {applied[ActionKind.GROW]}, "
          f"shrink {applied[ActionKind.SHRINK]}), "
          f"{len(ext_records)} extensions journaled, {len(in_sacct)} in sacct; orphans {len(orphans)}, duplicates "
          f"{len(duplicates)}, open intents {len(open_intents)}, untracked {untracked}, unaccounted {unaccounted}, "
          f"size mismatches {mismatched}; controller RSS median early {early[len(early) // 2] if early else 0} KiB, "
          f"late {late[len(late) // 2] if late else 0} KiB (x{rss_ratio:.2f}); DB {db_size[-1][1] if db_size else 0} "
          f"bytes, growth {growth['first'] / 1e6:.2f} MB/h first third, {growth['last'] / 1e6:.2f} MB/h last third; "
          f"tracebacks {tracebacks}")
    assert (orphans, duplicates, open_intents, untracked, unaccounted, mismatched) == ([], [], [], [], [], [])
    assert resizes >= 2 and events["kill"] >= 2
    assert tracebacks == 0
    assert not rss_ratio > 1.25, f"controller RSS grew x{rss_ratio:.2f} between the first and last third"


def _jobs(cluster: TestCluster) -> list[dict[str, object]]:
    jobs = cluster.squeue_json()["jobs"]
    assert isinstance(jobs, list)
    return jobs
