"""Back-off for every failed grow: a failed prewarm whose cancelled extension ends COMPLETED, a
failed resume that Slurm ends NODE_FAIL, and an extension sbatch Slurm refused all count for GROW_BACKOFF
(slurm_elastic/backoff.py, policy/holds.py); the failure records say when the back-off ends, and ``explain`` shows
it."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner

from slurm_elastic.api.authz import Caller
from slurm_elastic.api.service import Service, ServiceSettings
from slurm_elastic.backoff import extension_ends, unit_backoff
from slurm_elastic.controller.coldstart import ColdStarts
from slurm_elastic.controller.power import PowerTracker
from slurm_elastic.policy.holds import grow_backoff, hold_blocked
from slurm_elastic.policy.model import ExtensionEnd
from slurm_elastic.prewarm import Event
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import ActionKind, JobObservation, NewDecision
from tests.unit.policy_builders import NOW, job, node, snapshot, unit
from tests.unit.storehelpers import FakeClock, memory_store

ROOT = Caller(0, "root")


def _store() -> tuple[SqlStore, FakeClock]:
    clock = FakeClock(NOW)
    store = memory_store(clock)
    store.jobs.upsert_job(JobObservation(job_id=100, user="root", account="acct", partition="gpu", state="RUNNING",
                                         current_nodes=1, min_nodes=1, max_nodes=4))
    return store, clock


def _failed(store: SqlStore, reason: str, ext: int) -> None:
    cycle = store.decisions.begin_cycle()
    store.decisions.record_decisions(cycle, [NewDecision(job_id=100, action="hold", reason=reason, message="x",
                                                         inputs={"extension_job": ext}, current_nodes=1,
                                                         target_nodes=1)])


def test_a_cancelled_extension_that_ends_completed_after_a_failed_prewarm_counts() -> None:
    store, clock = _store()
    store.jobs.record_extension(job_id=501, parent_job_id=100, node_count=1, state="RUNNING", nodelist="n5")
    clock.advance(20)
    store.jobs.update_extension(501, state="COMPLETED", ended=True)  # the launcher exits 0 once cancelled
    now = NOW + timedelta(seconds=30)
    # Slurm's word alone: an end "by us", no back-off (what looped on the live cluster)
    assert grow_backoff(extension_ends(store, now), now) is None
    _failed(store, "PREWARM_FAILED", 501)
    (end,) = extension_ends(store, now)
    assert (end.job_id, end.state, end.failure) == (501, "COMPLETED", "PREWARM_FAILED")
    b = unit_backoff(store, 100, now)
    assert b is not None and b.wait_s == 60.0 and b.left_s == 60.0 - 10.0  # from the record (at +20 s)
    assert unit_backoff(store, 100, now + timedelta(seconds=51)) is None  # one attempt per back-off period


def test_a_failed_resume_ended_node_fail_by_slurm_counts_and_doubles_the_wait() -> None:
    store, clock = _store()
    store.jobs.record_extension(job_id=501, parent_job_id=100, node_count=1, state="CONFIGURING", nodelist="n5")
    store.jobs.update_extension(501, state="COMPLETED", ended=True)
    _failed(store, "PREWARM_FAILED", 501)
    clock.advance(100)
    store.jobs.record_extension(job_id=502, parent_job_id=100, node_count=1, state="CONFIGURING", nodelist="n6")
    store.jobs.update_extension(502, state="NODE_FAIL", ended=True)  # a Slurm loss: would not count by itself
    _failed(store, "RESUME_FAILED", 502)
    now = clock()
    b = unit_backoff(store, 100, now)
    assert b is not None and [e.failure for e in b.failures] == ["RESUME_FAILED", "PREWARM_FAILED"]
    assert b.wait_s == 120.0 and b.left_s == 120.0


def test_an_extension_sbatch_slurm_refused_counts() -> None:
    store, clock = _store()
    action = store.journal.record_intent(job_id=100, kind=ActionKind.GROW, idempotency_key="grow:100:1", gpus=4)
    store.journal.mark_in_progress(action)
    store.journal.mark_failed(action, "sbatch: error: Requested node configuration is not available",
                              transient=False)
    b = unit_backoff(store, 100, clock())
    assert b is not None and b.failures[0].failure == "GROW_REFUSED" and b.wait_s == 60.0
    # a transient failure that is tried again is no failed grow (yet)
    other = store.journal.record_intent(job_id=100, kind=ActionKind.GROW, idempotency_key="grow:100:2")
    store.journal.mark_in_progress(other)
    store.journal.mark_failed(other, "Unable to contact slurm controller", transient=True)
    assert len(extension_ends(store, clock())) == 1


def test_the_held_grow_names_the_failure_and_when_it_ends() -> None:
    from slurm_elastic.policy.model import Decision, PolicyInput
    from slurm_elastic.policy.reasons import Action, Basis, Reason

    end = ExtensionEnd(100, 501, "COMPLETED", NOW - timedelta(seconds=40), NOW - timedelta(seconds=15),
                       failure="PREWARM_FAILED")
    grow = Decision(unit_id=100, display_id="100", action=Action.GROW, current_nodes=1, target_nodes=2,
                    reason=Reason.OVERUTILIZED, message="util 95%", basis=Basis.UTILIZATION, priority=0)
    inp = PolicyInput(snapshot=snapshot([job(100, nodes=("n1",))], [node("n1")]), units=(),
                      extension_ends=(end,))
    (held,) = hold_blocked([grow], inp, NOW)
    assert (held.action, held.reason) == (Action.HOLD, Reason.GROW_BACKOFF)
    assert "1 failed grow(s) in the last 60 min (last: extension job 501: PREWARM_FAILED)" in held.message
    assert "next grow in 45s, at " in held.message
    assert held.inputs["backoff_until"] == (NOW + timedelta(seconds=45)).isoformat()
    assert held.inputs["last_failure"] == "PREWARM_FAILED"


def test_the_prewarm_failure_record_says_what_failed_and_when_grows_resume(tmp_path: Path) -> None:
    store, clock = _store()
    leader = replace(job(100, nodes=("n1",), user="root"), working_dir=str(tmp_path))
    u = unit(leader, prewarm="stage", prewarm_timeout_s=60)
    store.jobs.record_extension(job_id=501, parent_job_id=100, node_count=1, state="RUNNING", nodelist="n5")
    (tmp_path / ".slurm-elastic").mkdir()
    t = NOW.timestamp()
    (tmp_path / ".slurm-elastic" / "prewarm-100.jsonl").write_text(
        f'{{"job": 501, "node": "n5", "event": "launch", "time": {t + 1}}}\n'
        f'{{"job": 501, "node": "n5", "event": "failed", "time": {t + 3}, "rc": 2, '
        f'"error": "exited with status 2"}}\n')
    assert Event  # the file's lines are prewarm.Event records (slurm_elastic/prewarm.py)
    ext = replace(job(501, nodes=("n5",)), node_count=1)
    snap = snapshot([leader, ext], [node("n1", used=4), node("n5", used=4)])
    clock.advance(0.03)  # the store writes a little after the cycle's clock read "now"
    (v,) = ColdStarts(store, PowerTracker()).decide({100: u}, snap, NOW)
    d = v.decision
    store.decisions.record_decisions(store.decisions.begin_cycle(), [d])  # the cycle's write step
    assert v.cancel is not None and v.cancel.extension_job == 501 and d.reason == "PREWARM_FAILED"
    assert "prewarm on n5 exited with status 2; extension job cancelled" in d.message
    assert "--prewarm-timeout" not in d.message  # no timeout text for a failure that was no timeout
    until = (NOW + timedelta(seconds=60)).isoformat()
    assert d.inputs["grow_backoff_until"] == until and d.inputs["ended_by"] == "controller"
    assert f"its grows back off until {until[:19]}Z" in d.message
    # the policy's back-off (read back from the record) ends exactly when the record says
    b = unit_backoff(store, 100, NOW + timedelta(seconds=1))
    assert b is not None and b.failures[0].ended_at == NOW and b.left_s == 59.0


def test_explain_shows_the_back_off_end() -> None:
    store, clock = _store()
    store.jobs.record_extension(job_id=501, parent_job_id=100, node_count=1, state="RUNNING", nodelist="n5")
    store.jobs.update_extension(501, state="COMPLETED", ended=True)
    _failed(store, "PREWARM_FAILED", 501)
    svc = Service(store, ServiceSettings(), clock=lambda: NOW + timedelta(seconds=10))
    r = svc.handle(ROOT, "explain", {"job": 100})
    assert r["grow_backoff"]["until"] == (NOW + timedelta(seconds=60)).isoformat()
    assert r["grow_backoff"]["last"] == "extension job 501: PREWARM_FAILED"

    from slurm_elastic.cli import decisions_cmd

    runner = CliRunner()
    orig = decisions_cmd.call
    decisions_cmd.call = lambda url, sock, op, args: svc.handle(ROOT, op, args)  # type: ignore[assignment]
    try:
        out = runner.invoke(decisions_cmd.explain_cmd, ["100"]).output
    finally:
        decisions_cmd.call = orig  # type: ignore[assignment]
    line = next(ln for ln in out.splitlines() if ln.startswith("grow_backoff"))
    assert f"until {(NOW + timedelta(seconds=60)).strftime('%Y-%m-%dT%H:%M:%S')}" in line
    assert "1 failed grow(s)" in line and "PREWARM_FAILED" in line
    assert Service(store, ServiceSettings(), clock=lambda: NOW + timedelta(seconds=61)).handle(
        ROOT, "explain", {"job": 100})["grow_backoff"] is None
