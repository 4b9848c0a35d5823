"""The real Controller under faults it cannot see coming (docs/reliability.md, rows F4-F5, bugs 5, 7 and 9), on the
real SlurmCli replaying Slurm replies recorded from the live test cluster, Slurm's refusals and a node that goes
down included (tests/unit/reliability_scenarios.py):

* F4 Slurm refuses an action (the job ended between decision and action, a request the cluster cannot satisfy,
  slurmctld out of reach): the outcome is recorded with Slurm's message, only a transient failure is tried again,
  and the cycle carries on for the other jobs.
* F5 DB trouble: a locked SQLite file and a full file system (a 1 MiB tmpfs, for real): no action without its
  durably journaled intent, a clear error, recovery once the lock goes or space returns.
"""

from __future__ import annotations

import logging
import sys
from datetime import timedelta

import pytest

from slurm_elastic.slurm.runner import subprocess_runner
from slurm_elastic.store.records import ActionKind, ActionState
from tests.unit.reliability_scenarios import refused, release_db_dirs
from tests.unit.slurm_replay import STEP_S, Replayed, replay
from tests.unit.test_controller_cycle import Agents


# --- F4: Slurm refuses ------------------------------------------------------------------------------------------
def _replay(name: str) -> Replayed:
    return replay(name, Agents)


def _submits(r: Replayed) -> list[list[str]]:
    """The extension sbatches the cluster took (a refused one is served as the request that replaced it)."""
    return [c for c in r.runner.ran("runuser") if any(a.startswith("--job-name=elastic-ext-") for a in c)]


def test_grow_refused_for_good_is_recorded_with_slurms_message_and_others_carry_on() -> None:
    r = _replay("grow_refused")
    ok, refused_job = r.rec.jobs["ok"], r.rec.jobs["refused"]
    (failed, *_) = [a for a in r.store.journal.list_actions(job_id=refused_job) if a.kind == ActionKind.GROW]
    assert failed.state == ActionState.FAILED and "Requested node configuration is not available" in failed.message
    assert [a.state for a in r.store.journal.list_actions(job_id=ok)] == [ActionState.APPLIED]  # the other grew
    assert [e.job_id for e in r.store.jobs.extensions(ok)] == [r.rec.jobs["ext"]]
    assert len(refused(r.world)) == len(  # one try per intent
        [a for a in r.store.journal.list_actions(job_id=refused_job) if a.kind == ActionKind.GROW])


def test_grow_refused_transiently_is_not_duplicated_and_resolves(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    r = _replay("grow_refused_transiently")
    busy = r.rec.jobs["busy"]
    grows = sorted((a for a in r.store.journal.list_actions(job_id=busy) if a.kind == ActionKind.GROW),
                   key=lambda a: a.id)
    assert len(refused(r.world)) == 1
    assert "grow failed: sbatch: error: Batch job submission failed: Unable to contact slurm controller" in caplog.text
    assert grows[0].state == ActionState.ABORTED  # reconcile: no extension job carries its key
    assert all(a.state not in {ActionState.INTENT, ActionState.IN_PROGRESS} for a in grows[:-1])
    assert [a.state for a in grows].count(ActionState.APPLIED) == 1
    assert len(_submits(r)) == 1  # exactly one extension, no duplicate


def test_shrink_refused_records_slurms_message() -> None:
    """The job ended between decision and action: Slurm says "Invalid job id specified"; not transient, so the
    shrink fails once, is not tried again, and the cycles go on for the other job."""
    r = _replay("shrink_refused_job_gone")
    idle, busy = r.rec.jobs["idle"], r.rec.jobs["busy"]
    shrinks = [a for a in r.store.journal.list_actions(job_id=idle) if a.kind == ActionKind.SHRINK]
    assert shrinks and shrinks[0].state == ActionState.FAILED
    assert "Invalid job id specified" in (shrinks[0].message or "")
    assert len(refused(r.world)) == 1  # not retried: not transient
    refused_at = max(a.finished_at or a.created_at for a in shrinks)
    cycle = r.store.decisions.last_cycle()  # the cycles went on, the busy job decided in each (holds by change)
    assert cycle is not None and cycle.started_at > refused_at and cycle.error is None and cycle.decisions == 2
    assert r.store.decisions.last_decisions(busy, 1)


# --- F5: DB trouble -------------------------------------------------------------------------------------------------
def test_locked_database_no_action_clear_error_then_recovers(caplog: pytest.LogCaptureFixture) -> None:
    """Replayed (reliability_scenarios.py: db_locked): 10 cycles and a reconcile pass on a locked SQLite file."""
    caplog.set_level(logging.INFO)
    try:
        r = _replay("db_locked")
        store = r.world.ctl.store
        busy = r.rec.jobs["busy"]
        assert r.world.reconciled == [[]]  # one error line, retried at the next pass
        assert any("reconcile pass stopped" in x.getMessage() for x in caplog.records)
        assert any("lock" in x.getMessage().lower() for x in caplog.records if x.levelno >= logging.ERROR)
        assert len([x for x in caplog.records if "the state DB answers again" in x.getMessage()]) == 1
        grows = [a for a in store.journal.list_actions(job_id=busy) if a.kind == ActionKind.GROW]
        assert [a.state for a in grows] == [ActionState.APPLIED]
        (submit,) = r.runner.ran("runuser")  # no submit while locked: the recorded order has it after the lock
        locked_until = r.rec.clock_start + timedelta(seconds=12 * STEP_S)
        assert grows[0].created_at >= locked_until and f"--job-name=elastic-ext-{busy}" in submit
    finally:
        release_db_dirs()


def test_full_disk_no_action_without_its_intent_then_recovers(caplog: pytest.LogCaptureFixture) -> None:
    """Replayed (reliability_scenarios.py: disk_full): 10 cycles with the database's 1 MiB tmpfs full."""
    caplog.set_level(logging.ERROR)
    try:
        r = _replay("disk_full")
        store = r.world.ctl.store
        busy = r.rec.jobs["busy"]
        grows = [a for a in store.journal.list_actions(job_id=busy) if a.kind == ActionKind.GROW]
        assert [a.state for a in grows] == [ActionState.APPLIED]
        assert len(r.runner.ran("runuser")) == 1  # one extension ...
        full_until = r.rec.clock_start + timedelta(seconds=12 * STEP_S)
        assert grows[0].created_at >= full_until  # ... journaled, then submitted, once space was back
        assert any("disk is full" in x.getMessage() for x in caplog.records if x.levelno >= logging.ERROR)
    finally:
        release_db_dirs()


# --- bug 1 (see docs/reliability.md): Slurm output that is not UTF-8 ------------------------------------------------
def test_command_output_that_is_not_utf8_is_read_not_raised() -> None:
    """Regression: any user can name a job with bytes that are not UTF-8; squeue --json passes them through and
    the runner's strict decoding raised UnicodeDecodeError on every snapshot, stopping the controller for all."""
    result = subprocess_runner([sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'{\"n\": \"a\\xffb\"}')"],
                               timeout=30, input_text=None, env=None)
    assert result.returncode == 0 and result.stdout == '{"n": "a\ufffdb"}'


# --- bug 5: an extension pinned to a node that died before it started ------------------------------------------
def test_extension_pending_on_a_dead_node_is_cancelled_and_the_job_grows_elsewhere() -> None:
    """Regression (found by tests/cluster/test_reliability_faults.py F6): a node died right after an extension
    was submitted onto it; the extension, pinned there by --nodelist, pended forever and held the job's growth.
    Replayed: the planned node is set DOWN between the grow's intent and its sbatch on the live cluster."""
    r = _replay("extension_on_dead_node")
    busy = r.rec.jobs["busy"]
    (down,) = [c for c in r.runner.calls if c[:2] == ["scontrol", "update"] and "State=DOWN" in c]
    node = down[2].removeprefix("NodeName=")
    exts = sorted(r.store.jobs.extensions(busy, active_only=False), key=lambda e: e.job_id)
    first = exts[0]
    assert first.nodelist == node and first.ended_at is not None and first.state == "CANCELLED"
    assert ["scancel", str(first.job_id)] in r.runner.calls
    assert any(f"extension job {first.job_id} cancelled" in line and node in line for line in r.world.reconciled[0])
    # journaled like every Slurm write: one applied cancel_extension naming the recovery
    cancel = r.store.journal.find_by_idempotency_key(f"cancel:{first.job_id}")
    assert cancel is not None and (cancel.kind, cancel.state, cancel.job_id) == (
        ActionKind.CANCEL_EXTENSION, ActionState.APPLIED, busy)
    assert cancel.params["reason"] == "PENDING_ON_DEAD_NODE" and cancel.params["nodes"] == [node]
    submits = [dict(a.split("=", 1) for a in c if a.startswith("--") and "=" in a) for c in r.runner.ran("runuser")]
    assert submits[0]["--nodelist"] == node
    later = submits[1:]
    assert later and all(x["--nodelist"] != node for x in later)  # grown again, onto a live node


# --- bug 7: a crash between the shrink intent and its grace signal --------------------------------------------
def test_shrink_after_a_crash_before_the_grace_signal_never_takes_nodes_unwarned() -> None:
    """Regression (found while arming the crash hook in the F1 crash storm): killed at shrink:after-intent, the
    restarted controller carried out the shrink after the deadline although the job never got its grace signal.
    Replayed: the controller is killed at that step, a new one on the same database carries on."""
    r = _replay("shrink_crash_before_signal")
    idle = r.rec.jobs["idle"]
    writes = [c for c in r.runner.calls if c[0] == "scancel" or c[:2] == ["scontrol", "update"]]
    kinds = ["signal" if c[0] == "scancel" else "shrink" for c in writes if c[0] == "scancel" or any(
        a.startswith("NodeList=") for a in c)]
    assert "shrink" in kinds  # it did shrink in the end ...
    assert kinds.index("signal") < kinds.index("shrink")  # ... but only after the job was warned
    first = min((a for a in r.store.journal.list_actions(job_id=idle) if a.kind == ActionKind.SHRINK),
                key=lambda a: a.id)
    assert first.state == ActionState.ABORTED  # the intent the killed controller left


def test_shrink_after_a_crash_between_its_signal_and_its_mark_is_warned_again_before_nodes_go() -> None:
    """Killed after the grace signal but before the in-progress mark: the restarted controller cannot know the
    job was warned, so it aborts that intent and withdraws its notice, and a later shrink warns the job again."""
    r = _replay("shrink_crash_after_signal")
    idle = r.rec.jobs["idle"]
    shrinks = sorted((a for a in r.store.journal.list_actions(job_id=idle) if a.kind == ActionKind.SHRINK),
                     key=lambda a: a.id)
    assert shrinks[0].state == ActionState.ABORTED and "may not have been sent" in shrinks[0].message
    assert shrinks[1].state == ActionState.APPLIED
    writes = [c[0] for c in r.runner.calls if c[0] == "scancel" or (c[:2] == ["scontrol", "update"] and any(
        a.startswith("NodeList=") for a in c))]
    assert writes[:3] == ["scancel", "scancel", "scontrol"]  # signalled by each controller before nodes went


# --- bug 9: the DB's reply to a shrink's in-progress mark lost ----------------------------------------------------
def test_a_shrink_on_record_as_in_progress_was_signalled_even_if_its_controller_never_heard_back() -> None:
    """Regression (found by test_controller_ha.py's DB cut in CI): the holder marked a shrink in progress and then
    sent the grace signal; its link to MariaDB was cut right after the mark reached the server, so it waited on the
    reply and never signalled, and the standby that took over carried out the in-progress shrink: nodes taken from
    a job that was never warned. Replayed: the controller dies as the mark commits, another one carries on."""
    r = _replay("shrink_reply_lost_after_in_progress")
    idle = r.rec.jobs["idle"]
    first = min((a for a in r.store.journal.list_actions(job_id=idle) if a.kind == ActionKind.SHRINK),
                key=lambda a: a.id)
    assert first.state == ActionState.APPLIED  # the second controller carried out the first one's shrink ...
    writes = [c for c in r.runner.calls if c[0] == "scancel" or (c[:2] == ["scontrol", "update"] and any(
        a.startswith("NodeList=") for a in c))]
    kinds = [c[0] for c in writes]
    assert kinds[:2] == ["scancel", "scontrol"]  # ... once, after the job's one grace signal
    assert writes[0][1].startswith("--signal=")


def test_scheduler_overlap_warnings_are_rate_limited_with_a_count() -> None:
    from slurm_elastic.controller.daemon import OverlapSummary

    now = [0.0]
    f = OverlapSummary(every_s=600, clock=lambda: now[0])

    def rec(msg: str) -> logging.LogRecord:
        return logging.LogRecord("apscheduler.scheduler", logging.WARNING, __file__, 1, msg, None, None)

    skipped = 'Execution of job "cycle" skipped: maximum number of running instances reached (1)'
    assert f.filter(rec(skipped))
    for _ in range(99):
        now[0] += 2
        assert not f.filter(rec(skipped))
    assert f.filter(rec("Run time of job was missed"))  # other warnings always pass
    now[0] += 600
    first = rec(skipped)
    assert f.filter(first) and "(99 more since the last such warning)" in first.getMessage()
