"""Shrink plans: extension jobs first (newest first), then leader nodes, never the batch host, never below min."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_elastic.policy import Action, Decision, ElasticUnit, ExtensionShrink, Reason, decide
from tests.unit.policy_builders import NOW, cfg, ext, job, make_input, nodes, unit, util


def _shrink(u: ElasticUnit, mean: float = 5, **cfg_values: Any) -> Decision:
    busy = [*u.job.nodes, *(n for e in u.extensions for n in e.nodes)]
    inp = make_input([u], nodes(8, busy=busy), utils=[util(u.unit_id, mean)])
    (d,) = decide(inp, cfg(**cfg_values), NOW)
    return d


@pytest.mark.parametrize(
    ("step", "cancel", "partial", "leader_keep", "released"),
    [
        # newest extension (501, started 600 s ago) goes first, from its last node
        (1, (), ExtensionShrink(501, ("n4",)), None, ("n5",)),
        (2, (501,), None, None, ("n5", "n4")),
        (3, (501,), ExtensionShrink(500, ("n3",)), None, ("n5", "n4", "n6")),
        (4, (501, 500), None, None, ("n5", "n4", "n6", "n3")),
        # then the leader's nodes from the last one; the batch host n1 always stays
        (5, (501, 500), None, ("n1",), ("n5", "n4", "n6", "n3", "n2")),
    ],
)
def test_shrink_order(
    step: int,
    cancel: tuple[int, ...],
    partial: ExtensionShrink | None,
    leader_keep: tuple[str, ...] | None,
    released: tuple[str, ...],
) -> None:
    u = unit(
        job(100, nodes=("n1", "n2")),
        exts=[ext(500, ("n3", "n6"), started_ago=1200), ext(501, ("n4", "n5"), started_ago=600)],
        max_nodes=8,
        step=step,
    )
    d = _shrink(u)
    assert (d.action, d.reason) == (Action.SHRINK, Reason.UNDERUTILIZED)
    assert d.current_nodes == 6 and d.target_nodes == 6 - step
    assert d.shrink is not None
    assert d.shrink.cancel_extensions == cancel
    assert d.shrink.shrink_extension == partial
    assert d.shrink.leader_keep_nodes == leader_keep
    assert d.shrink.released_nodes == released


def test_never_below_min_and_batch_host_kept() -> None:
    u = unit(job(100, nodes=("n1", "n2", "n3"), batch_host="n2"), min_nodes=2, step=5)
    d = _shrink(u)
    assert d.target_nodes == 2
    assert d.shrink is not None and d.shrink.leader_keep_nodes == ("n1", "n2")
    assert d.shrink.released_nodes == ("n3",)


def test_pending_extensions_are_cancelled_with_any_shrink() -> None:
    u = unit(job(100, nodes=("n1", "n2")), exts=[ext(700, (), state="PENDING", count=1, started_ago=900)])
    d = _shrink(u)
    assert d.shrink is not None and d.shrink.cancel_extensions == (700,)
    assert d.target_nodes == 1 and d.shrink.leader_keep_nodes == ("n1",)


def test_het_component_without_batch_host_keeps_its_first_node() -> None:
    comp = job(101, nodes=("n5", "n6"), batch_host="n1", het_job_id=100, het_job_offset=1)
    u = unit(comp)
    d = _shrink(u)
    assert d.display_id == "100+1"
    assert d.shrink is not None and d.shrink.leader_keep_nodes == ("n5",)


def test_grace_and_signal_come_with_the_shrink() -> None:
    d = _shrink(unit(job(100, nodes=("n1", "n2")), grace_s=30, signal="USR2"))
    assert (d.grace_s, d.signal) == (30, "USR2")
    d = _shrink(unit(job(100, nodes=("n1", "n2"))), grace_s=200)
    assert (d.grace_s, d.signal) == (200, "USR1")


def test_holds_carry_no_grace() -> None:
    d = _shrink(unit(job(100, nodes=("n1", "n2"))), mean=60)
    assert d.action is Action.HOLD and d.grace_s == 0 and d.signal is None and d.shrink is None


def test_to_dict_is_plain_data() -> None:
    d = _shrink(unit(job(100, nodes=("n1", "n2"))))
    out = d.to_dict()
    assert out["action"] == "shrink" and out["reason"] == "UNDERUTILIZED" and out["basis"] == "utilization"
    assert out["shrink"]["released_nodes"] == ["n2"]
    assert out["inputs"]["mean_util"] == 5
