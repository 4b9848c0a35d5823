"""Shrink-to-admit: a higher-priority pending job blocked only by elastic surplus gets just enough nodes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from slurm_elastic.policy import (
    Action,
    AdmitBasis,
    Basis,
    Decision,
    ElasticUnit,
    JobUtilization,
    Reason,
    ResizeRecord,
    decide,
)
from slurm_elastic.policy.model import admit_request
from slurm_elastic.slurm.model import Job, Node
from tests.unit.policy_builders import NOW, cfg, ext, job, make_input, node, nodes, pending, record, unit, util


def _run(
    units: list[ElasticUnit],
    all_nodes: list[Node],
    pend: list[Job],
    *,
    utils: list[JobUtilization] | None = None,
    history: list[ResizeRecord] | None = None,
    **cfg_values: Any,
) -> dict[int, Decision]:
    cfg_values.setdefault("shrink_to_admit", True)
    utils = utils if utils is not None else [util(u.unit_id, 60) for u in units]
    inp = make_input(units, all_nodes, pending_jobs=pend, utils=utils, history=history or [])
    return {d.unit_id: d for d in decide(inp, cfg(**cfg_values), NOW)}


def _busy(*names: str) -> list[Node]:
    return [node(n, used=4) for n in names]


def test_just_enough_nodes_are_taken_and_min_is_kept() -> None:
    u = unit(job(100, nodes=("n1", "n2", "n3", "n4"), priority=10), min_nodes=2)
    d = _run([u], _busy("n1", "n2", "n3", "n4"), [pending(900, count=1, priority=100)])[100]
    assert (d.action, d.reason, d.basis) == (Action.SHRINK, Reason.SHRINK_TO_ADMIT, Basis.QUEUE)
    assert d.target_nodes == 3
    assert d.shrink is not None and d.shrink.admits == (900,) and d.shrink.released_nodes == ("n4",)
    assert d.grace_s == 120 and d.signal == "USR1"
    d = _run([u], _busy("n1", "n2", "n3", "n4"), [pending(900, count=2, priority=100)])[100]
    assert d.target_nodes == 2
    d = _run([u], _busy("n1", "n2", "n3", "n4"), [pending(900, count=3, priority=100)])[100]
    assert d.action is Action.HOLD  # would need to go below min: not blocked only by surplus


def test_free_nodes_count_towards_the_pending_job() -> None:
    u = unit(job(100, nodes=("n1", "n2", "n3"), priority=10))
    d = _run([u], [*_busy("n1", "n2", "n3"), node("f1")], [pending(900, count=2, priority=100)])[100]
    assert d.target_nodes == 2 and d.shrink is not None and d.shrink.released_nodes == ("n3",)


def test_a_node_slurm_planned_for_the_pending_job_counts_towards_it_and_no_grow_takes_it() -> None:
    """Measured on 22.05: the idle nodes behind a job that waits on Resources show as IDLE+PLANNED. They count
    toward the pending job's fit (one node freed, not two) and stay out of a busy unit's grow."""
    u = unit(job(100, nodes=("n1", "n2", "n3"), priority=10))
    planned = node("f1", flags=("PLANNED",))
    d = _run([u], [*_busy("n1", "n2", "n3"), planned], [pending(900, count=2, priority=100)])[100]
    assert d.target_nodes == 2 and d.shrink is not None and d.shrink.released_nodes == ("n3",)
    busy = unit(job(200, nodes=("b1",), priority=10), max_nodes=3)
    d = _run([busy], [*_busy("b1"), planned], [], utils=[util(200, 99)])[200]
    assert d.action is not Action.GROW


def test_only_for_higher_priority_pending_jobs() -> None:
    u = unit(job(100, nodes=("n1", "n2"), priority=100))
    assert _run([u], _busy("n1", "n2"), [pending(900, priority=100)])[100].action is Action.HOLD
    assert _run([u], _busy("n1", "n2"), [pending(900, priority=99)])[100].action is Action.HOLD
    assert _run([u], _busy("n1", "n2"), [pending(900, priority=101)])[100].action is Action.SHRINK


def test_off_by_default_and_per_scope() -> None:
    u = unit(job(100, nodes=("n1", "n2"), priority=10, qos="scavenger"))
    pend = [pending(900, priority=100)]
    assert _run([u], _busy("n1", "n2"), pend, shrink_to_admit=False)[100].action is Action.HOLD
    on_for_qos = _run([u], _busy("n1", "n2"), pend, shrink_to_admit=False,
                      qos={"scavenger": {"shrink_to_admit": True}})
    assert on_for_qos[100].reason is Reason.SHRINK_TO_ADMIT


def test_victims_lowest_priority_first() -> None:
    a = unit(job(100, nodes=("a1", "a2"), priority=50))
    b = unit(job(200, nodes=("b1", "b2"), priority=40))
    d = _run([a, b], _busy("a1", "a2", "b1", "b2"), [pending(900, priority=100)])
    assert d[200].reason is Reason.SHRINK_TO_ADMIT and d[100].action is Action.HOLD


def test_victims_lowest_efficiency_then_most_recently_grown() -> None:
    a = unit(job(100, nodes=("a1", "a2"), priority=50))
    b = unit(job(200, nodes=("b1", "b2"), priority=50))
    busy = _busy("a1", "a2", "b1", "b2")
    pend = [pending(900, priority=100)]
    d = _run([a, b], busy, pend, utils=[util(100, 70), util(200, 50)])
    assert d[200].reason is Reason.SHRINK_TO_ADMIT and d[100].action is Action.HOLD
    d = _run([a, b], busy, pend, utils=[util(100, 50), util(200, 50)],
             history=[record(100, 5000), record(200, 4000)])
    assert d[200].reason is Reason.SHRINK_TO_ADMIT and d[100].action is Action.HOLD
    d = _run([a, b], busy, pend, utils=[util(100, 50), util(200, 50)], history=[record(100, 4000)])
    assert d[100].reason is Reason.SHRINK_TO_ADMIT and d[200].action is Action.HOLD


def test_several_victims_when_one_is_not_enough() -> None:
    a = unit(job(100, nodes=("a1", "a2"), priority=50))
    b = unit(job(200, nodes=("b1", "b2"), priority=40))
    d = _run([a, b], _busy("a1", "a2", "b1", "b2"), [pending(900, count=2, priority=100)])
    assert d[100].target_nodes == 1 and d[200].target_nodes == 1
    assert d[100].shrink is not None and d[100].shrink.admits == (900,)


def test_extension_nodes_go_first_and_must_fit_the_pending_job() -> None:
    u = unit(job(100, nodes=("n1", "n2"), priority=10), exts=[ext(500, ("e1",))])
    d = _run([u], _busy("n1", "n2", "e1"), [pending(900, priority=100)])[100]
    assert d.shrink is not None and d.shrink.cancel_extensions == (500,) and d.shrink.released_nodes == ("e1",)
    small = unit(job(100, nodes=("n1", "n2"), priority=10, gpus=2))
    mixed = [node("n1", gpus=4, used=2), node("n2", gpus=4, used=4)]  # another job keeps 2 GPUs on n2
    d = _run([small], mixed, [pending(900, priority=100, gpus=4)])[100]
    assert d.action is Action.HOLD  # freeing n2 leaves only 2 GPUs: the pending job still would not fit


def test_metric_shrinks_are_counted_before_taking_more() -> None:
    idle = unit(job(100, nodes=("a1", "a2"), priority=50))
    other = unit(job(200, nodes=("b1", "b2"), priority=10))
    d = _run([idle, other], _busy("a1", "a2", "b1", "b2"), [pending(900, priority=100)],
             utils=[util(100, 5), util(200, 60)])
    assert d[100].reason is Reason.UNDERUTILIZED
    assert d[200].action is Action.HOLD  # a2, given back anyway, admits the pending job


def test_protected_and_paused_units_are_not_victims() -> None:
    fresh = unit(job(100, nodes=("n1", "n2"), priority=10, started_ago=60))
    cooling = unit(job(200, nodes=("m1", "m2"), priority=10))
    paused = unit(job(300, nodes=("p1", "p2"), priority=10))
    d = _run([fresh, cooling, paused], _busy("n1", "n2", "m1", "m2", "p1", "p2"), [pending(900, priority=100)],
             history=[record(200, 60)], paused_jobs=[300])
    assert d[100].reason is Reason.STARTUP
    assert d[200].reason is Reason.COOLDOWN
    assert d[300].reason is Reason.PAUSED


def test_back_off_after_an_admit_that_did_not_start_the_job() -> None:
    """A journal entry without a basis (written before bases were recorded): back off on time alone."""
    u = unit(job(100, nodes=("n1", "n2", "n3"), priority=10))
    busy = _busy("n1", "n2", "n3")
    shrunk = record(100, 900, Action.SHRINK, from_nodes=4, to_nodes=3, reason="SHRINK_TO_ADMIT", for_job=900)
    d = _run([u], busy, [pending(900, priority=100)], history=[shrunk])[100]
    assert d.action is Action.HOLD
    d = _run([u], busy, [pending(900, priority=100)], history=[shrunk], admit_backoff_s=600)[100]
    assert d.reason is Reason.SHRINK_TO_ADMIT


def test_the_shrink_records_what_it_was_based_on() -> None:
    u = unit(job(100, nodes=("n1", "n2", "n3"), priority=10), exts=[ext(101, ("n5",))])
    other = job(200, nodes=("n4",), priority=10)
    ext_job = job(101, nodes=("n5",), priority=10)  # the extension job as Slurm lists it
    elsewhere = job(300, nodes=("m1",), partition="other")
    all_nodes = [*_busy("n1", "n2", "n3", "n4", "n5"), node("m1", used=4, partitions=("other",))]
    pend = pending(900, count=2, priority=100)
    inp = make_input([u], all_nodes, pending_jobs=[pend], other_jobs=[other, ext_job, elsewhere],
                     utils=[util(100, 60)])
    (d,) = decide(inp, cfg(shrink_to_admit=True), NOW)
    assert d.reason is Reason.SHRINK_TO_ADMIT and d.shrink is not None
    (basis,) = d.shrink.admit_basis
    # The holders of the pending job's partition, the unit's own extension jobs aside (a shrink that cancels
    # one must not read as "something changed"); the job in another partition is not one.
    assert (basis.job_id, basis.holders) == (900, frozenset({100, 200}))
    assert basis.request == admit_request(pend) == "2|gpu::4|gpu"
    assert AdmitBasis.from_dict(d.shrink.to_dict()["admit_basis"][0]) == basis


def _after_admit(holders: frozenset[int], *, seconds_ago: float = 900) -> ResizeRecord:
    """A shrink-to-admit for pending(900) ``seconds_ago`` (past the cooldown), with its basis."""
    return replace(record(100, seconds_ago, Action.SHRINK, from_nodes=4, to_nodes=3, reason="SHRINK_TO_ADMIT",
                          for_job=900), admit_basis=AdmitBasis(900, admit_request(pending(900, priority=100)),
                                                               holders))


def test_back_off_until_something_changes() -> None:
    """Slurm did not start the job after a shrink for it. No further shrink while nothing changed, even once a
    backfilled job took the freed node; one as soon as a job that held nodes of its partition ended, or its
    request changed; and one after admit_backoff_s in any case."""
    u = unit(job(100, nodes=("n1", "n2", "n3"), priority=10))
    pend = pending(900, priority=100)
    holder = job(200, nodes=("n4",), priority=10)
    backfilled = job(300, nodes=("n5",), priority=10, started_ago=60)
    all_nodes = _busy("n1", "n2", "n3", "n4", "n5")
    shrunk = _after_admit(frozenset({100, 200}))

    def decision(others: list[Job], pend_job: Job = pend, hist: ResizeRecord = shrunk) -> Decision:
        inp = make_input([u], all_nodes, pending_jobs=[pend_job], other_jobs=others, utils=[util(100, 60)],
                         history=[hist])
        (d,) = decide(inp, cfg(shrink_to_admit=True, admit_backoff_s=1800), NOW)
        return d

    held = decision([holder, backfilled])
    assert (held.action, held.reason) == (Action.HOLD, Reason.IN_BAND)  # nothing changed: one started, none ended
    replaced = job(400, nodes=("n4",), priority=10, started_ago=5)
    assert decision([replaced, backfilled]).reason is Reason.SHRINK_TO_ADMIT  # job 200 ended
    bigger = pending(900, count=2, priority=100)
    assert decision([holder, backfilled], bigger).reason is Reason.SHRINK_TO_ADMIT  # the request changed
    old = _after_admit(frozenset({100, 200}), seconds_ago=1801)
    assert decision([holder, backfilled], hist=old).reason is Reason.SHRINK_TO_ADMIT  # past admit_backoff_s


def test_a_victim_does_not_also_grow() -> None:
    u = unit(job(100, nodes=("n1", "n2"), priority=10))
    d = _run([u], _busy("n1", "n2"), [pending(900, priority=100)], utils=[util(100, 99)])[100]
    assert d.reason is Reason.SHRINK_TO_ADMIT


def test_other_partition_surplus_does_not_help() -> None:
    u = unit(job(100, nodes=("n1", "n2"), priority=10))
    d = _run([u], nodes(2, busy=["n1", "n2"]), [pending(900, priority=100, partition="other")])[100]
    assert d.action is Action.HOLD


def test_reserve_reclaim_moves_gradually_and_keeps_min() -> None:
    a = unit(job(100, nodes=("n1", "n2"), priority=50))
    b = unit(job(200, nodes=("n3", "n4"), priority=10))
    busy = _busy("n1", "n2", "n3", "n4")
    values: dict[str, Any] = {"shrink_to_admit": False, "partition": {"gpu": {"free_node_reserve": 3,
                                                                             "reclaim_reserve": True}}}
    d = _run([a, b], busy, [], **values)
    assert (d[200].reason, d[200].target_nodes) == (Reason.RESERVE_RECLAIM, 1)  # lowest priority first
    assert (d[100].reason, d[100].target_nodes) == (Reason.RESERVE_RECLAIM, 1)  # only 2 of 3 reachable
    capped = _run([a, b], busy, [], max_actions_per_cycle=1, **values)
    assert capped[100].action is Action.SHRINK and capped[200].reason is Reason.ACTION_CAP
    off = _run([a, b], busy, [], shrink_to_admit=False, free_node_reserve=3)
    assert off[100].action is Action.HOLD and off[200].action is Action.HOLD


def _shared(*names: str) -> list[Node]:
    """Nodes in two overlapping partitions, as on many sites (and the test cluster): train and serve."""
    return [node(n, used=4, partitions=("train", "serve")) for n in names]


def test_overlapping_partitions_a_job_pending_in_one_is_admitted_from_a_unit_in_the_other() -> None:
    u = unit(job(100, nodes=("n1", "n2", "n3"), priority=10, partition="train"))
    d = _run([u], _shared("n1", "n2", "n3"), [pending(900, count=1, priority=100, partition="serve")])[100]
    assert (d.action, d.reason, d.target_nodes) == (Action.SHRINK, Reason.SHRINK_TO_ADMIT, 2)
    # A job pending in a partition the unit's nodes are not in is not helped by shrinking it.
    other = [node(n, used=4, partitions=("train",)) for n in ("n1", "n2", "n3")]
    d = _run([u], other, [pending(900, count=1, priority=100, partition="serve")])[100]
    assert d.action is Action.HOLD


def test_overlapping_partitions_a_reserve_in_one_is_reclaimed_from_a_unit_in_the_other() -> None:
    a = unit(job(100, nodes=("n1", "n2"), priority=10, partition="train"))
    b = unit(job(200, nodes=("n3", "n4"), priority=20, partition="train"))
    ds = {d.unit_id: d for d in decide(
        make_input([a, b], _shared("n1", "n2", "n3", "n4"), utils=[util(100, 60), util(200, 60)]),
        cfg(partition={"serve": {"free_node_reserve": 2, "reclaim_reserve": True}}), NOW)}
    assert [(ds[i].action, ds[i].reason, ds[i].target_nodes) for i in (100, 200)] == [
        (Action.SHRINK, Reason.RESERVE_RECLAIM, 1), (Action.SHRINK, Reason.RESERVE_RECLAIM, 1)]


def test_a_recent_victim_is_spared_for_admit_victim_interval_s() -> None:
    u = unit(job(100, nodes=("n1", "n2", "n3", "n4"), priority=10))
    pend = [pending(900, count=1, priority=100)]
    history = [record(100, 1000, action=Action.SHRINK, reason="SHRINK_TO_ADMIT")]
    assert _run([u], _busy("n1", "n2", "n3", "n4"), pend, history=history)[100].action is Action.SHRINK
    d = _run([u], _busy("n1", "n2", "n3", "n4"), pend, history=history, admit_victim_interval_s=1800)[100]
    assert d.action is Action.HOLD  # shrunk to admit 1000 s ago: spared until 1800 s have passed
    d = _run([u], _busy("n1", "n2", "n3", "n4"), pend, history=history, admit_victim_interval_s=900)[100]
    assert d.action is Action.SHRINK


def test_admit_keep_percent_bounds_how_far_one_victim_is_shrunk() -> None:
    names = ("n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8")
    u = replace(unit(job(100, nodes=names, priority=10), max_nodes=8), requested_nodes=8)
    pend = [pending(900, count=6, priority=100)]
    d = _run([u], _busy(*names), pend)[100]
    assert (d.action, d.target_nodes) == (Action.SHRINK, 2)  # down to its min (1) would do; 6 taken
    # Keeping half of its requested 8 nodes, it has 4 to give: not enough for 6, so nothing is taken.
    d = _run([u], _busy(*names), pend, admit_keep_percent=50)[100]
    assert d.action is Action.HOLD and d.inputs["admit_floor"] == 4
    d = _run([u], _busy(*names), [pending(900, count=3, priority=100)], admit_keep_percent=50)[100]
    assert (d.action, d.reason, d.target_nodes) == (Action.SHRINK, Reason.SHRINK_TO_ADMIT, 5)
    # At its floor already (5 of 8 at 60%, rounded up): no longer a victim.
    at_floor = replace(unit(job(100, nodes=names[:5], priority=10), max_nodes=8), requested_nodes=8)
    d = _run([at_floor], _busy(*names[:5]), [pending(900, count=1, priority=100)], admit_keep_percent=60)[100]
    assert d.action is Action.HOLD


def test_victim_by_remaining_takes_from_the_unit_a_node_costs_least_time() -> None:
    # Both have 3 nodes and are below the pending job's priority. The long job (10 h left) has the lower
    # priority, so it is the default victim; a node from the short one (1 h left) adds 30 min instead of 5 h.
    long_job = unit(job(100, nodes=("n1", "n2", "n3"), priority=10, time_limit_min=11 * 60))
    short_job = unit(job(200, nodes=("n4", "n5", "n6"), priority=20, time_limit_min=2 * 60))
    no_limit = unit(job(300, nodes=("n7", "n8"), priority=5))
    units, busy = [long_job, short_job, no_limit], _busy(*(f"n{i}" for i in range(1, 9)))
    pend = [pending(900, count=1, priority=100)]
    ds = _run(units, busy, pend)
    assert ds[300].action is Action.SHRINK and ds[100].action is Action.HOLD  # lowest priority first
    ds = _run(units, busy, pend, victim_by_remaining=True)
    assert [ds[i].action for i in (100, 200, 300)] == [Action.HOLD, Action.SHRINK, Action.HOLD]
    assert ds[200].inputs["victim_added_s"] == 1800.0
    ds = _run(units, busy, [pending(900, count=3, priority=100)], victim_by_remaining=True)
    assert [ds[i].target_nodes for i in (100, 200, 300)] == [2, 1, 2]  # then the long one; no limit last


def _sharing(min_b: int) -> dict[int, Decision]:
    """Three units at two GPUs per node share four 4-GPU nodes (A n1-n3, B n2-n4, C n1,n4: every node full); A
    outranks the arrival, which needs two GPUs on each of two nodes. A shrink gives back a unit's last node, so B
    and C would both give n4. The rule walk (no allocator)."""
    units = [unit(job(uid, nodes=names, gpus=2, priority=prio), min_nodes=low)
             for uid, names, prio, low in ((100, ("n1", "n2", "n3"), 1000, 1), (101, ("n2", "n3", "n4"), 10, min_b),
                                           (102, ("n1", "n4"), 10, 1))]
    return _run(units, _busy("n1", "n2", "n3", "n4"), [pending(900, count=2, gpus=2, priority=100)])


def test_a_node_two_sharing_victims_would_free_counts_once_for_the_arrival() -> None:
    """B may give one node (n4), C one (n4): one place for the arrival, not two, so nobody shrinks (it would
    still not fit). With B allowed two nodes (n4, n3) B alone admits it and C keeps its nodes."""
    got = _sharing(2)
    assert [got[u].target_nodes for u in (100, 101, 102)] == [3, 3, 2]
    assert all(got[u].shrink is None for u in (100, 101, 102))
    got = _sharing(1)
    assert [got[u].target_nodes for u in (100, 101, 102)] == [3, 1, 2]
    assert got[101].shrink is not None and got[101].shrink.released_nodes == ("n4", "n3")
    assert got[102].shrink is None
