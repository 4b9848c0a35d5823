"""Faults on the real cluster, with real agents over virtual GPUs and the real controller process
(docs/reliability.md, rows F1-F3).

* F1 crash storm: several elastic jobs whose utilization flips between busy and idle grow and shrink while the
  controller is SIGKILLed at seeded random moments and restarted each time. At the end: no orphan and no
  duplicate extension job, every journaled intent has an outcome, the DB's sizes match Slurm's, every job is
  within its min and max.
* F2 slurmctld outage: slurmctld is stopped (by its pid) for a bounded time while the controller runs: no crash, no
  action while Slurm does not answer, the error logged once per outage, recovery without help.
* F3 agent loss: an agent is SIGSTOPped, then SIGKILLed: no shrink on stale data; the agent shows as failing.

Bounded by default; ``SLURM_ELASTIC_LONG=1`` runs the long form (>=100 crash points, a 60 s outage).
Run: ``flock /tmp/slurm-elastic-cluster-tests.lock .venv/bin/pytest -s tests/cluster/test_reliability_faults.py``
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.slurm.hostlist import expand
from slurm_elastic.store.records import ActionKind, ActionState
from tests.cluster.agents_harness import Agents
from tests.cluster.controller_harness import (
    controller_config,
    node_count,
    running_controller,
    set_util,
    util_script,
    wait_until,
)
from tests.cluster.harness import TestCluster
from tests.policy_text import CLUSTER, policy_text

pytestmark = pytest.mark.cluster

LONG = os.environ.get("SLURM_ELASTIC_LONG") == "1"
SEED = int(os.environ.get("SLURM_ELASTIC_FAULT_SEED", "20261129"))
CRASHES = int(os.environ.get("SLURM_ELASTIC_CRASHES", "100" if LONG else "20"))
OUTAGE_S = 60.0 if LONG else 20.0
OPEN = {ActionState.INTENT, ActionState.IN_PROGRESS}
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING"}
STORM_DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 2 --window 10s --cooldown 5s --grace 1s --signal USR2"
# The 40..80 band these tests were written for (the packaged 20..90 band never grows a job at 90%).
STORM_POLICY = policy_text(CLUSTER, cooldown_s=5, grace_s=1)


def squeue_jobs(cluster: TestCluster) -> list[dict[str, object]]:
    jobs = cluster.squeue_json()["jobs"]
    assert isinstance(jobs, list)
    return jobs


def slurm_size(jobs: list[dict[str, object]], leader: int, trusted: set[int]) -> int:
    """Nodes of the leader plus those of its running extensions (as Slurm sees them)."""
    size = 0
    for j in jobs:
        jid = int(str(j["job_id"]))
        if j.get("job_state") == "RUNNING" and (jid == leader or jid in trusted):
            size += len(expand(str(j.get("nodes") or "")))
    return size


# --- F1: crash storm ----------------------------------------------------------------------------------------------
@pytest.mark.timeout(3600 if LONG else 900)
def test_crash_storm_leaves_no_orphans_duplicates_or_open_intents(
        agents: Agents, clean_cluster: TestCluster, tmp_path: Path) -> None:
    cluster = clean_cluster
    rng = random.Random(SEED)
    # Restarted under one name, as systemd restarts it: the lease is its own again at once (a new name would
    # wait out lease_ttl_s after every kill, and the storm would mostly measure waiting).
    cfg = controller_config(tmp_path, agents, holder="storm")
    (tmp_path / "policy.toml").write_text(STORM_POLICY)
    leaders: dict[int, Path] = {}
    for k, user in enumerate(["alice", "bob", "alice"]):
        util_file = cluster.jobs_dir / f"util-{uuid.uuid4().hex[:8]}"
        set_util(util_file, 90 if k % 2 == 0 else 10)
        job = cluster.submit(util_script(cluster, util_file, STORM_DIRECTIVES), "-N1", "--gres=gpu:1",
                             "--time=60", user=user)
        leaders[job] = util_file
    for job in leaders:
        cluster.wait_state(job, {"RUNNING"})
    kills: list[float] = []
    flips = 0
    next_flip = time.monotonic() + 15
    phase = 0
    hook_kills = 0
    for _ in range(CRASHES):
        # Half the lives also arm the test crash hook at a seeded step, so kills land between intent and outcome
        # too (a random moment alone almost never hits those few milliseconds).
        crash_at = rng.choice([None, None, None, "grow:after-intent", "grow:after-submit", "shrink:after-intent"])
        with running_controller(cluster, cfg, crash_at=crash_at) as ctl:
            life = rng.uniform(2.0, 12.0)
            end = time.monotonic() + life
            while time.monotonic() < end:
                if time.monotonic() >= next_flip:  # alternate: busy jobs go idle and idle ones busy
                    phase += 1
                    for k, util_file in enumerate(leaders.values()):
                        set_util(util_file, 90 if (k + phase) % 2 == 0 else 10)
                    flips += 1
                    next_flip = time.monotonic() + 15
                time.sleep(0.2)
                if ctl.proc.poll() is not None:
                    break
            if ctl.proc.poll() is None:
                ctl.proc.send_signal(signal.SIGKILL)
            else:  # it may only have died by its crash hook
                assert ctl.proc.returncode == -signal.SIGKILL, ctl.log_text()[-3000:]
                hook_kills += 1
            ctl.proc.wait(timeout=30)
            kills.append(life)
    # Calm down: utilization in the hold band, one clean controller until nothing is open.
    for util_file in leaders.values():
        set_util(util_file, 60)
    with running_controller(cluster, cfg) as ctl:
        wait_until("every intent to have an outcome", lambda: all(a.state not in OPEN for a in ctl.actions()),
                   90, ctl)
        wait_until("no pending extension", lambda: not any(
            parse_tag(str(j.get("comment") or "")) and j.get("job_state") not in {"RUNNING"}
            and j.get("job_state") in ACTIVE for j in squeue_jobs(cluster)), 60, ctl)
        ctl.wait_settled()  # quiet cycles: the store holds the sizes Slurm has
        actions = ctl.actions()
        st = ctl.store()
        try:
            db_sizes = {j: st.jobs.get_job(j) for j in leaders}
            ext_records = {e.job_id: e for e in st.jobs.extensions(active_only=False)}
        finally:
            st.close()
        jobs = squeue_jobs(cluster)
        errors = ctl.log_text().count("Traceback")
    keys = {a.idempotency_key: a for a in actions if a.kind == ActionKind.GROW}
    tagged = [(j, parse_tag(str(j.get("comment") or ""))) for j in jobs if j.get("job_state") in ACTIVE]
    live_ext = [(j, t) for j, t in tagged if t is not None]
    # 0 duplicates: at most one live extension per idempotency key.
    dup = [k for k, n in Counter(t.key for _, t in live_ext).items() if n > 1]
    # 0 orphans: every live extension carries a journaled, applied key of a running leader of the same user.
    running_leaders = {int(str(j["job_id"])): j for j, t in tagged if t is None and j.get("job_state") == "RUNNING"}
    orphans = [int(str(j["job_id"])) for j, t in live_ext
               if t.parent not in running_leaders or t.key not in keys
               or keys[t.key].state != ActionState.APPLIED
               or running_leaders[t.parent]["user_name"] != j["user_name"]]
    open_intents = [a.id for a in actions if a.state in OPEN]
    mismatched, out_of_bounds = [], []
    for leader in leaders:
        trusted = {int(str(j["job_id"])) for j, t in live_ext if t.parent == leader}
        size = slurm_size(jobs, leader, trusted)
        rec = db_sizes[leader]
        if rec is None or rec.current_nodes != size:
            mismatched.append((leader, rec.current_nodes if rec else None, size))
        if not 1 <= size <= 2:
            out_of_bounds.append((leader, size))
    applied = Counter(a.kind for a in actions if a.state == ActionState.APPLIED)
    states = Counter(str(a.state) for a in actions)
    print(f"\nF1 crash storm: seed {SEED}, {len(kills)} SIGKILLs ({hook_kills} by the armed crash hook between "
          f"intent and outcome), {flips} utilization flips, "
          f"{len(actions)} journaled actions {dict(states)}, applied grow={applied[ActionKind.GROW]} "
          f"shrink={applied[ActionKind.SHRINK]} cancel={applied[ActionKind.CANCEL_EXTENSION]}, "
          f"extensions recorded={len(ext_records)}, live={len(live_ext)}; orphans={len(orphans)} "
          f"duplicates={len(dup)} open intents={len(open_intents)} size mismatches={len(mismatched)} "
          f"out of bounds={len(out_of_bounds)}")
    assert len(kills) == CRASHES
    assert (orphans, dup, open_intents, mismatched, out_of_bounds) == ([], [], [], [], [])
    assert applied[ActionKind.GROW] + applied[ActionKind.SHRINK] >= 2, "the storm resized nothing"
    assert errors == 0
    # When the leaders end, reconcile takes their extensions with them.
    cluster.cancel(*leaders)
    with running_controller(cluster, cfg) as ctl:
        wait_until("no extension left", lambda: not any(
            parse_tag(str(j.get("comment") or "")) and j.get("job_state") in ACTIVE for j in squeue_jobs(cluster)),
                   60, ctl)


# --- F2: slurmctld outage -------------------------------------------------------------------------------------------
def _restart_slurmctld(cluster: TestCluster) -> None:
    pid_file = cluster.root / "run" / "slurmctld.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text().split()[0]), 0)
            return  # still (or again) up
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["slurmctld"], env=cluster.env, check=True, timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if cluster.run(["scontrol", "ping"], timeout=30).returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError("slurmctld did not come back within 60 s")


def test_slurmctld_outage_no_crash_no_action_logged_once_and_recovers(
        agents: Agents, clean_cluster: TestCluster, tmp_path: Path) -> None:
    cluster = clean_cluster
    util_file = cluster.jobs_dir / f"util-{uuid.uuid4().hex[:8]}"
    set_util(util_file, 10)
    job = cluster.submit(util_script(cluster, util_file, STORM_DIRECTIVES), "-N2", "--gres=gpu:1", "--time=60",
                         user="bob")
    cluster.wait_state(job, {"RUNNING"})
    pid = int((cluster.root / "run" / "slurmctld.pid").read_text().split()[0])
    with running_controller(cluster, controller_config(tmp_path, agents)) as ctl:
        wait_until("a first decision", lambda: len(ctl.decisions(job)) >= 1, 60, ctl)
        before = len(ctl.actions())
        os.kill(pid, signal.SIGTERM)
        try:
            stopped_at = time.time()
            deadline = time.monotonic() + OUTAGE_S
            while time.monotonic() < deadline:
                assert ctl.proc.poll() is None, ctl.log_text()[-3000:]
                time.sleep(0.5)
            during = [a for a in ctl.actions() if a.created_at.timestamp() >= stopped_at]
            decisions_during = [d for d in ctl.decisions(job) if d.time.timestamp() >= stopped_at + 5]
        finally:
            _restart_slurmctld(cluster)
        restarted_at = time.time()
        wait_until("the controller to see Slurm again", lambda: "Slurm answers again" in ctl.log_text(), 90, ctl)
        wait_until("the idle job to shrink after the outage", lambda: node_count(cluster, job) == 1, 120, ctl)
        log = ctl.log_text()
    assert during == [] and decisions_during == []
    assert log.count("Slurm unavailable, not acting until it answers") == 1
    assert log.count("Slurm answers again") == 1
    shrinks = ctl.applied(job, ActionKind.SHRINK)
    assert shrinks and all(a.created_at.timestamp() >= restarted_at - 1 for a in shrinks[len(shrinks) - 1:])
    assert len(ctl.actions()) > before
    print(f"\nF2 slurmctld outage: {OUTAGE_S:.0f}s, 0 actions and 0 decisions during it, error logged once, "
          f"recovered and shrank after restart")


# --- F3: agent loss (last: it kills an agent of the module's set) ----------------------------------------------------
def test_agent_lost_sigstop_then_sigkill_no_shrink_on_stale_data(
        agents: Agents, clean_cluster: TestCluster, tmp_path: Path) -> None:
    cluster = clean_cluster
    util_file = cluster.jobs_dir / f"util-{uuid.uuid4().hex[:8]}"
    set_util(util_file, 10)
    job = cluster.submit(util_script(cluster, util_file, STORM_DIRECTIVES), "-N2", "--gres=gpu:1", "--time=60",
                         "--nodelist=n3,n4", user="bob")
    cluster.wait_state(job, {"RUNNING"})
    lost = agents.procs["n4"]
    os.kill(lost.pid, signal.SIGSTOP)
    try:
        with running_controller(cluster, controller_config(tmp_path, agents)) as ctl:
            # Holds are stored when they change: wait for the first one, then count full cycles.
            wait_until("a decision while the agent is stopped", lambda: len(ctl.decisions(job)) >= 1, 90, ctl)
            ctl.wait_cycles(6)
            os.kill(lost.pid, signal.SIGKILL)
            ctl.wait_cycles(6)
            decisions = ctl.decisions(job)
            actions = ctl.actions(job)
            st = ctl.store()
            try:
                agent = {a.node: a for a in st.agents.list_agents()}.get("n4")
            finally:
                st.close()
    finally:
        if lost.poll() is None:
            os.kill(lost.pid, signal.SIGCONT)
    assert actions == []
    assert node_count(cluster, job) == 2
    assert {d.reason for d in decisions} <= {"NO_METRICS", "STALE_METRICS", "WINDOW_NOT_FILLED", "TOO_FEW_SAMPLES"}
    assert agent is not None and agent.last_error
    print(f"\nF3 agent loss: {len(decisions)} decisions with n4's agent stopped then killed, 0 actions")


# --- F6: a node dies while an extension job starts on it --------------------------------------------------------------
def _restart_slurmd(cluster: TestCluster, node: str) -> None:
    pid_file = cluster.root / "run" / f"slurmd-{node}.pid"
    try:
        os.kill(int(pid_file.read_text().split()[0]), 0)
        alive = True
    except (OSError, ValueError):
        alive = False
    if not alive:
        subprocess.run(["slurmd", "-N", node], env=cluster.env, check=True, timeout=60)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], timeout=30)
        state = cluster.run(["sinfo", "-h", "-n", node, "-o", "%T"], timeout=30).stdout.strip()
        if state in {"idle", "mixed", "allocated"}:
            return
        time.sleep(1)
    raise AssertionError(f"{node} did not come back after restarting its slurmd")


def test_node_dies_mid_resize_result_recorded_extension_cleaned_job_consistent(
        agents: Agents, clean_cluster: TestCluster, tmp_path: Path) -> None:
    cluster = clean_cluster
    util_file = cluster.jobs_dir / f"util-{uuid.uuid4().hex[:8]}"
    set_util(util_file, 90)
    job = cluster.submit(util_script(cluster, util_file, STORM_DIRECTIVES), "-N1", "--gres=gpu:1", "--time=60",
                         "--nodelist=n1", user="alice")
    cluster.wait_state(job, {"RUNNING"})
    cfg = controller_config(tmp_path, agents)
    (tmp_path / "policy.toml").write_text(STORM_POLICY)
    victim: str | None = None
    try:
        with running_controller(cluster, cfg) as ctl:
            def grow_nodes() -> list[str] | None:
                for a in ctl.actions(job):
                    if a.kind == ActionKind.GROW and a.state in {ActionState.IN_PROGRESS, ActionState.APPLIED}:
                        return [str(n) for n in a.params.get("nodes") or []]
                return None

            deadline = time.monotonic() + 120
            nodes = None
            while nodes is None and time.monotonic() < deadline:
                nodes = grow_nodes()
                time.sleep(0.1)
            assert nodes, "the busy job never grew"
            victim = nodes[0]
            set_util(util_file, 60)  # hold band from here on: no further resize muddles the picture
            pid = int((cluster.root / "run" / f"slurmd-{victim}.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)  # the node dies as its extension starts
            cluster.run(["scontrol", "update", f"NodeName={victim}", "State=DOWN", "Reason=reliability-test"])
            (grow,) = [a for a in ctl.actions(job) if a.kind == ActionKind.GROW]
            wait_until("the grow to have an outcome", lambda: ctl.actions(job)[0].state not in OPEN, 60, ctl)

            def ext_gone() -> bool:
                return not any(parse_tag(str(j.get("comment") or "")) and j.get("job_state") in ACTIVE
                               for j in squeue_jobs(cluster))

            wait_until("the extension on the dead node to be gone", ext_gone, 120, ctl)
            st = ctl.store()
            try:
                wait_until("the store to close the extension", lambda: all(
                    e.ended_at is not None for e in st.jobs.extensions(job, active_only=False)), 60, ctl)
                exts = st.jobs.extensions(job, active_only=False)
                ctl.wait_cycles(3)
                rec = st.jobs.get_job(job)
            finally:
                st.close()
            final = ctl.actions(job)[0]
    finally:
        if victim is not None:
            _restart_slurmd(cluster, victim)
    assert cluster.job_state(job) == "RUNNING"  # the leader on n1 is unharmed
    assert final.state in {ActionState.APPLIED, ActionState.FAILED, ActionState.ABORTED} and final.message
    assert exts and all(e.ended_at is not None for e in exts)
    assert rec is not None and rec.current_nodes == node_count(cluster, job) == 1
    print(f"\nF6 node death: slurmd on {victim} SIGKILLed while extension {[e.job_id for e in exts]} started; "
          f"grow {final.state}: {final.message}; extension ended as {[e.state for e in exts]}; job back to 1 node")
