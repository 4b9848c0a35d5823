"""Protect the tail: tail_protection (bounded slowdown), victim_by_service (least marginal loss, then most attained
service), and the journal-derived progress both rest on."""

from __future__ import annotations

from dataclasses import replace

from slurm_elastic.policy import Action, Reason, decide, unit_progress
from slurm_elastic.policy.model import ElasticUnit
from tests.unit.policy_builders import NOW, ago, cfg, job, make_input, nodes, pending, record, unit, util

TAIL = {"tail_protection": True, "shrink_to_admit": True}


def shrunk(u: ElasticUnit, shrunk_s: float, requested: int, attained: float | None = None) -> ElasticUnit:
    return replace(u, requested_nodes=requested, shrunk_s=shrunk_s, attained_gpu_s=attained)


def test_progress_walks_the_journal_back_from_now() -> None:
    # started 4 h ago on 4 nodes, shrunk to 2 at -3 h, to 1 at -2 h, grew to 2 at -1 h; a failed grow is ignored
    history = [record(1, 3 * 3600, Action.SHRINK, from_nodes=4, to_nodes=2),
               record(1, 2 * 3600, Action.SHRINK, from_nodes=2, to_nodes=1),
               record(1, 3600, Action.GROW, from_nodes=1, to_nodes=2),
               record(1, 1800, Action.GROW, from_nodes=2, to_nodes=4, outcome=record(1, 0).outcome.FAILED)]
    p = unit_progress(ago(4 * 3600), NOW, 2, 4, history)
    assert p.requested_nodes == 4
    assert p.shrunk_s == 3 * 3600
    assert p.attained_gpu_s == (4 + 2 + 1 + 2) * 3600 * 4


def test_progress_without_resizes_is_the_whole_life_at_the_current_size() -> None:
    p = unit_progress(ago(600), NOW, 3, 8, [record(1, 7200, Action.SHRINK, from_nodes=4, to_nodes=3)])  # older
    assert (p.requested_nodes, p.shrunk_s, p.attained_gpu_s) == (3, 0.0, 600 * 3 * 8)


def test_a_unit_shrunk_too_long_grows_back_ahead_of_a_higher_priority_pending_job() -> None:
    u = shrunk(unit(job(100, nodes=("n1",), priority=10, started_ago=7200)), 3600, requested=2)
    inp = make_input([u], nodes(2, busy=["n1"]), utils=[util(100, 60)],
                     pending_jobs=[pending(900, count=1, priority=5000)])
    (d,) = decide(inp, cfg(**TAIL), NOW)
    assert (d.action, d.reason, d.target_nodes) == (Action.GROW, Reason.SHRUNK_TOO_LONG, 2)
    assert d.inputs["shrunk_share"] == 0.5 and d.inputs["requested_nodes"] == 2
    # without the rule the same unit holds in band, and the pending job keeps the free node
    (plain,) = decide(inp, cfg(shrink_to_admit=True), NOW)
    assert (plain.action, plain.reason) == (Action.HOLD, Reason.IN_BAND)


def test_no_regrow_for_an_idle_unit_or_one_at_its_request() -> None:
    idle = shrunk(unit(job(100, nodes=("n1",), started_ago=7200)), 3600, requested=2)
    (d,) = decide(make_input([idle], nodes(3, busy=["n1"]), utils=[util(100, 10)]), cfg(**TAIL), NOW)
    assert d.reason is Reason.AT_MIN  # 10% < 40%: it would shrink, not grow back
    back = shrunk(unit(job(100, nodes=("n1", "n2"), started_ago=7200)), 3600, requested=2)
    (d,) = decide(make_input([back], nodes(3, busy=["n1", "n2"]), utils=[util(100, 60)]), cfg(**TAIL), NOW)
    assert d.reason is Reason.IN_BAND


def test_protection_needs_both_the_share_and_the_minimum_time_shrunk() -> None:
    def admit(u: ElasticUnit, **values: object) -> Reason:
        inp = make_input([u], nodes(3, busy=["n1", "n2", "n3"]), utils=[util(100, 60)],
                         pending_jobs=[pending(900, count=1, priority=5000)])
        (d,) = decide(inp, cfg(**{**TAIL, **values}), NOW)
        return d.reason

    base = unit(job(100, nodes=("n1", "n2", "n3"), priority=100, started_ago=7200))
    assert admit(shrunk(base, 4000, requested=3)) is Reason.TAIL_PROTECTED
    assert admit(shrunk(base, 2000, requested=3)) is Reason.SHRINK_TO_ADMIT  # 28% <= 30%
    assert admit(shrunk(base, 4000, requested=3), max_shrunk_share=60) is Reason.SHRINK_TO_ADMIT
    assert admit(shrunk(base, 4000, requested=3), tail_min_shrunk_s=5000) is Reason.SHRINK_TO_ADMIT
    assert admit(base) is Reason.SHRINK_TO_ADMIT  # progress unknown: the rule leaves it alone
    assert admit(shrunk(base, 4000, requested=3), tail_protection=False) is Reason.SHRINK_TO_ADMIT


def test_a_protected_unit_gives_nothing_to_the_reserve() -> None:
    u = shrunk(unit(job(100, nodes=("n1", "n2", "n3"), started_ago=7200)), 4000, requested=3)
    inp = make_input([u], nodes(3, busy=["n1", "n2", "n3"]), utils=[util(100, 60)])
    (d,) = decide(inp, cfg(free_node_reserve=1, reclaim_reserve=True, tail_protection=True), NOW)
    assert d.action is Action.HOLD
    (d,) = decide(inp, cfg(free_node_reserve=1, reclaim_reserve=True), NOW)
    assert d.reason is Reason.RESERVE_RECLAIM


def _two_victims() -> tuple[ElasticUnit, ElasticUnit]:
    # 100: lowest priority, 2 nodes, little service; 101: higher priority, 4 nodes, much service
    small = replace(unit(job(100, nodes=("n1", "n2"), priority=10)), attained_gpu_s=3600.0)
    big = replace(unit(job(101, nodes=("n3", "n4", "n5", "n6"), priority=20), max_nodes=8), attained_gpu_s=1e6)
    return small, big


def test_victims_by_priority_then_by_least_marginal_loss_and_most_attained_service() -> None:
    small, big = _two_victims()
    inp = make_input([small, big], nodes(6, busy=["n1", "n2", "n3", "n4", "n5", "n6"]),
                     utils=[util(100, 60), util(101, 60)], pending_jobs=[pending(900, count=1, priority=5000)])
    by_priority = {d.unit_id: d.reason for d in decide(inp, cfg(shrink_to_admit=True), NOW)}
    assert by_priority == {100: Reason.SHRINK_TO_ADMIT, 101: Reason.IN_BAND}
    decisions = {d.unit_id: d for d in decide(inp, cfg(shrink_to_admit=True, victim_by_service=True), NOW)}
    assert {k: d.reason for k, d in decisions.items()} == {100: Reason.IN_BAND, 101: Reason.SHRINK_TO_ADMIT}
    d = decisions[101]
    assert d.inputs["victim_marginal_loss"] == 0.15  # 60% / 4 nodes
    assert "victim by least marginal loss (0.15 of its speed per node), then most attained service (277.8 GPU-h)" \
        in d.message


def test_attained_service_breaks_equal_losses_and_priority_still_bounds_victims() -> None:
    a = replace(unit(job(100, nodes=("n1", "n2"), priority=10)), attained_gpu_s=100.0)
    b = replace(unit(job(101, nodes=("n3", "n4"), priority=20)), attained_gpu_s=9000.0)
    hi = replace(unit(job(102, nodes=("n5", "n6"), priority=9000)), attained_gpu_s=1e7)  # above the pending job
    inp = make_input([a, b, hi], nodes(6, busy=[f"n{i}" for i in range(1, 7)]),
                     utils=[util(100, 60), util(101, 60), util(102, 60)],
                     pending_jobs=[pending(900, count=1, priority=5000)])
    reasons = {d.unit_id: d.reason for d in decide(inp, cfg(shrink_to_admit=True, victim_by_service=True), NOW)}
    assert reasons == {100: Reason.IN_BAND, 101: Reason.SHRINK_TO_ADMIT, 102: Reason.IN_BAND}


def test_the_controller_fills_progress_from_the_journal_of_the_units_lives() -> None:
    from datetime import timedelta

    from slurm_elastic.controller.progress import journal_since, with_progress

    young = unit(job(100, nodes=("n1",), started_ago=3600))
    old = unit(job(101, nodes=("n2", "n3"), started_ago=3 * 86400))
    assert journal_since([young], NOW, timedelta(days=1)) is None
    assert journal_since([young, old], NOW, timedelta(days=1)) == ago(3 * 86400)
    history = [record(100, 1800, Action.SHRINK, from_nodes=2, to_nodes=1)]
    filled = {u.unit_id: u for u in with_progress([young, old], history, NOW)}
    assert (filled[100].requested_nodes, filled[100].shrunk_s, filled[100].attained_gpu_s) == \
        (2, 1800.0, (2 + 1) * 1800 * 4)
    assert (filled[101].requested_nodes, filled[101].shrunk_s) == (2, 0.0)
