"""The holds of the shell's state (policy/holds.py): an action in progress, the grow back-off."""

from __future__ import annotations

from dataclasses import replace

from slurm_elastic.controller.losses import SLURM_LOSS_STATES
from slurm_elastic.policy import Action, Reason, decide
from slurm_elastic.policy.holds import SLURM_LOSS_STATES as POLICY_LOSS_STATES
from slurm_elastic.policy.holds import grow_backoff
from slurm_elastic.policy.model import ActionInProgress, ExtensionEnd
from tests.unit.policy_builders import NOW, ago, cfg, job, make_input, nodes, unit, util


def _end(job_id: int, state: str = "FAILED", *, ended_ago: float = 30, lived_s: float = 20) -> ExtensionEnd:
    return ExtensionEnd(100, job_id, state, ago(ended_ago + lived_s), ago(ended_ago))


def test_the_wait_doubles_per_failure_and_is_capped() -> None:
    one, two = grow_backoff([_end(1)], NOW), grow_backoff([_end(1), _end(2, ended_ago=100)], NOW)
    assert one is not None and one.wait_s == 60 and one.left_s == 30
    assert two is not None and two.wait_s == 120 and two.left_s == 90
    many = [_end(i, ended_ago=10 + i) for i in range(10)]
    got = grow_backoff(many, NOW)
    assert got is not None and got.wait_s == 3600 and got.failures[0].job_id == 0


def test_ends_that_are_no_failure_of_the_job_do_not_count() -> None:
    for state in ("CANCELLED", "COMPLETED", "PREEMPTED", "NODE_FAIL"):
        assert grow_backoff([_end(1, state)], NOW) is None, state
    assert grow_backoff([_end(1, lived_s=700)], NOW) is None  # lived 700 s: not a start-up death
    assert grow_backoff([_end(1, ended_ago=3700)], NOW) is None  # older than the look-back
    assert grow_backoff([_end(1, ended_ago=61)], NOW) is None  # 60 s are over


def test_the_policy_and_the_loss_recorder_agree_on_slurm_losses() -> None:
    assert set(SLURM_LOSS_STATES) == POLICY_LOSS_STATES


def test_holds_come_after_the_cap_and_only_hold_actions() -> None:
    a = unit(job(100, nodes=("n1",), priority=900))
    b = unit(job(200, nodes=("n2",), priority=500))
    inp = make_input([a, b], nodes(6, busy=["n1", "n2"]), utils=[util(100, 95), util(200, 95)])
    inp = replace(inp, in_progress=(ActionInProgress(100, "grow", ago(10)),))
    by_id = {d.unit_id: d for d in decide(inp, cfg(max_actions_per_cycle=1), NOW)}
    # unit 100 took the only action slot; held for its grow in progress, it does not hand the slot to unit 200
    assert (by_id[100].action, by_id[100].reason) == (Action.HOLD, Reason.ACTION_IN_PROGRESS)
    assert by_id[100].inputs["would"] == "OVERUTILIZED" and by_id[100].target_nodes == 1
    assert by_id[200].reason == Reason.ACTION_CAP
    # a hold is never turned into another hold
    idle = replace(make_input([a], nodes(2, busy=["n1"]), utils=[util(100, 60)]),
                   in_progress=(ActionInProgress(100, "shrink", ago(10)),))
    assert decide(idle, cfg(), NOW)[0].reason == Reason.IN_BAND
