"""The real Controller under faults it cannot see coming (docs/reliability.md, rows F4-F5), with the in-memory
Slurm of tests/unit/test_controller_cycle.py and a real SQLite database:

* F4 Slurm refuses an action (the job ended between decision and action, a node is down, "DB index is being
  set"): the outcome is recorded with Slurm's message, only a transient failure is tried again, and the cycle
  carries on for the other jobs.
* F5 DB trouble: a locked SQLite file and a full file system (a 1 MiB tmpfs, for real): no action without its
  durably journaled intent, a clear error, recovery once the lock goes or space returns.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from slurm_elastic.controller.config import ControllerConfig
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.slurm.errors import SlurmCommandError, SlurmJobNotFoundError, SlurmTransientError
from slurm_elastic.slurm.model import Job
from slurm_elastic.slurm.runner import subprocess_runner
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import ActionKind, ActionState
from tests.unit.storehelpers import FakeClock, file_store, memory_store
from tests.unit.test_controller_cycle import POLICY, T0, Agents, FakeSlurm, run
from tests.unit.test_store_failures import tiny_fs  # noqa: F401 - the 1 MiB tmpfs fixture


class RefusingSlurm(FakeSlurm):
    """FakeSlurm whose submit/shrink fail with a given Slurm error, per job id."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.refuse_submit: dict[int, SlurmCommandError] = {}
        self.refuse_shrink: dict[int, SlurmCommandError] = {}

    def submit_as(self, user: str, script: str, sbatch_args: Sequence[str],
                  env: Mapping[str, str] | None = None) -> int:
        parent = next(int(a.rsplit("-", 1)[1]) for a in sbatch_args if a.startswith("--job-name=elastic-ext-"))
        if parent in self.refuse_submit:
            self.calls.append(("refused-submit", parent))
            raise self.refuse_submit[parent]
        return super().submit_as(user, script, sbatch_args, env)

    def shrink(self, job: Job, keep_nodes: Sequence[str]) -> None:
        if job.job_id in self.refuse_shrink:
            self.calls.append(("refused-shrink", job.job_id))
            raise self.refuse_shrink[job.job_id]
        super().shrink(job, keep_nodes)


def _controller(store: SqlStore, clock: FakeClock) -> tuple[Controller, RefusingSlurm, Agents]:
    slurm = RefusingSlurm(clock)
    agents = Agents(clock)
    ctl = Controller(ControllerConfig(interval_s=2.0, holder="test"), POLICY, slurm=slurm,
                     store=store, collector=agents, clock=clock)
    return ctl, slurm, agents


def _busy(slurm: FakeSlurm, agents: Agents, job_id: int, nodes: list[str], util: float = 95.0) -> None:
    slurm.add_job(job_id, nodes)
    for n in nodes:
        agents.util[(n, job_id)] = util


# --- F4: Slurm refuses ----------------------------------------------------------------------------------------------
def test_grow_refused_for_good_is_recorded_with_slurms_message_and_others_carry_on() -> None:
    clock = FakeClock(T0)
    store = memory_store(clock)
    ctl, slurm, agents = _controller(store, clock)
    _busy(slurm, agents, 10, ["n1"])
    _busy(slurm, agents, 11, ["n3"])
    msg = "sbatch: error: Batch job submission failed: Requested node configuration is not available"
    slurm.refuse_submit[10] = SlurmCommandError(["sbatch"], 1, msg)
    run(ctl, clock, 8)
    (failed, *_) = [a for a in store.journal.list_actions(job_id=10) if a.kind == ActionKind.GROW]
    assert failed.state == ActionState.FAILED and "Requested node configuration is not available" in failed.message
    assert [a.state for a in store.journal.list_actions(job_id=11)] == [ActionState.APPLIED]  # the other job grew
    assert [c for c in slurm.calls if c[0] == "refused-submit"].count(("refused-submit", 10)) == len(
        [a for a in store.journal.list_actions(job_id=10) if a.kind == ActionKind.GROW])  # one try per intent


def test_grow_refused_transiently_is_not_duplicated_and_resolves() -> None:
    clock = FakeClock(T0)
    store = memory_store(clock)
    ctl, slurm, agents = _controller(store, clock)
    _busy(slurm, agents, 10, ["n1"])
    slurm.refuse_submit[10] = SlurmTransientError(["sbatch"], 1, "sbatch: error: DB index is being set, retry")
    run(ctl, clock, 8)
    first = [a for a in store.journal.list_actions(job_id=10) if a.kind == ActionKind.GROW][0]
    assert "DB index is being set" in (first.message or "")
    del slurm.refuse_submit[10]  # Slurm is fine again
    for _ in range(12):
        ctl.reconcile()
        run(ctl, clock, 1)
    grows = [a for a in store.journal.list_actions(job_id=10) if a.kind == ActionKind.GROW]
    assert all(a.state not in {ActionState.INTENT, ActionState.IN_PROGRESS} for a in grows[:-1])
    assert [a.state for a in grows].count(ActionState.APPLIED) == 1
    assert len([c for c in slurm.calls if c[0] == "submit"]) == 1  # exactly one extension, no duplicate


@pytest.mark.parametrize(("error", "expected"), [
    (SlurmJobNotFoundError(["scontrol"], 1, "slurm_update error: Invalid job id specified"), ActionState.FAILED),
    (SlurmCommandError(["scontrol"], 1, "slurm_update error: Requested node configuration is not available"),
     ActionState.FAILED),
])
def test_shrink_refused_records_slurms_message(error: SlurmCommandError, expected: ActionState) -> None:
    clock = FakeClock(T0)
    store = memory_store(clock)
    ctl, slurm, agents = _controller(store, clock)
    _busy(slurm, agents, 20, ["n1", "n2", "n3"], util=5.0)
    _busy(slurm, agents, 21, ["n4"])
    slurm.refuse_shrink[20] = error
    run(ctl, clock, 12)
    shrinks = [a for a in store.journal.list_actions(job_id=20) if a.kind == ActionKind.SHRINK]
    assert shrinks and shrinks[0].state == expected and error.message in (shrinks[0].message or "")
    assert slurm.calls.count(("refused-shrink", 20)) == 1  # not retried: not transient
    refused_at = max(a.finished_at or a.created_at for a in shrinks)
    cycle = store.decisions.last_cycle()  # the cycles went on, job 21 decided in each (its holds stored by change)
    assert cycle is not None and cycle.started_at > refused_at and cycle.error is None and cycle.decisions == 2
    assert store.decisions.last_decisions(21, 1)


# --- F5: DB trouble -------------------------------------------------------------------------------------------------
def test_locked_database_no_action_clear_error_then_recovers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(T0)
    store = file_store(tmp_path / "state.db", clock, busy_timeout_ms=50)
    ctl, slurm, agents = _controller(store, clock)
    _busy(slurm, agents, 10, ["n1"])
    run(ctl, clock, 2)
    locker = sqlite3.connect(tmp_path / "state.db", timeout=0.1, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with caplog.at_level(logging.ERROR):
            run(ctl, clock, 10)  # must not raise
            assert ctl.reconcile() == []  # nor the reconcile pass: one error line, retried at the next pass
        assert not any(c[0] == "submit" for c in slurm.calls)
        assert any("reconcile pass stopped" in r.getMessage() for r in caplog.records)
        assert any("lock" in r.getMessage().lower() for r in caplog.records if r.levelno >= logging.ERROR)
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        run(ctl, clock, 8)
    assert len([r for r in caplog.records if "the state DB answers again" in r.getMessage()]) == 1
    grows = [a for a in store.journal.list_actions(job_id=10) if a.kind == ActionKind.GROW]
    assert [a.state for a in grows] == [ActionState.APPLIED]
    assert len([c for c in slurm.calls if c[0] == "submit"]) == 1
    store.close()


def test_full_disk_no_action_without_its_intent_then_recovers(tiny_fs: Path,  # noqa: F811
                                                              caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(T0)
    store = file_store(tiny_fs / "state.db", clock, busy_timeout_ms=50)
    ctl, slurm, agents = _controller(store, clock)
    _busy(slurm, agents, 10, ["n1"])
    run(ctl, clock, 2)
    ballast = tiny_fs / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)  # fill the file system to the last block
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    try:
        with caplog.at_level(logging.ERROR):
            run(ctl, clock, 10)  # must not raise
        submits = [c for c in slurm.calls if c[0] == "submit"]
        journaled = [a for a in store.journal.list_actions(job_id=10) if a.kind == ActionKind.GROW]
        # Anything submitted was journaled first (an intent that did not fit means no submit).
        assert len(submits) <= len(journaled)
        assert any("full" in r.getMessage().lower() or "disk" in r.getMessage().lower()
                   for r in caplog.records if r.levelno >= logging.ERROR) or journaled
    finally:
        ballast.unlink()
    run(ctl, clock, 8)
    grows = [a for a in store.journal.list_actions(job_id=10) if a.kind == ActionKind.GROW]
    assert [a.state for a in grows].count(ActionState.APPLIED) == 1
    assert len([c for c in slurm.calls if c[0] == "submit"]) == 1
    store.close()


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
    was submitted onto it; the extension, pinned there by --nodelist, pended forever and held the job's growth."""
    from dataclasses import replace

    clock = FakeClock(T0)
    store = memory_store(clock)
    ctl, slurm, agents = _controller(store, clock)
    _busy(slurm, agents, 10, ["n1"])
    run(ctl, clock, 8)
    ((_, (_, node)),) = [c for c in slurm.calls if c[0] == "submit"]
    ext_id = slurm.next_id
    slurm.jobs[ext_id] = replace(slurm.jobs[ext_id], state="PENDING", nodes=(), start_time=None)
    slurm.nodes = [replace(n, state_flags=("NOT_RESPONDING",)) if n.name == node else n for n in slurm.nodes]
    done = ctl.reconcile()
    assert ("cancel", ext_id) in slurm.calls
    assert any(f"cancelled extension {ext_id}" in line and node in line for line in done)
    (rec,) = [e for e in store.jobs.extensions(10, active_only=False) if e.job_id == ext_id]
    assert rec.ended_at is not None and rec.state == "CANCELLED"
    run(ctl, clock, 15)
    later = [c for c in slurm.calls if c[0] == "submit"][1:]
    assert later and all(n != node for _, (_, n) in later)  # grown again, onto a live node


# --- bug 7: a crash between the shrink intent and its grace signal --------------------------------------------
class _Killed(BaseException):
    """Stands for SIGKILL at a fault-hook step (nothing in the controller catches it)."""


def test_shrink_after_a_crash_before_the_grace_signal_never_takes_nodes_unwarned() -> None:
    """Regression (found while arming the crash hook in the F1 crash storm): killed at shrink:after-intent, the
    restarted controller carried out the shrink after the deadline although the job never got its grace signal."""
    from slurm_elastic.controller.actuator import Actuator

    clock = FakeClock(T0)
    store = memory_store(clock)
    slurm = RefusingSlurm(clock)
    agents = Agents(clock)
    _busy(slurm, agents, 20, ["n1", "n2", "n3"], util=5.0)

    def crash(step: str) -> None:
        if step == "shrink:after-intent":
            raise _Killed(step)

    cfg = ControllerConfig(interval_s=2.0, holder="test")
    first = Controller(cfg, POLICY, slurm=slurm, store=store, collector=agents, clock=clock,
                       actuator=Actuator(slurm, store, {}, fault=crash))
    with pytest.raises(_Killed):
        run(first, clock, 12)
    (intent,) = store.journal.open_actions(20)
    assert intent.state == ActionState.INTENT and not any(c[0] == "signal" for c in slurm.calls)
    restarted = Controller(cfg, POLICY, slurm=slurm, store=store, collector=agents,
                           clock=clock)
    run(restarted, clock, 20)
    kinds = [c[0] for c in slurm.calls if c[0] in {"signal", "shrink"}]
    assert "shrink" in kinds  # it did shrink in the end ...
    assert kinds.index("signal") < kinds.index("shrink")  # ... but only after the job was warned
    assert store.journal.get(intent.id).state == ActionState.ABORTED


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
