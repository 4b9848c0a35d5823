"""Decision messages show the numbers that decided: a value is never rounded onto the threshold it was compared
with (``mean util 40% < 40%``), an age is never negative (``last resize -0s ago``) (policy/wording.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_elastic.policy import Action, Reason, decide
from slurm_elastic.policy.model import ActionInProgress
from slurm_elastic.policy.wording import ago, pct, vs
from tests.unit.policy_builders import NOW, cfg, job, make_input, nodes, record, unit, util
from tests.unit.test_policy_rules import one


@pytest.mark.parametrize(("value", "threshold", "digits", "text"), [
    (39.6, 40, 0, "39.6"), (40.4, 40, 0, "40.4"), (80.02, 80, 0, "80.02"), (12, 40, 0, "12"), (39.4, 40, 0, "39"),
    (39.9996, 40, 0, "40.000"),  # at most three decimals
    (40, 40, 0, "40"), (7.25, None, 0, "7"), (-0.2, None, 0, "0"), (-0.2, 0, 0, "-0.2"),
    (0.698, 0.7, 2, "0.698"), (0.695, 0.7, 2, "0.69"), (0.3, 0.7, 2, "0.30"), (0.5, None, 2, "0.50"),
])
def test_vs(value: float, threshold: float | None, digits: int, text: str) -> None:
    assert vs(value, threshold, digits) == text


def test_pct_and_ago() -> None:
    assert pct(39.6, 40) == "39.6%" and pct(95, 80) == "95%"
    assert ago(-0.4) == "0s" and ago(-3, 300) == "0s" and ago(299.6, 300) == "299.6s" and ago(100, 300) == "100s"


def _message(inp_cfg: tuple) -> tuple[Reason, Action, str]:  # type: ignore[type-arg]
    inp, config = inp_cfg
    d = next(d for d in decide(inp, config, NOW) if d.unit_id == 100)
    return d.reason, d.action, d.message


def test_utilization_just_under_the_shrink_threshold_says_so() -> None:
    reason, action, message = _message(one(39.6, leader=("n1", "n2")))
    assert (reason, action) == (Reason.UNDERUTILIZED, Action.SHRINK)
    assert message.startswith("mean util 39.6% < 40% over 600s"), message


def test_utilization_just_over_the_grow_threshold_says_so() -> None:
    reason, action, message = _message(one(80.04))
    assert (reason, action) == (Reason.OVERUTILIZED, Action.GROW)
    assert message.startswith("mean util 80.04% > 80% over 600s"), message


def test_a_resize_journaled_a_moment_after_now_is_not_a_negative_age() -> None:
    """The journal's time of the last resize can be a moment after the cycle's ``now``."""
    inp = make_input([unit(job(100, nodes=("n1", "n2")))], nodes(3, busy=["n1", "n2"]),
                     utils=[util(100, 10)], history=[record(100, -0.3)])
    reason, _, message = _message((inp, cfg()))
    assert reason is Reason.COOLDOWN
    assert "last resize 0s ago < cooldown_s 300s" in message and "-0" not in message, message
    # just under the cooldown: not "300s ago < cooldown_s 300s"
    inp = replace(inp, history=(record(100, 299.6),))
    assert "last resize 299.6s ago < cooldown_s 300s" in _message((inp, cfg()))[2]


def test_an_action_in_progress_since_a_moment_after_now_is_not_a_negative_age() -> None:
    inp, config = one(12, leader=("n1", "n2"))
    inp = replace(inp, in_progress=(ActionInProgress(100, "shrink", NOW.replace(microsecond=400_000)
                                                     if NOW.microsecond < 400_000 else NOW),))
    reason, _, message = _message((inp, config))
    assert reason is Reason.ACTION_IN_PROGRESS and "decided 0s ago" in message and "-0s" not in message, message
