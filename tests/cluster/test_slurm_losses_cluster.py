"""Slurm-side losses on the real cluster: extension jobs that Slurm takes away by itself.

a. Extensions in a preemptible QOS (``[extension] qos = "scavenger"``) are preempted by Slurm alone when a
   ``--qos=high`` job needs their nodes; the controller records PREEMPTED_BY_SLURM, the leader runs on at its
   smaller size, and the loss starts the cooldown: no regrow into the same contention until it is over.
b. The slurmd under an extension is SIGKILLed; Slurm itself finds the node dead (SlurmdTimeout=60: measured
   NOT_RESPONDING after ~50 s, DOWN and the extension NODE_FAIL after ~95 s); the controller records
   NODE_FAILURE, and regrows onto the node once its slurmd is back and ReturnToService=2 returns it.
c. The extension is preempted while no controller runs and slurmctld purges it (MinJobAge=120) before one
   starts again: the restarted controller asks sacct how it ended and records PREEMPTED_BY_SLURM all the same.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest

from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.slurm.model import Job
from slurm_elastic.store.records import ActionKind, ActionState, DecisionRecord
from tests.cluster.agents_harness import Agents
from tests.cluster.controller_harness import (
    ControllerProcess,
    controller_config,
    elastic_script,
    marker_file,
    node_count,
    running_controller,
    wait_until,
)
from tests.cluster.harness import TestCluster
from tests.policy_text import CLUSTER, policy_text

pytestmark = pytest.mark.cluster

COOLDOWN_S = 30  # long enough to watch the unit hold in cooldown after a loss
POLICY = policy_text(CLUSTER, cooldown_s=COOLDOWN_S)
LOSS_REASONS = {"PREEMPTED_BY_SLURM", "NODE_FAILURE"}


def _config(tmp_path: Path, agents: Agents, *, qos: str) -> Path:
    cfg = controller_config(tmp_path, agents)
    (tmp_path / "policy.toml").write_text(POLICY)
    if qos:
        text = cfg.read_text()
        assert text.count("[extension.env]") == 1
        cfg.write_text(text.replace("[extension.env]", f'[extension]\nqos = "{qos}"\n[extension.env]'))
    return cfg


def extensions_of(cluster: TestCluster, leader: int, states: set[str]) -> list[Job]:
    out = []
    for j in cluster.jobs():
        tag = parse_tag(j.comment)
        if tag and tag.parent == leader and j.state in states:
            out.append(j)
    return out


def losses(ctl: ControllerProcess, job: int) -> list[DecisionRecord]:
    return [d for d in ctl.decisions(job) if d.reason in LOSS_REASONS]


def _slurmd_alive(cluster: TestCluster, node: str) -> bool:
    try:
        os.kill(int((cluster.root / "run" / f"slurmd-{node}.pid").read_text().split()[0]), 0)
    except (OSError, ValueError):
        return False
    return True


def _node_state(cluster: TestCluster, node: str) -> str:
    lines = cluster.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], timeout=30).stdout.split()
    return lines[0] if lines else ""


def _restore_node(cluster: TestCluster, node: str) -> None:
    """Start the node's slurmd if it is dead and make sure the node is back in service (the finally of test b)."""
    if not _slurmd_alive(cluster, node):
        subprocess.run(["slurmd", "-N", node], env=cluster.env, check=True, timeout=60)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if _node_state(cluster, node) in {"idle", "mixed", "allocated"}:
            return
        cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], timeout=30)
        time.sleep(1)
    raise AssertionError(f"{node} did not come back after restarting its slurmd")


def test_scavenger_extensions_preempted_by_slurm_are_recorded_and_not_regrown_within_the_cooldown(
        stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    directives = "#ELASTIC --min-nodes 1 --max-nodes 3 --window 10s --grace 3s --signal USR2"
    job = cluster.submit(elastic_script(90, directives, marker_file(cluster)), "-N1", "--gres=gpu:2", "--time=60",
                         "--nodelist=n1", user="alice")
    cluster.wait_state(job, {"RUNNING"})
    high: int | None = None
    try:
        with running_controller(cluster, _config(tmp_path, stack, qos="scavenger")) as ctl:
            wait_until("two running extension jobs", lambda: len(extensions_of(cluster, job, {"RUNNING"})) == 2,
                       150, ctl)
            exts = extensions_of(cluster, job, {"RUNNING"})
            # Slurm's association and QOS checks let alice run them in scavenger; the leader stays in normal.
            assert all(e.qos == "scavenger" and e.user == "alice" and e.account == "nlp"
                       for e in exts), exts
            leader = cluster.job(job)
            assert leader is not None and leader.qos == "normal"
            ext_ids = sorted(e.job_id for e in exts)
            # Past the second grow's cooldown (the hold turns from COOLDOWN to AT_MAX): any cooldown below is the
            # loss's.
            second = ctl.wait_applied(job, ActionKind.GROW, 2)[1]
            wait_until("the second grow's cooldown to end", lambda: second.finished_at is not None and any(
                d.reason == "AT_MAX" and d.time > second.finished_at for d in ctl.decisions(job)),
                COOLDOWN_S + 30, ctl)
            actions_before = {a.id for a in ctl.actions(job)}

            # A rigid high-QOS job that needs the extensions' nodes (n2-n4 whole); Slurm preempts them by itself.
            high = cluster.submit("#!/bin/bash\nsleep 600\n", "-N3", "--exclude=n1", "--gres=gpu:4", "--time=30",
                                  "--qos=high", user="bob")
            cluster.wait_state(high, {"RUNNING"}, timeout=60)
            assert {i: cluster.job_state(i) for i in ext_ids} == {i: "PREEMPTED" for i in ext_ids}
            wait_until("both losses recorded", lambda: len(losses(ctl, job)) == 2, 30, ctl)
            recorded = losses(ctl, job)
            first = min(d.time for d in recorded)
            # Watch the whole cooldown after the loss.
            while time.time() < first.timestamp() + COOLDOWN_S - 2:
                time.sleep(1)
            during = [d for d in ctl.decisions(job) if d.time > first and d.reason not in LOSS_REASONS]
            new_actions = [a for a in ctl.actions(job) if a.id not in actions_before]
            leader_state, leader_nodes = cluster.job_state(job), node_count(cluster, job)
            wait_until("a NO_FREE_NODES hold once the cooldown is over (the high job holds the nodes)", lambda: any(
                d.reason == "NO_FREE_NODES" and d.time > first + timedelta(seconds=COOLDOWN_S)
                for d in ctl.decisions(job)), 30, ctl)
            assert not [a for a in ctl.actions(job) if a.id not in actions_before]

            cluster.cancel(high)
            wait_until("the job to regrow after the high job ended",
                       lambda: len(extensions_of(cluster, job, {"RUNNING"})) >= 1, 90, ctl)
            regrown = [e for e in extensions_of(cluster, job, {"RUNNING"}) if e.job_id not in ext_ids]
            grows_before = len([a for a in ctl.applied(job, ActionKind.GROW) if a.id in actions_before])
            regrow_actions = [a for a in ctl.wait_applied(job, ActionKind.GROW, grows_before + 1)
                              if a.id not in actions_before]
    finally:
        if high is not None:
            cluster.cancel(high)
    # Slurm alone took them: the controller journaled no action from the high job's arrival to the end of cooldown.
    assert new_actions == [], new_actions
    assert leader_state == "RUNNING" and leader_nodes == 1
    assert sorted(int(str(d.inputs["extension_job"])) for d in recorded) == ext_ids
    for d in recorded:
        assert d.action == "shrink" and d.reason == "PREEMPTED_BY_SLURM"
        assert d.inputs["slurm_state"] == "PREEMPTED" and d.inputs["lost_nodes"] == d.inputs["extension_nodes"]
        assert d.inputs["extension_nodes"] and str(d.inputs["extension_job"]) in d.message
    assert sorted((d.current_nodes, d.target_nodes) for d in recorded) == [(2, 1), (3, 2)]
    # The loss counted as a resize: every decision inside its cooldown was a COOLDOWN hold, none a grow.
    assert during and all(d.action == "hold" and d.reason == "COOLDOWN" for d in during), \
        [(d.action, d.reason) for d in during]
    assert regrown and all(e.qos == "scavenger" for e in regrown)
    assert regrow_actions and all(a.created_at > first + timedelta(seconds=COOLDOWN_S) for a in regrow_actions)
    print(f"\npreempted by Slurm: extensions {ext_ids} -> PREEMPTED by high job {high}; recorded "
          f"{[(d.current_nodes, d.target_nodes) for d in recorded]}; {len(during)} COOLDOWN holds; regrew with "
          f"{[e.job_id for e in regrown]}")



def test_a_preemption_while_the_controller_was_down_is_read_from_sacct(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    directives = "#ELASTIC --min-nodes 1 --max-nodes 2 --window 10s --grace 3s --signal USR2"
    job = cluster.submit(elastic_script(90, directives, marker_file(cluster)), "-N1", "--gres=gpu:2", "--time=60",
                         "--nodelist=n1", user="alice")
    cluster.wait_state(job, {"RUNNING"})
    cfg = _config(tmp_path, stack, qos="scavenger")
    high: int | None = None
    try:
        with running_controller(cluster, cfg) as ctl:
            wait_until("a running extension job", lambda: len(extensions_of(cluster, job, {"RUNNING"})) == 1,
                       120, ctl)
            (ext,) = extensions_of(cluster, job, {"RUNNING"})
            ext_id, ext_nodes = ext.job_id, ",".join(ext.nodes)
            ctl.wait_applied(job, ActionKind.GROW, 1)
        # No controller now. Slurm preempts the extension, and forgets it MinJobAge later.
        high = cluster.submit("#!/bin/bash\nsleep 600\n", "-N3", "--exclude=n1", "--gres=gpu:4", "--time=30",
                              "--qos=high", user="bob")
        cluster.wait_state(high, {"RUNNING"}, timeout=60)
        wait_until(f"extension {ext_id} purged from squeue", lambda: all(
            j.job_id != ext_id for j in cluster.jobs()), 300)
        with running_controller(cluster, cfg) as ctl:
            wait_until("the loss recorded", lambda: losses(ctl, job), 30, ctl)
            (loss,) = losses(ctl, job)
            st = ctl.store()
            try:
                (rec,) = [r for r in st.jobs.extensions(job, active_only=False) if r.job_id == ext_id]
            finally:
                st.close()
            leader_state = cluster.job_state(job)
    finally:
        if high is not None:
            cluster.cancel(high)
    assert rec.state == "PREEMPTED" and rec.ended_at is not None  # as sacct has it
    assert (loss.action, loss.reason, loss.current_nodes, loss.target_nodes) == ("shrink", "PREEMPTED_BY_SLURM", 2, 1)
    assert loss.inputs["extension_job"] == ext_id and loss.inputs["slurm_state"] == "PREEMPTED"
    assert loss.inputs["lost_nodes"] == [ext_nodes]
    assert leader_state == "RUNNING"


def test_node_failure_under_an_extension_is_recorded_and_the_job_regrows_when_the_node_returns(
        stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    # The filler leaves n4 the only node a grow can take: after the failure there is nothing to regrow onto.
    filler = cluster.submit("#!/bin/bash\nsleep 900\n", "-N2", "--nodelist=n2,n3", "--gres=gpu:4", "--time=30",
                            user="bob")
    cluster.wait_state(filler, {"RUNNING"})
    directives = "#ELASTIC --min-nodes 1 --max-nodes 2 --window 10s --grace 3s --signal USR2"
    job = cluster.submit(elastic_script(90, directives, marker_file(cluster)), "-N1", "--gres=gpu:2", "--time=60",
                         "--nodelist=n1", user="alice")
    cluster.wait_state(job, {"RUNNING"})
    victim = "n4"
    killed = False
    try:
        with running_controller(cluster, _config(tmp_path, stack, qos="")) as ctl:
            wait_until("an extension running on n4", lambda: [
                e for e in extensions_of(cluster, job, {"RUNNING"}) if e.nodes == (victim,)], 150, ctl)
            (ext,) = extensions_of(cluster, job, {"RUNNING"})
            ext_id = ext.job_id
            grows_before = {a.id for a in ctl.applied(job, ActionKind.GROW)}
            # Slurm detects the death by itself (SlurmdTimeout=60, no `scontrol update State=DOWN`): the slurmd
            # is SIGKILLed, the extension's processes are left as they are.
            os.kill(int((cluster.root / "run" / f"slurmd-{victim}.pid").read_text().split()[0]), signal.SIGKILL)
            killed = True
            killed_at = time.monotonic()
            wait_until("NODE_FAILURE recorded", lambda: losses(ctl, job), 200, ctl)
            detected_s = time.monotonic() - killed_at
            (loss,) = losses(ctl, job)
            ext_state = cluster.job_state(ext_id)
            node_state = _node_state(cluster, victim)
            leader_state, leader_nodes = cluster.job_state(job), node_count(cluster, job)
            wait_until("a NO_FREE_NODES hold after the cooldown (n2, n3 filled, n4 down)", lambda: any(
                d.reason == "NO_FREE_NODES" and d.time > loss.time for d in ctl.decisions(job)), 60, ctl)
            assert {a.id for a in ctl.applied(job, ActionKind.GROW)} == grows_before  # nothing to regrow onto
            during = [d for d in ctl.decisions(job) if d.time > loss.time and d.reason not in LOSS_REASONS]

            # The slurmd comes back; ReturnToService=2 returns the node by itself (no RESUME).
            subprocess.run(["slurmd", "-N", victim], env=cluster.env, check=True, timeout=60)
            wait_until(f"{victim} back in service", lambda: _node_state(cluster, victim) in {
                "idle", "mixed", "allocated"}, 60, ctl)
            wait_until("the job to regrow onto the returned node", lambda: [
                e for e in extensions_of(cluster, job, {"RUNNING"}) if e.nodes == (victim,)], 90, ctl)
            regrown = [a for a in ctl.wait_applied(job, ActionKind.GROW, len(grows_before) + 1)
                       if a.id not in grows_before]
            st = ctl.store()
            try:
                exts = st.jobs.extensions(job, active_only=False)
            finally:
                st.close()
    finally:
        if killed:
            _restore_node(cluster, victim)
    assert ext_state == "NODE_FAIL" and node_state.startswith("down"), (ext_state, node_state)
    assert leader_state == "RUNNING" and leader_nodes == 1
    assert loss.action == "shrink" and loss.reason == "NODE_FAILURE"
    assert (loss.current_nodes, loss.target_nodes) == (2, 1)
    assert loss.inputs["extension_job"] == ext_id and loss.inputs["lost_nodes"] == [victim]
    assert loss.inputs["slurm_state"] in {"NODE_FAIL", "RUNNING"}
    assert str(loss.inputs["node_states"][victim]).startswith("DOWN")
    assert during and all(d.action == "hold" for d in during)
    assert len(losses(ctl, job)) == 1  # once, although the extension was seen RUNNING on a DOWN node and NODE_FAIL
    assert len(regrown) == 1 and regrown[0].params["nodes"] == [victim] and regrown[0].state == ActionState.APPLIED
    (old,) = [e for e in exts if e.job_id == ext_id]
    assert old.state == "NODE_FAIL" and old.ended_at is not None
    print(f"\nnode failure: slurmd on {victim} SIGKILLed; Slurm ended extension {ext_id} NODE_FAIL, recorded after "
          f"{detected_s:.0f}s; regrew onto {victim} after it returned")


def test_a_leader_with_no_kill_survives_a_non_batch_node_failure_and_is_made_whole_again(
        stack: Agents, tmp_path: Path) -> None:
    """c. The leader job itself (submitted with --no-kill, as the templates do) loses its non-batch node: Slurm
    drops the node from the job and the job goes on at 1 node (measured on 22.05). The controller records
    NODE_FAILURE against the leader, once, and when the node is back grows the unit to its min again with an
    extension job. The node is marked DOWN by hand right after its slurmd is killed: Slurm's own detection of
    a dead node (SlurmdTimeout, ~95 s) is what test b measures; here it would only make the test slower."""
    cluster = stack.cluster
    filler = cluster.submit("#!/bin/bash\nsleep 900\n", "-N2", "--nodelist=n3,n4", "--gres=gpu:4", "--time=30",
                            user="bob")
    cluster.wait_state(filler, {"RUNNING"})
    directives = "#ELASTIC --min-nodes 2 --max-nodes 2 --window 10s --grace 3s --signal USR2"
    job = cluster.submit(elastic_script(60, directives, marker_file(cluster)), "-N2", "--no-kill",
                         "--nodelist=n1,n2", "--gres=gpu:4", "--time=60", user="alice")
    cluster.wait_state(job, {"RUNNING"})
    rec = cluster.job(job)
    assert rec is not None and rec.batch_host == "n1"
    victim = "n2"
    killed = False
    try:
        with running_controller(cluster, _config(tmp_path, stack, qos="")) as ctl:
            wait_until("the controller to know the job", lambda: any(
                d.reason == "IN_BAND" for d in ctl.decisions(job)), 60, ctl)
            os.kill(int((cluster.root / "run" / f"slurmd-{victim}.pid").read_text().split()[0]), signal.SIGKILL)
            killed = True
            cluster.run(["scontrol", "update", f"NodeName={victim}", "State=DOWN", "Reason=leader-loss-test"])
            wait_until("NODE_FAILURE recorded for the leader", lambda: losses(ctl, job), 60, ctl)
            (loss,) = losses(ctl, job)
            leader_state, leader_nodes = cluster.job_state(job), node_count(cluster, job)
            subprocess.run(["slurmd", "-N", victim], env=cluster.env, check=True, timeout=60)
            wait_until(f"{victim} back in service", lambda: _node_state(cluster, victim) in {
                "idle", "mixed", "allocated"}, 60, ctl)
            wait_until("an extension job on the returned node", lambda: [
                e for e in extensions_of(cluster, job, {"RUNNING"}) if e.nodes == (victim,)], 120, ctl)
            grows = ctl.applied(job, ActionKind.GROW)
            grow_decisions = [d for d in ctl.decisions(job) if d.action == "grow"]
    finally:
        if killed:
            _restore_node(cluster, victim)
    assert leader_state == "RUNNING" and leader_nodes == 1  # --no-kill: the job went on without n2
    assert (loss.action, loss.reason, loss.current_nodes, loss.target_nodes) == ("shrink", "NODE_FAILURE", 2, 1)
    assert loss.inputs["extension_job"] == job and loss.inputs["lost_nodes"] == [victim]
    assert "leader job" in loss.message
    assert len(losses(ctl, job)) == 1
    assert len(grows) == 1 and grows[0].params["nodes"] == [victim]
    assert grow_decisions and grow_decisions[-1].reason == "BELOW_MIN"
    print(f"\nleader node failure: {victim} lost under leader {job} (--no-kill), recorded; regrown onto {victim}")
