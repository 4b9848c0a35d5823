"""GPUs stranded on partly used nodes (policy/fragmentation.py)."""

from __future__ import annotations

from slurm_elastic.policy.fragmentation import (
    Fragmentation,
    NodeGpus,
    WaitingNeed,
    fragmentation,
    snapshot_fragmentation,
    stranded_free,
)
from tests.unit.policy_builders import job, node, pending, snapshot


def test_idle_and_full_nodes_strand_nothing() -> None:
    got = fragmentation([NodeGpus(4, 4), NodeGpus(4, 0)], [])
    assert got == Fragmentation(0, 0, 0)


def test_partial_nodes_without_waiting_jobs_are_all_stranded() -> None:
    got = fragmentation([NodeGpus(4, 1), NodeGpus(4, 3), NodeGpus(4, 4)], [])
    assert got == Fragmentation(2, 4, 4)


def test_a_waiting_job_that_fits_a_node_frees_it_from_stranded() -> None:
    nodes = [NodeGpus(4, 1), NodeGpus(4, 2), NodeGpus(4, 3)]
    assert fragmentation(nodes, [WaitingNeed(2)]) == Fragmentation(3, 6, 1)
    assert fragmentation(nodes, [WaitingNeed(4), WaitingNeed(3)]) == Fragmentation(3, 6, 3)
    assert fragmentation(nodes, [WaitingNeed(1)]).stranded == 0


def test_jobs_asking_no_gpu_use_no_gpu() -> None:
    assert fragmentation([NodeGpus(4, 2)], [WaitingNeed(0)]).stranded == 2


def test_partitions_must_match() -> None:
    nodes = [NodeGpus(4, 2, frozenset({"a"})), NodeGpus(4, 2, frozenset({"b"}))]
    assert fragmentation(nodes, [WaitingNeed(1, frozenset({"a"}))]).stranded == 2
    assert fragmentation(nodes, [WaitingNeed(1, frozenset({"a", "b"}))]).stranded == 0
    assert fragmentation(nodes, [WaitingNeed(1)]).stranded == 0


def test_simulator_form_agrees_with_the_general_one() -> None:
    free = [4, 3, 2, 1, 0, 2]
    for need in (None, 1, 2, 3, 4):
        general = fragmentation([NodeGpus(4, f) for f in free], [] if need is None else [WaitingNeed(need)])
        assert stranded_free(free, 4, need) == (general.free_on_partial, general.stranded)


def test_snapshot_counts_available_partly_used_nodes_and_pending_jobs() -> None:
    nodes = [
        node("n1", used=2),  # partly used: 2 free
        node("n2", used=3),  # partly used: 1 free
        node("n3", used=4),  # full
        node("n4"),  # idle
        node("n5", used=1, flags=("DRAIN",)),  # not schedulable: left out
        node("n6", used=1, partitions=("other",)),  # 3 free, but nobody waits in "other"
    ]
    running = job(1, nodes=("n1",), gpus=2)
    waiting = pending(2, gpus=2)  # fits n1 only
    got = snapshot_fragmentation(snapshot([running, waiting], nodes))
    assert got == Fragmentation(partial_nodes=3, free_on_partial=6, stranded=4)
    both = pending(3, gpus=1, partition="gpu,other")
    assert snapshot_fragmentation(snapshot([running, waiting, both], nodes)).stranded == 0
    assert got.as_dict() == {"partial_nodes": 3, "free_on_partial": 6, "stranded": 4}
