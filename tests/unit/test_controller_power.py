"""Slurm power saving in the controller: resume times and failed resumes from successive snapshots, the
RESUME_FAILED record, and the recorded replies of the power-saving test cluster (docs/power-saving.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from slurm_elastic.controller.power import (
    PowerTracker,
    decide_resume_failures,
    failure_decision,
    find_resume_failures,
)
from slurm_elastic.controller.rulings import CancelExtension, Ruling
from slurm_elastic.policy.capacity import is_resumable_node
from slurm_elastic.slurm.accounting import parse_resume_timeout
from slurm_elastic.slurm.decode import parse_nodes
from slurm_elastic.slurm.model import Node
from slurm_elastic.store.records import ExtensionRecord, NewDecision
from tests.unit.policy_builders import NOW, job, node, snapshot, unit

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "22.05"


def _n(name: str, *flags: str, state: str = "IDLE") -> Node:
    return node(name, state=state, flags=("CLOUD", *flags))


def test_recorded_sinfo_shows_powered_down_cloud_nodes_as_resumable() -> None:
    _, nodes = parse_nodes(json.loads((RECORDED / "sinfo_power.json").read_text()))
    by_name = {n.name: n for n in nodes}
    assert by_name["n5"].state == "IDLE" and set(by_name["n5"].state_flags) == {"CLOUD", "POWERED_DOWN"}
    assert [n.name for n in nodes if is_resumable_node(n)] == ["n5", "n6"]
    assert not by_name["n5"].is_available  # not a powered-on free node
    assert by_name["n1"].is_available and not is_resumable_node(by_name["n1"])


def test_recorded_config_gives_resume_timeout() -> None:
    assert parse_resume_timeout((RECORDED / "scontrol_show_config_power.txt").read_text()) == 30
    assert parse_resume_timeout((RECORDED / "scontrol_show_config.txt").read_text()) == 60
    assert parse_resume_timeout("ClusterName = x\n") is None


def test_resume_time_is_measured_from_powering_up_to_available() -> None:
    t = PowerTracker()
    assert t.observe(snapshot([], [_n("n5", "POWERED_DOWN")]), NOW) == {}
    assert t.observe(snapshot([], [_n("n5", "POWERING_UP", "NOT_RESPONDING")]), NOW + timedelta(seconds=5)) == {}
    assert t.observe(snapshot([], [_n("n5", "POWERING_UP")]), NOW + timedelta(seconds=10)) == {}
    assert t.observe(snapshot([], [_n("n5", state="MIXED")]), NOW + timedelta(seconds=17)) == {}
    assert t.estimates() == {"n5": 12.0}
    assert t.since == {}


def test_a_node_that_falls_back_to_powered_down_or_down_failed_its_resume() -> None:
    t = PowerTracker()
    t.observe(snapshot([], [_n("n5", "POWERING_UP"), _n("n6", "POWERING_UP")]), NOW)
    failed = t.observe(snapshot([], [_n("n5", "POWERED_DOWN"), _n("n6", "POWERED_DOWN", state="DOWN")]),
                       NOW + timedelta(seconds=30))
    assert failed == {"n5": "IDLE+CLOUD+POWERED_DOWN", "n6": "DOWN+CLOUD+POWERED_DOWN"}
    assert t.estimates() == {}


def _rec(job_id: int, parent: int, nodelist: str, state: str = "PENDING") -> ExtensionRecord:
    return ExtensionRecord(job_id=job_id, parent_job_id=parent, node_count=1, nodelist=nodelist, state=state,
                           action_id=1, idempotency_key=None, created_at=NOW, updated_at=NOW, ended_at=None)


def test_failed_resume_under_an_extension_keeps_the_unit_at_its_size() -> None:
    u = unit(job(100, nodes=("n1",)))
    requeued = replace(job(501, nodes=(), state="PENDING"), node_count=1)
    snap = snapshot([u.job, requeued], [node("n1", used=4), _n("n5", "POWERED_DOWN")])
    failures = find_resume_failures({100: u}, [_rec(501, 100, "n5"), _rec(502, 999, "n5")], snap,
                                    {"n5": "IDLE+CLOUD+POWERED_DOWN"})
    assert [(f.unit_id, f.extension_job, f.failed, f.slurm_state) for f in failures] == [
        (100, 501, ("n5",), "PENDING")]
    d = failure_decision(u, failures[0], 30.0, cancelled=True, backoff_s=1800, now=NOW)
    assert (d.action, d.reason, d.current_nodes, d.target_nodes) == ("hold", "RESUME_FAILED", 1, 1)
    assert d.inputs["lost_nodes"] == ["n5"] and "within ResumeTimeout 30s" in d.message
    assert "extension job cancelled by the controller" in d.message and d.inputs["ended_by"] == "controller"
    assert d.inputs["node_backoff_until"] == (NOW + timedelta(seconds=1800)).isoformat()
    # Slurm ended it (no requeue: NODE_FAIL): the message says so, not "cancelled"
    lost = replace(failures[0], slurm_state="NODE_FAIL")
    d = failure_decision(u, lost, 30.0, cancelled=False)
    assert "extension job ended by Slurm (NODE_FAIL)" in d.message and "cancelled" not in d.message
    assert d.inputs["ended_by"] == "slurm"
    assert not find_resume_failures({100: u}, [_rec(501, 100, "n2")], snap, {"n5": "IDLE"})


def _record(store: Any, cycle: int, rulings: list[Ruling]) -> list[NewDecision]:
    """The cycle's write step for these rulings (controller/cycle.py: _write_rulings), without Slurm."""
    store.decisions.record_decisions(cycle, [v.decision for v in rulings])
    return [v.decision for v in rulings]


def test_the_shell_asks_for_the_cancel_records_once_and_backs_the_node_off() -> None:
    from slurm_elastic.controller.power import ResumeFailures
    from slurm_elastic.store.records import JobObservation
    from tests.unit.storehelpers import FakeClock, memory_store

    clock = FakeClock(NOW)
    store = memory_store(clock)
    u = unit(job(100, nodes=("n1",)))
    store.jobs.upsert_job(JobObservation(job_id=100, user="alice", account="acct", partition="gpu", state="RUNNING",
                                         current_nodes=1, min_nodes=1, max_nodes=4))
    store.jobs.record_extension(job_id=501, parent_job_id=100, node_count=1, state="PENDING", nodelist="n5")
    shell = ResumeFailures(store)
    booting = replace(job(501, nodes=("n5",), state="CONFIGURING"), node_count=1)
    cycle = store.decisions.begin_cycle()
    assert shell.decide({100: u}, snapshot([u.job, booting], [node("n1", used=4), _n("n5", "POWERING_UP")]), NOW,
                        resume_timeout_s=30.0) == []
    requeued = replace(booting, state="PENDING", nodes=())
    later = NOW + timedelta(seconds=31)
    snap = snapshot([u.job, requeued], [node("n1", used=4), _n("n5", "POWERED_DOWN")])
    (v,) = shell.decide({100: u}, snap, later, resume_timeout_s=30.0)
    (d,) = _record(store, cycle, [v])
    assert v.cancel == CancelExtension(100, 501, "RESUME_FAILED", ("n5",)) and d.reason == "RESUME_FAILED"
    assert d.inputs["ended_by"] == "controller"
    # the unit's grows back off from now: 60 s for a first failed grow, the end time in the record
    until = (later + timedelta(seconds=60)).isoformat()
    assert d.inputs["grow_backoff_until"] == until and d.inputs["failed_grows"] == 1
    assert "its grows back off until " + until[:19] + "Z (GROW_BACKOFF, 1 failed grow(s)" in d.message
    assert shell.decide({100: u}, snap, later, resume_timeout_s=30.0) == []
    clock.advance(31)
    state = shell.state(later, 1800, 30.0)
    assert set(state.resume_failed) == {"n5"} and state.resume_timeout_s == 30.0
    assert shell.state(later + timedelta(seconds=1801), 1800, 30.0).resume_failed == {}


def test_a_node_slurm_resumes_for_a_pending_extension_is_not_unusable() -> None:
    from slurm_elastic.controller.reconcile import unusable_nodes

    snap = snapshot([], [_n("n5", "POWERED_DOWN"), _n("n6", "POWERING_UP", "NOT_RESPONDING", state="MIXED"),
                         _n("n7", "POWERED_DOWN", "NOT_RESPONDING", state="DOWN"), _n("n8", "POWERING_DOWN"),
                         node("n9", flags=("NOT_RESPONDING",))])
    assert unusable_nodes(snap, "n5,n6,n8") == ""  # n8: Slurm resumes it once it is down (SuspendTimeout)
    assert unusable_nodes(snap, "n5,n7,n9,gone") == "n7,n9,gone"


def test_the_resume_failure_decider_is_pure_and_cancels_only_a_live_extension_outside_dry_run() -> None:
    u = unit(job(100, nodes=("n1",)))
    recs = [_rec(501, 100, "n5"), _rec(502, 100, "n6")]
    live = replace(job(501, nodes=(), state="PENDING"), node_count=1)
    ended = replace(job(502, nodes=(), state="NODE_FAIL"), node_count=1)
    snap = snapshot([u.job, live, ended], [node("n1", used=4), _n("n5", "POWERED_DOWN"), _n("n6", "POWERED_DOWN")])
    failed = {"n5": "IDLE+CLOUD+POWERED_DOWN", "n6": "IDLE+CLOUD+POWERED_DOWN"}
    rulings = decide_resume_failures({100: u}, recs, snap, failed, NOW, ends=(), resume_timeout_s=30.0,
                                      backoff_s=1800)
    assert [(v.decision.reason, v.cancel) for v in rulings] == [
        ("RESUME_FAILED", CancelExtension(100, 501, "RESUME_FAILED", ("n5",))), ("RESUME_FAILED", None)]
    # the second failure of the unit in one cycle counts the first: two failed grows back off longer
    assert [v.decision.inputs["failed_grows"] for v in rulings] == [1, 2]
    assert "extension job ended by Slurm (NODE_FAIL)" in rulings[1].decision.message
    dry = decide_resume_failures({100: u}, recs, snap, failed, NOW, ends=(), resume_timeout_s=30.0, dry_run=True)
    assert [v.cancel for v in dry] == [None, None] and "cancelled" not in dry[0].decision.message
    assert decide_resume_failures({100: u}, recs, snap, failed, NOW, ends=(), resume_timeout_s=30.0,
                                  backoff_s=1800) == rulings  # the same facts, the same rulings
