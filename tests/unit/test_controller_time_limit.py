"""After a shrink the actuator raises the job's time limit by the plan's extension (extend_time_limit_on_shrink);
the adapter's argument list; a failure to extend is recorded and never undoes the shrink."""

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


def test_adapter_types_slurms_refusal() -> None:
    rec = _Recorder([(1, "slurm_update error: Access/permission denied")])
    with pytest.raises(SlurmCommandError):
        _cli(rec).extend_time_limit(_job(60), 5)
    assert len(rec.argvs) == 1  # not transient: no retry


class _FailingExtend(FakeSlurm):
    def extend_time_limit(self, job: Job, add_min: int) -> int:
        self.calls.append(("refused-extend", (job.job_id, add_min)))
        raise SlurmCommandError(["scontrol"], 1, "slurm_update error: Access/permission denied")


def _shrunk(slurm: FakeSlurm, policy_text: str = "") -> tuple[SqlStore, FakeSlurm]:
    clock = slurm.clock
    assert isinstance(clock, FakeClock)
    store = memory_store(clock)
    agents = Agents(clock)
    policy = parse_config(POLICY_TEXT + policy_text) if policy_text else POLICY
    ctl = Controller(ControllerConfig(interval_s=2.0, holder="test"), policy, slurm=slurm,  # type: ignore[arg-type]
                     store=store, collector=agents, clock=clock)
    slurm.add_job(20, ["n1", "n2", "n3"])  # time limit 600 min, started an hour ago: 540 min left
    for n in ("n1", "n2", "n3"):
        agents.util[(n, 20)] = 5.0
    run(ctl, clock, 10)  # window filled, shrink decided and signalled, grace over, nodes released
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


def test_a_failed_extension_is_recorded_and_the_shrink_stands() -> None:
    store, slurm = _shrunk(_FailingExtend(FakeClock(T0)))
    (action,) = [a for a in store.journal.list_actions(job_id=20) if a.kind == ActionKind.SHRINK]
    assert action.state == ActionState.APPLIED and slurm.jobs[20].node_count == 2
    assert ("refused-extend", (20, 270)) in slurm.calls
    assert "time limit extension by +270min failed: slurm_update error: Access/permission denied" in (
        action.message or "")
    assert slurm.jobs[20].time_limit_min == 600


def test_switched_off_no_extension() -> None:
    store, slurm = _shrunk(FakeSlurm(FakeClock(T0)), "extend_time_limit_on_shrink = false\n")
    (action,) = [a for a in store.journal.list_actions(job_id=20) if a.kind == ActionKind.SHRINK]
    assert action.state == ActionState.APPLIED and action.params["time_limit_add_s"] == 0
    assert not [c for c in slurm.calls if c[0] == "extend"] and slurm.jobs[20].time_limit_min == 600


def test_clock_is_after_t0() -> None:  # the arithmetic above assumes the job started an hour before T0
    job = FakeSlurm(FakeClock(T0)).add_job(1, ["n1"])
    assert job.start_time == T0 - timedelta(hours=1) and job.time_limit_min == 600
