"""After a shrink the actuator raises the job's time limit by the plan's extension (extend_time_limit_on_shrink)
and counts it in the store; a later grow gives (some of) it back; the adapter's argument lists; a failure to
extend is recorded and never undoes the shrink. The controller runs the real SlurmCli on replies recorded from the
live test cluster (tests/unit/slurm_replay.py; scenarios in tests/unit/resize_scenarios.py)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from slurm_elastic.slurm.adapter import ResizeRefusedError, SlurmCli
from slurm_elastic.slurm.errors import SlurmCommandError
from slurm_elastic.slurm.model import Job
from slurm_elastic.slurm.runner import CommandResult, RetryPolicy, SlurmCommands
from slurm_elastic.store.records import ActionKind, ActionState
from tests.unit.resize_scenarios import recorded_job, recorded_snapshot
from tests.unit.slurm_replay import (
    REPO,
    Recording,
    Replayed,
    ReplayRunner,
    load_recording,
    play,
    replay,
)
from tests.unit.test_controller_cycle import Agents

# Slurm's refusal of an update, recorded from the test cluster (tests/fixtures/slurm/22.05/recorded/PROVENANCE.md).
REFUSAL = (REPO / "tests/fixtures/slurm/22.05/recorded/update-unknown-job.txt.stderr").read_text().split("\nexit ")[0]


class _Recorder:
    """A command runner that records argv and answers from a script of (returncode, stderr)."""

    def __init__(self, answers: Sequence[tuple[int, str]] = ()) -> None:
        self.argvs: list[list[str]] = []
        self.answers = list(answers)

    def __call__(self, argv: Sequence[str], **kw: object) -> CommandResult:
        self.argvs.append(list(argv))
        rc, err = self.answers.pop(0) if self.answers else (0, "")
        return CommandResult(tuple(argv), rc, "", err)


def _cli(rec: _Recorder) -> SlurmCli:
    return SlurmCli(SlurmCommands(env={}, runner=rec, retry=RetryPolicy(attempts=3, first_delay=0),
                                  sleep=lambda s: None))


def _job(limit: int | None) -> Job:
    """Job 42 on n1, n2 (a job recorded from the test cluster) with time limit ``limit``."""
    return replace(recorded_job(42, ("n1", "n2")), time_limit_min=limit)


def test_adapter_sets_the_absolute_new_limit_and_retries_transient_errors() -> None:
    rec = _Recorder()
    assert _cli(rec).extend_time_limit(_job(60), 30) == 90
    assert rec.argvs == [["scontrol", "update", "JobId=42", "TimeLimit=90"]]
    rec = _Recorder([(1, "slurm_update error: Unable to contact slurm controller (connect failure)"), (0, "")])
    assert _cli(rec).extend_time_limit(_job(60), 5) == 65
    assert rec.argvs == [["scontrol", "update", "JobId=42", "TimeLimit=65"]] * 2  # idempotent: safe to retry


def test_adapter_refuses_unlimited_jobs_and_empty_extensions() -> None:
    rec = _Recorder()
    with pytest.raises(ResizeRefusedError):
        _cli(rec).extend_time_limit(_job(None), 30)
    with pytest.raises(ResizeRefusedError):
        _cli(rec).extend_time_limit(_job(60), 0)
    assert rec.argvs == []


def test_adapter_shortens_to_an_absolute_limit_and_never_to_nothing() -> None:
    rec = _Recorder()
    assert _cli(rec).shorten_time_limit(_job(870), 269) == 601
    assert rec.argvs == [["scontrol", "update", "JobId=42", "TimeLimit=601"]]
    for limit, sub in ((None, 5), (60, 0), (60, 60)):
        with pytest.raises(ResizeRefusedError):
            _cli(rec).shorten_time_limit(_job(limit), sub)
    assert len(rec.argvs) == 1


def test_adapter_types_slurms_refusal() -> None:
    rec = _Recorder([(1, "slurm_update error: Access/permission denied")])
    with pytest.raises(SlurmCommandError):
        _cli(rec).extend_time_limit(_job(60), 5)
    assert len(rec.argvs) == 1  # not transient: no retry


def _limit_updates(r: Replayed) -> list[list[str]]:
    return [c for c in r.runner.calls if c[:2] == ["scontrol", "update"] and c[-1].startswith("TimeLimit=")]


def _recorded_job(r: Replayed, name: str) -> Job:
    """The job as the recording's first squeue reply had it (alice's, 30 min, started just before the clock)."""
    snap = recorded_snapshot(r.rec.name)
    (job,) = [j for j in snap.jobs if j.job_id == r.rec.jobs[name]]
    return job


class _Refusing(ReplayRunner):
    """The recording, but Slurm refuses its ``nth`` (1-based) TimeLimit update with a reply recorded from the test
    cluster (scontrol update of a job it does not know): the command is still checked against the recording."""

    def __init__(self, rec: Recording, nth: int) -> None:
        super().__init__(rec)
        self.nth, self.seen = nth, 0

    def __call__(self, argv: Sequence[str], **kw: Any) -> CommandResult:
        result = super().__call__(argv, **kw)
        if list(argv[:2]) == ["scontrol", "update"] and argv[-1].startswith("TimeLimit="):
            self.seen += 1
            if self.seen == self.nth:
                return CommandResult(tuple(argv), 1, "", REFUSAL)
        return result


def _replay_refusing(name: str, nth: int) -> Replayed:
    """:func:`replay` with :class:`_Refusing` (a failed update changes nothing else the controller asks)."""
    rec = load_recording(name)
    return play(name, rec, _Refusing(rec, nth), Agents)


def _extension_min(r: Replayed) -> int:
    """What the shrink 3 -> 2 adds: the remaining time at the decision x (3/2 - 1), rounded up to minutes."""
    job = _recorded_job(r, "idle")
    (action,) = [a for a in r.store.journal.list_actions(job_id=job.job_id) if a.kind == ActionKind.SHRINK]
    assert job.start_time is not None and job.time_limit_min == 30
    remaining_s = job.time_limit_min * 60 - (action.created_at - job.start_time).total_seconds()
    return math.ceil(remaining_s * (3 / 2 - 1) / 60)


@functools.cache
def _shrunk_then_grown() -> Replayed:
    """One replay for the tests that only read it (a replay takes a few seconds of a loaded CI core)."""
    return replay("shrink_then_grow", Agents)


def test_shrink_then_the_time_limit_grows_by_the_plans_extension() -> None:
    r = _shrunk_then_grown()
    idle = r.rec.jobs["idle"]
    (action,) = [a for a in r.store.journal.list_actions(job_id=idle) if a.kind == ActionKind.SHRINK]
    assert action.state == ActionState.APPLIED
    add_min = _extension_min(r)
    assert add_min == 15 and int(action.params["time_limit_add_s"]) == add_min * 60
    writes = [c for c in r.runner.calls if c[:2] == ["scontrol", "update"]]
    assert writes[:2] == [["scontrol", "update", f"JobId={idle}", "NodeList=n[1-2]"],  # the nodes go first
                          ["scontrol", "update", f"JobId={idle}", f"TimeLimit={30 + add_min}"]]
    assert f"time limit 30 -> {30 + add_min} min (+{add_min}min)" in (action.message or "")
    (decision,) = [d for d in r.store.decisions.list_decisions() if d.action == "shrink"]
    assert decision.inputs["time_limit_add_s"] == add_min * 60 and f"time limit +{add_min}min" in decision.message


def test_a_later_grow_gives_back_what_the_shrink_added() -> None:
    """Shrunk 3 -> 2 with +15 min, then busy again: the grow 2 -> 3 takes remaining x (1 - 2/3) off the limit
    (at most the 15 added), counts it as given back, and the extension job's --time is the leader's new
    remaining time."""
    r = _shrunk_then_grown()
    idle = r.rec.jobs["idle"]
    (grow,) = [a for a in r.store.journal.list_actions(job_id=idle) if a.kind == ActionKind.GROW]
    assert grow.state == ActionState.APPLIED
    extend, shorten = _limit_updates(r)
    assert extend[-1] == "TimeLimit=45"
    limit = int(shorten[-1].removeprefix("TimeLimit="))
    sub = 45 - limit
    job = _recorded_job(r, "idle")
    assert job.start_time is not None
    remaining_s = 45 * 60 - (grow.created_at - job.start_time).total_seconds()
    assert sub == min(15, int(remaining_s / 3 // 60)) and 0 < sub <= 15  # whole minutes, capped at the 15 added
    (submit,) = r.runner.ran("runuser")
    calls = r.runner.calls
    assert calls.index(shorten) > calls.index(submit)  # after the extension is submitted
    rec = r.store.jobs.get_job(idle)
    assert rec is not None and rec.time_limit_added_min == 15 - sub
    assert f"time limit 45 -> {limit} min (-{sub}min)" in (grow.message or "")
    assert grow.params["time_limit_sub_s"] == sub * 60
    args = dict(a.split("=", 1) for a in submit if a.startswith("--") and "=" in a)
    left_min = limit - (grow.created_at - job.start_time).total_seconds() / 60
    assert abs(int(args["--time"]) - left_min) <= 1  # the extension never outlives the leader


def test_a_failed_give_back_keeps_the_grow_and_the_count() -> None:
    r = _replay_refusing("shrink_then_grow", nth=2)
    idle = r.rec.jobs["idle"]
    (grow,) = [a for a in r.store.journal.list_actions(job_id=idle) if a.kind == ActionKind.GROW]
    assert grow.state == ActionState.APPLIED and len(_limit_updates(r)) == 2
    assert "time limit give-back of -" in (grow.message or "") and "failed" in (grow.message or "")
    rec = r.store.jobs.get_job(idle)
    assert rec is not None and rec.time_limit_added_min == 15


def test_a_failed_extension_is_recorded_and_the_shrink_stands() -> None:
    r = _replay_refusing("shrink_with_grace", nth=1)
    idle = r.rec.jobs["idle"]
    (action,) = [a for a in r.store.journal.list_actions(job_id=idle) if a.kind == ActionKind.SHRINK]
    assert action.state == ActionState.APPLIED and _limit_updates(r) == [
        ["scontrol", "update", f"JobId={idle}", "TimeLimit=45"]]
    assert f"time limit extension by +15min failed: {REFUSAL.strip()}" in (action.message or "")
    rec = r.store.jobs.get_job(idle)
    assert rec is not None and rec.current_nodes == 2 and rec.time_limit_added_min == 0  # nothing to give back


def test_switched_off_no_extension() -> None:
    r = replay("shrink_keep_time_limit", Agents)
    idle = r.rec.jobs["idle"]
    (action,) = [a for a in r.store.journal.list_actions(job_id=idle) if a.kind == ActionKind.SHRINK]
    assert action.state == ActionState.APPLIED and action.params["time_limit_add_s"] == 0
    assert _limit_updates(r) == [] and ["scontrol", "update", f"JobId={idle}", "NodeList=n[1-2]"] in r.runner.calls


def test_the_recorded_job_is_the_one_the_arithmetic_assumes() -> None:
    job = recorded_job(42, ("n1", "n2"))
    assert (job.job_id, job.nodes, job.node_count, job.time_limit_min, job.user) == (42, ("n1", "n2"), 2, 30,
                                                                                       "alice")
