"""The soak (docs/reliability.md, row S1) on the cluster whose nodes have their own network namespaces
(docker-slurm/netns-cluster.sh): run by tests/cluster/test_network_faults.py, long form through
``bench/reliability.py --soak HOURS``.

Set for resizes per minute (the crash-safety soak needs >= 1,000 in one run). What limits the rate, measured: a job
reacts to a flip once the mean of its window (window_s 10 s + two 2 s cycles of slack, of the agents' 4 s means)
crosses a threshold; with the cluster tests' 40..80 band and 10%/90% loads a grow needed 7/8 of the window busy (~14
s), longer than many flips lasted; and a grow needs a free node: with one leader per node only one node was free. So
here the band is 45..55 (half the window decides either way), the cooldown 2 s, flips every 11-17 s, and the four
leaders (1 GPU each, 1..3 nodes) share x1, which leaves x2..x4 free for extensions: two pairs flip opposite ways, so
one pair's shrinks free the nodes the other pair's grows take (up to 6 resizes a flip). Every fault kind of the
earlier soak is kept at its cadence. Measured on the loaded 2-core VM, 5 min each: 1..2 nodes 14.8 resizes/min, 1..3
nodes 21.8 (the earlier soak: 6.8).

``SLURM_ELASTIC_SOAK_S`` is the fault phase's length (at most, with ``SLURM_ELASTIC_SOAK_RESIZES``: the phase ends
once that many resizes are applied, and the soak fails if it never got there); ``SLURM_ELASTIC_SOAK_JOBS`` /
``SLURM_ELASTIC_SOAK_MAX_NODES`` change the jobs' number and maximum size.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.slurm.hostlist import expand
from slurm_elastic.store.records import ActionKind, ActionRecord, ActionState, ExtensionRecord
from tests.cluster.controller_harness import ControllerProcess, running_controller, set_util, wait_until
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
from tests.soak_audit import count_by_rpc, slurm_writes, unjournaled

SOAK_S = float(os.environ.get("SLURM_ELASTIC_SOAK_S", "120"))
SOAK_SEED = int(os.environ.get("SLURM_ELASTIC_FAULT_SEED", "20261201"))
JOBS = int(os.environ.get("SLURM_ELASTIC_SOAK_JOBS", "4"))
MAX_NODES = int(os.environ.get("SLURM_ELASTIC_SOAK_MAX_NODES", "3"))
RESIZES = int(os.environ.get("SLURM_ELASTIC_SOAK_RESIZES", "0"))  # > 0: stop the faults once this many applied
FLIP_S = (11.0, 17.0)  # a flip every 11-17 s (seeded)
BUSY, IDLE, CALM = 90, 10, 50
DIRECTIVES = (f"#ELASTIC --min-nodes 1 --max-nodes {MAX_NODES} --window 10s --cooldown 2s --grace 1s --signal USR2 "
              "--scale-up-above 55 --scale-down-below 45")
LEADER_NODE = "x1"


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _lost_steps(cluster: TestCluster, leaders: list[int]) -> list[str]:
    """The leaders' workload steps (``<leader>.0``, the srun of the batch script) that are not running: a leader
    that lost its workload while the soak ran (its batch script then sleeps, so the job itself stays RUNNING)."""
    cp = cluster.run(["sacct", "-n", "-P", "-j", ",".join(map(str, leaders)), "-o", "JobID,State"], check=True)
    steps = dict(line.split("|")[:2] for line in cp.stdout.splitlines() if line.strip())
    return [f"{j}.0 {steps.get(f'{j}.0', 'missing')}" for j in leaders if steps.get(f"{j}.0") != "RUNNING"]


def _sacct_extensions(cluster: TestCluster, leaders: list[int]) -> dict[int, tuple[int, str]]:
    """Every extension job of ``leaders`` Slurm's accounting holds: job id -> (its leader, its state)."""
    names = ",".join(f"elastic-ext-{j}" for j in leaders)
    cp = cluster.run(["sacct", "-a", "-X", "-n", "-P", "-S", "now-1days", f"--name={names}", "-o",
                      "JobID,JobName,State"], check=True)
    out = {}
    for line in cp.stdout.splitlines():
        if line.strip():
            job, name, state = line.split("|")[:3]
            out[int(job)] = (int(name.removeprefix("elastic-ext-")), state)
    return out


@dataclass
class Faults:
    """The fault phase's record: what was injected, the controller's RSS and the DB's size over time."""

    events: Counter[str] = field(default_factory=Counter)
    rss: list[tuple[float, float, int]] = field(default_factory=list)  # (soak time, controller age, KiB)
    db_size: list[tuple[float, int]] = field(default_factory=list)
    wall_s: float = 0.0
    reached: bool = False  # SLURM_ELASTIC_SOAK_RESIZES applied


def _applied(ctl: ControllerProcess, since: datetime) -> int:
    st = ctl.store()
    try:
        counts = st.journal.action_counts(since)
    finally:
        st.close()
    return sum(counts.get((k, ActionState.APPLIED), 0) for k in (ActionKind.GROW, ActionKind.SHRINK))


def _inject(net: NetnsAgents, cluster: TestCluster, cfg: Path, prefix: list[str], leaders: dict[int, Path],
            db: Path) -> Faults:
    """SOAK_S of flips, controller kills, agent restarts, link cuts and blocked agent ports (seeded)."""
    rng, f = random.Random(SOAK_SEED), Faults()
    t0, since = time.monotonic(), datetime.now(UTC)
    next_flip, phase, next_count = t0 + 15, 0, t0 + 20
    cut: tuple[str, float] | None = None
    while time.monotonic() - t0 < SOAK_S and not f.reached:
        with running_controller(cluster, cfg, prefix=prefix) as ctl:
            born = time.monotonic()
            end = born + rng.uniform(20, 90)
            while time.monotonic() < min(end, t0 + SOAK_S) and not f.reached:
                now = time.monotonic()
                if RESIZES and now >= next_count:  # the journal's count, every 20 s
                    f.reached = _applied(ctl, since) >= RESIZES
                    next_count = now + 20
                if now >= next_flip:  # the two halves of the jobs flip opposite ways
                    phase += 1
                    for k, util_file in enumerate(leaders.values()):
                        set_util(util_file, BUSY if (k + phase) % 2 == 0 else IDLE)
                    f.events["flip"] += 1
                    next_flip = now + rng.uniform(*FLIP_S)
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
                    f.events[kind] += 1
                kib = _rss_kib(ctl.proc.pid)
                if kib is not None:
                    f.rss.append((now - t0, now - born, kib))
                files = [p for p in (db, db.with_name(db.name + "-wal")) if p.exists()]  # WAL: rows land there first
                if files:
                    f.db_size.append((now - t0, sum(p.stat().st_size for p in files)))
                assert ctl.proc.poll() is None, ctl.log_text()[-3000:]
                time.sleep(0.5)
            ctl.proc.send_signal(signal.SIGKILL)
            ctl.proc.wait(timeout=30)
            f.events["kill"] += 1
    f.wall_s = time.monotonic() - t0
    return f


@dataclass
class Final:
    """What the calm controller run at the end leaves: the journal, the store's view and Slurm's."""

    actions: list[ActionRecord]
    db_sizes: dict[int, int | None]
    ext_records: dict[int, ExtensionRecord]
    jobs: list[dict[str, object]]
    tracebacks: int


def _settle(cluster: TestCluster, cfg: Path, prefix: list[str], leaders: dict[int, Path]) -> Final:
    netns("heal")
    for util_file in leaders.values():
        set_util(util_file, CALM)
    with running_controller(cluster, cfg, prefix=prefix) as ctl:
        wait_until("every intent to have an outcome", lambda: all(a.state not in OPEN for a in ctl.actions()),
                   120, ctl)
        wait_until("no pending extension", lambda: not any(
            parse_tag(str(j.get("comment") or "")) and j.get("job_state") in ACTIVE - {"RUNNING"}
            for j in _jobs(cluster)), 90, ctl)
        ctl.wait_settled()  # quiet cycles: the store holds the sizes Slurm has
        return _final(ctl, cluster, leaders)


def _final(ctl: ControllerProcess, cluster: TestCluster, leaders: dict[int, Path]) -> Final:
    actions = ctl.actions()
    st = ctl.store()
    try:
        sizes = {j: (rec.current_nodes if (rec := st.jobs.get_job(j)) is not None else None) for j in leaders}
        ext_records = {e.job_id: e for e in st.jobs.extensions(active_only=False)}
    finally:
        st.close()
    return Final(actions, sizes, ext_records, _jobs(cluster), ctl.log_text().count("Traceback"))


def run_soak(net: NetnsAgents, net_cluster: TestCluster, tmp_path: Path) -> None:
    """Elastic jobs flip between busy and idle while, at seeded random moments, the controller is SIGKILLed and
    restarted, an agent is restarted, a node's link is cut for a few seconds (under SlurmdTimeout) or its agent port
    blocked; then the journal is checked against squeue, sacct and every job write slurmctld logged."""
    cluster = net_cluster
    cfg, prefix = controller(net, tmp_path)
    text = cfg.read_text().replace('holder = ""', 'holder = "soak"')  # restarted under one name, as systemd does
    cfg.write_text(text)
    leaders: dict[int, Path] = {}
    for k in range(JOBS):
        job, util_file = elastic_job(cluster, BUSY if k % 2 == 0 else IDLE, "-N1", f"--nodelist={LEADER_NODE}",
                                     "--time=UNLIMITED", directives=DIRECTIVES, user=("alice", "bob")[k % 2])
        leaders[job] = util_file
    ctld_log = cluster.root / "log" / "slurmctld.log"
    log_from, since = ctld_log.stat().st_size, datetime.now(UTC)
    slurmd_from = {n: _size(cluster.root / "log" / f"slurmd-{n}.log") for n in cluster.nodes}
    faults = _inject(net, cluster, cfg, prefix, leaders, tmp_path / "state.db")
    fin = _settle(cluster, cfg, prefix, leaders)
    in_sacct = _sacct_extensions(cluster, list(leaders))
    lost_steps = _lost_steps(cluster, list(leaders))
    until = datetime.now(UTC)
    with open(ctld_log, errors="replace") as log:
        log.seek(log_from)
        writes = slurm_writes(log, since, until)
    cluster.cancel(*leaders)
    _keep(tmp_path, ctld_log, log_from, fin)
    for node, start in slurmd_from.items():  # the nodes' logs too: what killed a step shows there
        _copy_tail(cluster.root / "log" / f"slurmd-{node}.log", start, tmp_path / f"slurmd-{node}-soak.log")
    # Slurm writes with no journal entry: every job write slurmctld logged in the soak against the journal.
    lost = unjournaled(writes, fin.actions, leaders, {j: p for j, (p, _) in in_sacct.items()},
                       {j: e.idempotency_key for j, e in fin.ext_records.items() if e.idempotency_key})
    actions, jobs = fin.actions, fin.jobs
    keys = {a.idempotency_key: a for a in actions if a.kind == ActionKind.GROW}
    tagged = [(j, parse_tag(str(j.get("comment") or ""))) for j in jobs if j.get("job_state") in ACTIVE]
    live_ext = [(j, t) for j, t in tagged if t is not None]
    duplicates = [k for k, n in Counter(t.key for _, t in live_ext).items() if n > 1]
    running = {int(str(j["job_id"])) for j, t in tagged if t is None and j.get("job_state") == "RUNNING"}
    orphans = [int(str(j["job_id"])) for j, t in live_ext
               if t.parent not in running or t.key not in keys or keys[t.key].state != ActionState.APPLIED]
    open_intents = [a.id for a in actions if a.state in OPEN]
    # Lost decisions: an extension Slurm ran that the journal does not know, or one the journal has that sacct lacks.
    untracked = sorted(set(in_sacct) - set(fin.ext_records))
    unaccounted = sorted(set(fin.ext_records) - set(in_sacct))
    mismatched = []
    for leader in leaders:
        mine = {leader} | {int(str(j["job_id"])) for j, t in live_ext if t.parent == leader}
        size = sum(len(expand(str(j.get("nodes") or ""))) for j in jobs
                   if j.get("job_state") == "RUNNING" and int(str(j["job_id"])) in mine)
        if fin.db_sizes[leader] != size:
            mismatched.append((leader, fin.db_sizes[leader], size))
    applied = Counter(a.kind for a in actions if a.state == ActionState.APPLIED)
    resizes = applied[ActionKind.GROW] + applied[ActionKind.SHRINK]
    rss_ratio, rss_text, db_text = _flat(faults)
    print(f"\nS1 soak {faults.wall_s / 60:.1f} min (cap {SOAK_S / 60:.0f} min, target {RESIZES or 'none'}), seed "
          f"{SOAK_SEED}, {JOBS} jobs of 1..{MAX_NODES} nodes: events "
          f"{dict(faults.events)}; {len(actions)} journaled actions {dict(Counter(str(a.state) for a in actions))}, "
          f"{resizes} resizes applied (grow {applied[ActionKind.GROW]}, shrink {applied[ActionKind.SHRINK]}), "
          f"{resizes / (faults.wall_s / 60):.1f} resizes/min; {len(fin.ext_records)} extensions journaled, "
          f"{len(in_sacct)} in sacct; slurmctld logged {len(writes)} job writes {count_by_rpc(writes)}: "
          f"{len(lost)} with no journal entry; orphans {len(orphans)}, duplicates {len(duplicates)}, open intents "
          f"{len(open_intents)}, untracked {untracked}, unaccounted {unaccounted}, size mismatches {mismatched}, "
          f"lost workload steps {lost_steps}; {rss_text}; {db_text}; tracebacks {fin.tracebacks}")
    for w in lost[:20]:
        print(f"  no journal entry: {w.line}")
    assert (orphans, duplicates, open_intents, lost, untracked, unaccounted, mismatched, lost_steps) == ([],) * 8, (
        f"orphans {orphans}, duplicates {duplicates}, open intents {open_intents}, writes with no journal entry "
        f"{[w.line for w in lost]}, untracked {untracked}, unaccounted {unaccounted}, size mismatches {mismatched}, "
        f"lost workload steps {lost_steps}")
    assert resizes >= max(2, RESIZES) and faults.events["kill"] >= 2 and writes
    assert fin.tracebacks == 0
    assert not rss_ratio > 1.25, f"controller RSS grew x{rss_ratio:.2f} between the first and last third"


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _copy_tail(src: Path, start: int, dest: Path) -> None:
    """``src`` from byte ``start`` on (what was logged during the soak) into ``dest``."""
    if src.exists():
        with open(src, "rb") as log:
            log.seek(start)
            dest.write_bytes(log.read())


def _keep(out: Path, ctld_log: Path, log_from: int, fin: Final) -> None:
    """The soak's slurmctld log and journal beside its DB, to read a failure from (and record from a run)."""
    _copy_tail(ctld_log, log_from, out / "slurmctld-soak.log")
    rows = {"actions": [{**asdict(a), "kind": str(a.kind), "state": str(a.state)} for a in fin.actions],
            "extensions": [asdict(e) for e in fin.ext_records.values()]}
    (out / "journal.json").write_text(json.dumps(rows, default=str, indent=1))


def _flat(f: Faults) -> tuple[float, str, str]:
    """The controller's RSS at the same age (>= 15 s) in the last third of the soak vs the first third; the DB's
    growth per hour in the last third vs the first."""
    third = f.wall_s / 3
    early = sorted(k for t, age, k in f.rss if t < third and age >= 15)
    late = sorted(k for t, age, k in f.rss if t >= 2 * third and age >= 15)
    ratio = (late[len(late) // 2] / early[len(early) // 2]) if early and late else float("nan")
    growth = {}
    for name, lo, hi in (("first", 0.0, third), ("last", 2 * third, f.wall_s + 1)):
        pts = [(t, b) for t, b in f.db_size if lo <= t < hi]
        growth[name] = (pts[-1][1] - pts[0][1]) / max(pts[-1][0] - pts[0][0], 1) * 3600 if len(pts) > 1 else 0.0
    rss = (f"controller RSS median early {early[len(early) // 2] if early else 0} KiB, "
           f"late {late[len(late) // 2] if late else 0} KiB (x{ratio:.2f})")
    db = (f"DB {f.db_size[-1][1] if f.db_size else 0} bytes, growth {growth['first'] / 1e6:.2f} MB/h first third, "
          f"{growth['last'] / 1e6:.2f} MB/h last third")
    return ratio, rss, db


def _jobs(cluster: TestCluster) -> list[dict[str, object]]:
    jobs = cluster.squeue_json()["jobs"]
    assert isinstance(jobs, list)
    return jobs
