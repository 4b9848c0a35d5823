"""Moldable start (policy/moldable.py): the pure rule shared by the controller and the simulator."""

from __future__ import annotations

from slurm_elastic.policy import Reason
from slurm_elastic.policy.moldable import CountedFree, MoldCandidate, decide_molds, plan_molds
from tests.unit.policy_builders import cfg, job, nodes, pending, snapshot, spec


def _cand(job_id: int, request: int, min_nodes: int = 1, *, time_limit_s: float | None = None,
          cap_s: int | None = None) -> MoldCandidate:
    return MoldCandidate(job_id, str(job_id), "", request, request, min_nodes, request * 4, 4,
                         time_limit_s=time_limit_s, max_extension_s=cap_s)


def test_a_job_whose_min_fits_starts_on_the_free_whole_nodes_with_a_scaled_time_limit() -> None:
    [m] = plan_molds([_cand(7, 4, 2, time_limit_s=3600)], CountedFree(lambda: 3))
    assert (m.candidate.job_id, m.nodes, m.free_nodes, m.reason) == (7, 3, 3, Reason.MOLDABLE_START)
    assert m.time_limit_factor == 16 / 12
    assert m.time_limit_add_s == 1200  # 3600 s x (4/3 - 1)
    assert m.inputs["request_nodes"] == 4 and m.inputs["molded_nodes"] == 3 and m.inputs["time_limit_add_s"] == 1200
    assert "3 of its 4 requested node(s)" in m.message and "+20min" in m.message


def test_no_mold_when_it_fits_as_asked_when_the_min_does_not_fit_or_for_one_node() -> None:
    assert plan_molds([_cand(1, 3)], CountedFree(lambda: 3)) == []  # fits: the scheduler's call
    assert plan_molds([_cand(1, 4, 3)], CountedFree(lambda: 2)) == []  # min 3 > 2 free
    assert plan_molds([_cand(1, 1)], CountedFree(lambda: 0)) == []
    assert plan_molds([_cand(1, 4)], CountedFree(lambda: 0)) == []


def test_molds_go_in_the_given_order_and_take_the_nodes_from_the_ones_after() -> None:
    molds = plan_molds([_cand(1, 4, 2), _cand(2, 4, 2), _cand(3, 4, 1)], CountedFree(lambda: 3))
    assert [(m.candidate.job_id, m.nodes) for m in molds] == [(1, 3)]
    molds = plan_molds([_cand(1, 8, 2), _cand(2, 8, 3), _cand(3, 8, 1)], CountedFree(lambda: 5))
    assert [(m.candidate.job_id, m.nodes) for m in molds] == [(1, 5)]


def test_the_time_limit_extension_is_capped_as_a_shrinks_is() -> None:
    [m] = plan_molds([_cand(1, 4, time_limit_s=36_000, cap_s=3600)], CountedFree(lambda: 1))
    assert m.time_limit_add_s == 3600 and m.time_limit_factor == 4.0


def test_controller_molds_a_waiting_elastic_job_in_priority_order_when_switched_on() -> None:
    all_nodes = nodes(4, busy=["n1", "n2"])
    running = job(10, nodes=("n1", "n2"))
    low = pending(20, count=3, priority=100, time_limit_min=60)
    high = pending(21, count=4, priority=900, time_limit_min=60)
    snap = snapshot([running, low, high], all_nodes)
    pend = [(low, spec(min_nodes=1)), (high, spec(min_nodes=2))]
    assert decide_molds(snap, pend, cfg()) == []  # off in the rule tests' base
    molds = decide_molds(snap, pend, cfg(moldable_start=True))
    assert [(m.candidate.job_id, m.nodes, m.time_limit_add_s) for m in molds] == [(21, 2, 3600)]
    # the nodes this cycle's grows take are not free (one left: below 21's min, 20 gets it, as in the
    # simulator; Slurm's backfill still decides whether it starts); a job in ``skip`` is left alone
    assert [(m.candidate.job_id, m.nodes) for m in decide_molds(snap, pend, cfg(moldable_start=True),
                                                              taken_nodes={"n4"})] == [(20, 1)]
    assert [(m.candidate.job_id, m.nodes) for m in decide_molds(snap, pend, cfg(moldable_start=True),
                                                              skip={21})] == [(20, 2)]


def test_controller_leaves_jobs_that_wait_for_other_reasons_cannot_grow_or_are_off_for_their_partition() -> None:
    all_nodes = nodes(4, busy=["n1", "n2"])
    held = pending(20, count=3, reason="JobHeldUser")
    fresh = pending(21, count=3, reason="None")
    snap = snapshot([held, fresh], all_nodes)
    on = cfg(moldable_start=True)
    assert decide_molds(snap, [(held, spec(min_nodes=1)), (fresh, spec(min_nodes=1))], on) == []
    waiting = pending(22, count=3)
    snap = snapshot([waiting], all_nodes)
    assert decide_molds(snap, [(waiting, spec(min_nodes=1, grow=False))], on) == []
    assert decide_molds(snap, [(waiting, spec(min_nodes=3))], on) == []  # min = request: nothing to mold
    off_here = cfg(moldable_start=True, partition={"gpu": {"moldable_start": False}})
    assert decide_molds(snap, [(waiting, spec(min_nodes=1))], off_here) == []
    [m] = decide_molds(snap, [(waiting, spec(min_nodes=1))], on)
    assert (m.nodes, m.time_limit_add_s) == (2, 0)  # no time limit: nothing to scale


def test_controller_time_limit_scaling_follows_extend_time_limit_on_shrink() -> None:
    waiting = pending(22, count=4, time_limit_min=30)
    snap = snapshot([waiting], nodes(4, busy=["n1", "n2", "n3"]))
    [m] = decide_molds(snap, [(waiting, spec(min_nodes=1))], cfg(moldable_start=True))
    assert m.time_limit_add_s == 90 * 60
    [m] = decide_molds(snap, [(waiting, spec(min_nodes=1))],
                       cfg(moldable_start=True, extend_time_limit_on_shrink=False))
    assert m.time_limit_add_s == 0


def test_controller_counts_nodes_backfill_planned_for_a_waiting_job_as_free() -> None:
    # measured on 22.05: the free nodes behind a job waiting on Resources are IDLE+PLANNED (planned for it)
    waiting = pending(22, count=4)
    all_nodes = nodes(2, busy=["n1", "n2"]) + nodes(2, prefix="p", flags=("PLANNED",))
    [m] = decide_molds(snapshot([waiting], all_nodes), [(waiting, spec(min_nodes=1))], cfg(moldable_start=True))
    assert m.nodes == 2
    draining = nodes(2, prefix="p", flags=("PLANNED", "DRAIN"))
    assert decide_molds(snapshot([waiting], draining), [(waiting, spec(min_nodes=1))], cfg(moldable_start=True)) == []


def test_moldable_start_is_a_packaged_default() -> None:
    from slurm_elastic.policy import default_config

    assert default_config().resolve("moldable_start").value is True


def test_mold_only_if_faster_waits_when_the_request_frees_up_soon_enough() -> None:
    # 4 nodes asked, 2 free: molded it runs 2 x its one hour (linear scaling) = 2 h
    soon = plan_molds([_cand(1, 4, time_limit_s=3600)], CountedFree(lambda: 2), lambda c: 1800.0)
    assert soon == []  # waiting 30 min + 1 h finishes before 2 h
    late = plan_molds([_cand(1, 4, time_limit_s=3600)], CountedFree(lambda: 2), lambda c: 5400.0)
    assert [(m.candidate.job_id, m.nodes) for m in late] == [(1, 2)]  # 90 min + 1 h is later than 2 h
    unknown = plan_molds([_cand(1, 4, time_limit_s=3600)], CountedFree(lambda: 2), lambda c: None)
    assert [m.nodes for m in unknown] == [2]  # no estimate: molded as without the key


def test_controller_mold_only_if_faster_reads_the_running_jobs_expected_ends() -> None:
    all_nodes = nodes(4, busy=["n1", "n2"])
    ends_soon = job(10, nodes=("n1", "n2"), started_ago=3000, time_limit_min=60)  # 10 min left
    ends_late = job(10, nodes=("n1", "n2"), started_ago=600, time_limit_min=600)  # 590 min left
    waiting = pending(21, count=4, priority=900, time_limit_min=60)
    on = cfg(moldable_start=True, mold_only_if_faster=True)
    for running, molded in ((ends_soon, []), (ends_late, [(21, 2)])):
        snap = snapshot([running, waiting], all_nodes)
        got = decide_molds(snap, [(waiting, spec(min_nodes=2))], on)
        assert [(m.candidate.job_id, m.nodes) for m in got] == molded
    snap = snapshot([ends_soon, waiting], all_nodes)
    assert [m.nodes for m in decide_molds(snap, [(waiting, spec(min_nodes=2))], cfg(moldable_start=True))] == [2]
