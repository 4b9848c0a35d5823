"""After a shrink the actuator raises the job's time limit by the plan's extension (extend_time_limit_on_shrink)
and counts it in the store; a later grow gives (some of) it back; the adapter's argument lists; a failure to
extend is recorded and never undoes the shrink."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import pytest

from slurm_elastic.controller.config import ControllerConfig
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.policy import parse_config
from slurm_elastic.slurm.adapter import ResizeRefusedError, SlurmCli
from slurm_elastic.slurm.errors import SlurmCommandError
from slurm_elastic.slurm.model import Job
from slurm_elastic.slurm.runner import CommandResult, RetryPolicy, SlurmCommands
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import ActionKind, ActionState
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import POLICY, POLICY_TEXT, T0, Agents, FakeSlurm, run


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
    slurm = FakeSlurm(FakeClock(T0))
    job = slurm.add_job(42, ["n1", "n2"])
    return replace(job, time_limit_min=limit)


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


class _FailingExtend(FakeSlurm):
    def extend_time_limit(self, job: Job, add_min: int) -> int:
        self.calls.append(("refused-extend", (job.job_id, add_min)))
        raise SlurmCommandError(["scontrol"], 1, "slurm_update error: Access/permission denied")


def _shrunk_world(slurm: FakeSlurm, policy_text: str = "") -> tuple[Controller, SqlStore, Agents]:
    clock = slurm.clock
    assert isinstance(clock, FakeClock)
    store = memory_store(clock)
    agents = Agents(clock)
    policy = parse_config(POLICY_TEXT + policy_text) if policy_text else POLICY
    ctl = Controller(ControllerConfig(interval_s=2.0, holder="test"), policy, slurm=slurm,
                     store=store, collector=agents, clock=clock)
    slurm.add_job(20, ["n1", "n2", "n3"])  # time limit 600 min, started an hour ago: 540 min left
    for n in ("n1", "n2", "n3"):
        agents.util[(n, 20)] = 5.0
    run(ctl, clock, 10)  # window filled, shrink decided and signalled, grace over, nodes released
    return ctl, store, agents


def _shrunk(slurm: FakeSlurm, policy_text: str = "") -> tuple[SqlStore, FakeSlurm]:
    _, store, _ = _shrunk_world(slurm, policy_text)
    return store, slurm




def test_shrink_then_the_time_limit_grows_by_the_plans_extension() -> None:
    store, slurm = _shrunk(FakeSlurm(FakeClock(T0)))
    (action,) = [a for a in store.journal.list_actions(job_id=20) if a.kind == ActionKind.SHRINK]
    assert action.state == ActionState.APPLIED
    add_s = int(action.params["time_limit_add_s"])
    # decided ~14 s after T0 (window filled): a bit under 540 min left, x (3/2 - 1), rounded up to minutes
    assert add_s == 270 * 60
    names = [c[0] for c in slurm.calls]
    assert names.index("extend") > names.index("shrink")  # after the nodes are gone
    assert ("extend", (20, 270)) in slurm.calls
    assert slurm.jobs[20].time_limit_min == 600 + 270 and slurm.jobs[20].node_count == 2
    assert "time limit 600 -> 870 min (+270min)" in (action.message or "")
    (decision,) = [d for d in store.decisions.list_decisions() if d.action == "shrink"]
    assert decision.inputs["time_limit_add_s"] == add_s and "time limit +270min" in decision.message


def test_a_later_grow_gives_back_what_the_shrink_added() -> None:
    """Shrunk 3 -> 2 with +270 min, then busy again: the grow 2 -> 3 takes remaining x (1 - 2/3) off the limit
    (about 269 min, at most the 270 added), counts it as given back, and the extension job's --time is the
    leader's new remaining time."""
    slurm = FakeSlurm(FakeClock(T0))
    ctl, store, agents = _shrunk_world(slurm)
    rec = store.jobs.get_job(20)
    assert rec is not None and rec.time_limit_added_min == 270 and slurm.jobs[20].time_limit_min == 870
    for n in slurm.jobs[20].nodes:
        agents.util[(n, 20)] = 95.0
    clock = slurm.clock
    assert isinstance(clock, FakeClock)
    run(ctl, clock, 15)  # past the 20 s cooldown and a fresh window
    (grow,) = [a for a in store.journal.list_actions(job_id=20) if a.kind == ActionKind.GROW]
    assert grow.state == ActionState.APPLIED
    (shorten,) = [c for c in slurm.calls if c[0] == "shorten"]
    sub = shorten[1][1]
    assert 265 <= sub <= 270  # ~48,500 s left x 1/3, in whole minutes, capped at the 270 added
    names = [c[0] for c in slurm.calls]
    assert names.index("shorten") > names.index("submit")  # after the extension is submitted
    assert slurm.jobs[20].time_limit_min == 870 - sub
    rec = store.jobs.get_job(20)
    assert rec is not None and rec.time_limit_added_min == 270 - sub
    assert f"time limit 870 -> {870 - sub} min (-{sub}min)" in (grow.message or "")
    assert grow.params["time_limit_sub_s"] == sub * 60
    left_min = (870 - sub) - (clock() - slurm.jobs[20].start_time).total_seconds() / 60  # type: ignore[operator]
    assert abs(int(slurm.sbatch_args[-1]["--time"]) - left_min) <= 1  # the extension never outlives the leader


class _FailingShorten(FakeSlurm):
    def shorten_time_limit(self, job: Job, sub_min: int) -> int:
        self.calls.append(("refused-shorten", (job.job_id, sub_min)))
        raise SlurmCommandError(["scontrol"], 1, "slurm_update error: Access/permission denied")


def test_a_failed_give_back_keeps_the_grow_and_the_count() -> None:
    slurm = _FailingShorten(FakeClock(T0))
    ctl, store, agents = _shrunk_world(slurm)
    for n in slurm.jobs[20].nodes:
        agents.util[(n, 20)] = 95.0
    clock = slurm.clock
    assert isinstance(clock, FakeClock)
    run(ctl, clock, 15)
    (grow,) = [a for a in store.journal.list_actions(job_id=20) if a.kind == ActionKind.GROW]
    assert grow.state == ActionState.APPLIED and [c for c in slurm.calls if c[0] == "refused-shorten"]
    assert "time limit give-back of -" in (grow.message or "") and "failed" in (grow.message or "")
    rec = store.jobs.get_job(20)
    assert rec is not None and rec.time_limit_added_min == 270 and slurm.jobs[20].time_limit_min == 870


def test_a_failed_extension_is_recorded_and_the_shrink_stands() -> None:
    store, slurm = _shrunk(_FailingExtend(FakeClock(T0)))
    (action,) = [a for a in store.journal.list_actions(job_id=20) if a.kind == ActionKind.SHRINK]
    assert action.state == ActionState.APPLIED and slurm.jobs[20].node_count == 2
    assert ("refused-extend", (20, 270)) in slurm.calls
    assert "time limit extension by +270min failed: slurm_update error: Access/permission denied" in (
        action.message or "")
    assert slurm.jobs[20].time_limit_min == 600
    rec = store.jobs.get_job(20)
    assert rec is not None and rec.time_limit_added_min == 0  # nothing to give back later


def test_switched_off_no_extension() -> None:
    store, slurm = _shrunk(FakeSlurm(FakeClock(T0)), "extend_time_limit_on_shrink = false\n")
    (action,) = [a for a in store.journal.list_actions(job_id=20) if a.kind == ActionKind.SHRINK]
    assert action.state == ActionState.APPLIED and action.params["time_limit_add_s"] == 0
    assert not [c for c in slurm.calls if c[0] == "extend"] and slurm.jobs[20].time_limit_min == 600


def test_clock_is_after_t0() -> None:  # the arithmetic above assumes the job started an hour before T0
    job = FakeSlurm(FakeClock(T0)).add_job(1, ["n1"])
    assert job.start_time == T0 - timedelta(hours=1) and job.time_limit_min == 600
