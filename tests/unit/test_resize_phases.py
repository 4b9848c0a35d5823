"""A resize's phases from a torchrun template's recorded output (tests/cluster/resize_phases.py, which
bench/resize_phases.py and the resize-phases cluster test use)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.resize_phases import Resize, events, medians, phases, table

RECORDED = (Path(__file__).resolve().parents[1] / "fixtures" / "resize" / "torchrun-shrink-grow.out").read_text()
SHRINK_NOTICE, SHRINK_ACK = 1796475166.505, 1796475166.651
GROW_NOTICE, GROW_ACK = 1796475188.563, 1796475188.804


def test_events_of_a_recorded_shrink_and_grow() -> None:
    ev = events(RECORDED)
    assert ev.checkpoints == ((SHRINK_NOTICE, SHRINK_ACK), (GROW_NOTICE, GROW_ACK))
    assert len(ev.leaves) == 1 and SHRINK_NOTICE < ev.leaves[0] < GROW_NOTICE
    assert [w for w, _ in ev.completes] == [2, 2, 1, 2, 2]  # the start (two agents), the shrink, the grow
    assert [w for w, _ in ev.first_steps] == [2, 1, 2]


def test_phases_of_each_resize_in_order() -> None:
    ev = events(RECORDED)
    # Decided at its notice's time (the journal's intent is not in the output file).
    shrink = phases(Resize("shrink", SHRINK_NOTICE, 1), ev, until=GROW_NOTICE)
    grow = phases(Resize("grow", GROW_NOTICE, 2), ev)
    assert shrink.missing() == [] and grow.missing() == []
    assert shrink.phases["notice"] == 0 and shrink.phases["checkpoint"] == pytest.approx(SHRINK_ACK - SHRINK_NOTICE)
    for r in (shrink, grow):
        order = [r.phases[p] for p in ("notice", "checkpoint", "reform", "first_step")]
        assert order == sorted(order), r.phases
    # The extension's agent asked to join after the checkpoint; the round closed at once when it did (the leader's
    # agent was already waiting in it); a released agent left on the notice, before the acknowledgement.
    assert grow.phases["checkpoint"] < grow.phases["join"] < grow.phases["reform"] < grow.phases["join"] + 1
    assert shrink.phases["leave"] < shrink.phases["checkpoint"] < shrink.phases["reform"]


def test_a_resize_without_its_events_says_which_phases_are_missing() -> None:
    ev = events(RECORDED)
    late = phases(Resize("grow", GROW_ACK + 100, 2), ev)
    assert late.missing() == ["notice", "checkpoint", "join", "reform", "first_step"]
    wrong_world = phases(Resize("shrink", SHRINK_NOTICE, 3), ev, until=GROW_NOTICE)
    assert wrong_world.missing() == ["reform", "first_step"]


def test_medians_and_table() -> None:
    rs = [Resize("shrink", 0, 1, {"notice": 0.1, "first_step": 4.0}),
          Resize("shrink", 0, 1, {"notice": 0.3, "first_step": 6.0}),
          Resize("grow", 0, 2, {"join": 1.0})]
    assert medians(rs) == {"grow": {"join": 1.0}, "shrink": {"notice": 0.2, "first_step": 5.0}}
    text = table(rs)
    assert "median shrink" in text and "5.00" in text and text.count("\n") == 5
