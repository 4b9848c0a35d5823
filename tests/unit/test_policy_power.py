"""power_resume: powered-down nodes (Slurm power saving) as capacity with a resume cost, used only after
powered-on free nodes, never while powering down, not again soon after a failed resume."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from slurm_elastic.policy import Action, Decision, PowerState, Reason, decide
from slurm_elastic.slurm.model import Job, Node
from tests.unit.policy_builders import NOW, ago, cfg, job, make_input, node, pending, unit, util


def off(name: str, *flags: str) -> Node:
    """A node Slurm's power saving switched off (sinfo: idle~), with extra flags."""
    return node(name, flags=("CLOUD", "POWERED_DOWN", *flags))


def _decide(all_nodes: list[Node], *, power: PowerState | None = None, time_limit_min: int | None = None,
            restart: float | None = None, pending_jobs: tuple[Job, ...] = (), **cfg_values: Any) -> Decision:
    u = unit(job(100, nodes=("n1",), time_limit_min=time_limit_min, started_ago=600), max_nodes=4)
    inp = make_input([u], [node("n1", used=4), *all_nodes], pending_jobs=pending_jobs,
                     utils=[util(100, 95, restart=restart)])
    if power is not None:
        inp = replace(inp, power=power)
    return {d.unit_id: d for d in decide(inp, cfg(**cfg_values), NOW)}[100]


def test_grows_onto_a_powered_down_node_and_names_it_for_slurm_to_resume() -> None:
    d = _decide([off("n5")])
    assert (d.action, d.reason, d.target_nodes) == (Action.GROW, Reason.OVERUTILIZED, 2)
    assert d.grow is not None and d.grow.nodes == ("n5",) and d.grow.resume_nodes == ("n5",)
    assert d.grow.to_dict()["resume_nodes"] == ["n5"]
    assert "powered-down node(s) for Slurm to resume: n5" in d.message
    assert d.inputs["resume_s.source"] == "default" and d.inputs["resume_s"] == 120


def test_powered_on_free_nodes_come_first_and_are_never_mixed_with_a_resume() -> None:
    d = _decide([off("n2"), node("n3")], step=2)
    assert d.grow is not None and d.grow.nodes == ("n3",) and d.grow.resume_nodes == ()
    assert "resume_nodes" not in d.grow.to_dict()


@pytest.mark.parametrize("flags", [("POWERING_DOWN",), ("POWER_DOWN",), ("POWERING_UP",), ("DRAIN",),
                                   ("NOT_RESPONDING",)])
def test_never_onto_a_node_powering_down_up_or_drained(flags: tuple[str, ...]) -> None:
    d = _decide([off("n5", *flags)])
    assert (d.action, d.reason) == (Action.HOLD, Reason.NO_FREE_NODES)


def test_a_down_powered_node_is_not_capacity() -> None:
    d = _decide([replace(off("n5"), state="DOWN")])
    assert d.reason is Reason.NO_FREE_NODES


def test_switched_off_by_config() -> None:
    assert _decide([off("n5")], power_resume=False).reason is Reason.NO_FREE_NODES


def test_resume_must_pay_for_boot_plus_restart() -> None:
    # 15 min limit, 10 min run: gain = (300 - 120 - 60) * efficiency 1 * 1/1 = 120 s <= 180 s of cost -> hold
    d = _decide([off("n5")], time_limit_min=15, restart=60, min_remaining_for_grow_s=0)
    assert (d.action, d.reason) == (Action.HOLD, Reason.POWER_RESUME_COST), d.message
    assert d.inputs["resume_restart_cost_s"] == 60
    # a measured resume of 10 s makes it pay: (300 - 70) > 70
    fast = PowerState(resume_s={"n5": 10.0})
    d = _decide([off("n5")], power=fast, time_limit_min=15, restart=60, min_remaining_for_grow_s=0)
    assert d.action is Action.GROW and d.inputs["resume_s.source"] == "measured"


def test_resume_timeout_bounds_the_estimate() -> None:
    d = _decide([off("n5")], power=PowerState(resume_s={"n5": 900.0}, resume_timeout_s=30))
    assert d.inputs["resume_s"] == 30 and d.inputs["resume_s.source"] == "ResumeTimeout"


def test_a_node_whose_resume_failed_is_not_tried_again_for_a_while() -> None:
    failed = PowerState(resume_failed={"n5": ago(60)})
    assert _decide([off("n5")], power=failed).reason is Reason.NO_FREE_NODES
    d = _decide([off("n5"), off("n6")], power=failed)
    assert d.grow is not None and d.grow.nodes == ("n6",)
    old = PowerState(resume_failed={"n5": ago(4000)})
    assert _decide([off("n5")], power=old, power_resume_backoff_s=1800).action is Action.GROW


def test_a_pending_job_of_higher_priority_gets_the_powered_down_node_first() -> None:
    d = _decide([off("n5")], pending_jobs=(pending(200, priority=5000),))
    assert (d.action, d.reason) == (Action.HOLD, Reason.PENDING_HIGHER_PRIORITY)


def test_an_extension_waiting_for_its_nodes_to_boot_counts_as_pending() -> None:
    from tests.unit.policy_builders import ext

    booting = ext(500, ("n5",), state="CONFIGURING", started_ago=None)
    u = unit(job(100, nodes=("n1",), started_ago=600), exts=[booting], max_nodes=4)
    inp = make_input([u], [node("n1", used=4), node("n5", flags=("CLOUD", "POWERING_UP")), off("n6")],
                     utils=[util(100, 95)])
    (d,) = decide(inp, cfg(), NOW)
    assert (d.action, d.reason, d.current_nodes) == (Action.HOLD, Reason.EXTENSION_PENDING, 1), d.message
