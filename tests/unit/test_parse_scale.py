"""What keeps the cycle's reads linear: GC paused while a reply is parsed, snapshot lookups by name in O(1)."""

from __future__ import annotations

import gc
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from slurm_elastic.slurm.model import ClusterSnapshot, Node
from slurm_elastic.slurm.openapi import gc_paused


def test_gc_is_paused_inside_and_restored_after_even_on_error() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError("parse failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def node(name: str, state: str = "IDLE") -> Node:
    return Node(name=name, state=state, state_flags=(), partitions=("p",), cpus=8, alloc_cpus=0, gres=(),
                gres_used=())


def test_snapshot_node_lookup_by_name_follows_replace() -> None:
    snap = ClusterSnapshot(datetime(2026, 1, 1, tzinfo=UTC), (), (node("a"), node("b"), node("b", "DOWN")), ())
    assert snap.node("a") == node("a") and snap.node("zz") is None
    assert snap.node("b") == node("b")  # the first of a repeated name, as a scan finds it
    moved = replace(snap, nodes=(node("c", "DOWN"),))
    assert moved.node("a") is None and moved.node("c") == node("c", "DOWN")
