"""A molded unit grows back to its request (policy/regrow.py, MOLDED_REGROW): after the startup hold, past the
metrics gate, the band and the speedup check, walked at its priority and ahead of every other training grow."""

from __future__ import annotations

from dataclasses import replace

from slurm_elastic.policy import Action, Reason, decide
from slurm_elastic.policy.model import ElasticUnit
from tests.unit.policy_builders import NOW, cfg, job, make_input, nodes, pending, record, unit, util


def molded(u: ElasticUnit, request: int) -> ElasticUnit:
    return replace(u, molded_request=request, requested_nodes=u.current_nodes)


def test_a_molded_unit_grows_back_to_its_request_after_the_startup_hold_without_metrics() -> None:
    # started 400 s ago on 1 of the 3 nodes it asked for, no metrics yet, two nodes free
    u = molded(unit(job(100, nodes=("n1",), started_ago=400)), 3)
    (d,) = decide(make_input([u], nodes(3, busy=["n1"])), cfg(), NOW)
    assert (d.action, d.reason, d.target_nodes) == (Action.GROW, Reason.MOLDED_REGROW, 3)
    assert d.inputs["molded_request"] == 3 and "request of 3 node(s)" in d.message
    # the same unit not molded waits for metrics
    (plain,) = decide(make_input([replace(u, molded_request=None)], nodes(3, busy=["n1"])), cfg(), NOW)
    assert (plain.action, plain.reason) == (Action.HOLD, Reason.NO_METRICS)
    # within the startup hold it holds like any unit
    young = molded(unit(job(100, nodes=("n1",), started_ago=60)), 3)
    (d,) = decide(make_input([young], nodes(3, busy=["n1"])), cfg(), NOW)
    assert (d.action, d.reason) == (Action.HOLD, Reason.STARTUP)


def test_the_speedup_check_does_not_refuse_a_regrow_up_to_the_request() -> None:
    # 86% utilization on 1 node: the linear-sync model predicts a marginal efficiency below 0.5 for the second
    u = unit(job(100, nodes=("n1",), started_ago=3600))
    inp_plain = make_input([u], nodes(3, busy=["n1"]), utils=[util(100, 60)])
    (d,) = decide(inp_plain, cfg(speedup_growth=True), NOW)
    assert d.reason is Reason.LOW_SPEEDUP_GAIN
    inp = make_input([molded(u, 2)], nodes(3, busy=["n1"]), utils=[util(100, 60)])
    (d,) = decide(inp, cfg(speedup_growth=True), NOW)
    assert (d.action, d.reason, d.target_nodes) == (Action.GROW, Reason.MOLDED_REGROW, 2)  # not past 2


def test_no_regrow_at_its_request_with_no_grow_or_in_cooldown() -> None:
    at_request = molded(unit(job(100, nodes=("n1", "n2"), started_ago=3600)), 2)
    (d,) = decide(make_input([at_request], nodes(3, busy=["n1", "n2"]), utils=[util(100, 60)]), cfg(), NOW)
    assert d.reason is Reason.IN_BAND
    no_grow = molded(unit(job(100, nodes=("n1",), started_ago=400), grow=False), 3)
    (d,) = decide(make_input([no_grow], nodes(3, busy=["n1"])), cfg(), NOW)
    assert d.reason is Reason.NO_METRICS
    cooling = molded(unit(job(100, nodes=("n1",), started_ago=3600)), 3)
    (d,) = decide(make_input([cooling], nodes(3, busy=["n1"]), history=[record(100, 60, Action.SHRINK)]), cfg(), NOW)
    assert d.reason is Reason.COOLDOWN
    capped = molded(unit(job(100, nodes=("n1",), started_ago=400), max_nodes=2), 3)
    (d,) = decide(make_input([capped], nodes(3, busy=["n1"])), cfg(), NOW)
    assert d.target_nodes == 2  # its max wins over its request


def test_a_regrow_takes_free_nodes_before_a_higher_priority_grow_past_its_request() -> None:
    # unit 100 (priority 10) molded to 1 of 2; unit 200 (priority 900) at its request, overutilized: one free node
    small = molded(unit(job(100, nodes=("n1",), priority=10, started_ago=3600)), 2)
    big = unit(job(200, nodes=("n2",), priority=900, started_ago=3600))
    inp = make_input([small, big], nodes(3, busy=["n1", "n2"]), utils=[util(100, 60), util(200, 95)])
    d100, d200 = decide(inp, cfg(), NOW)
    assert (d100.action, d100.reason, d100.grow.nodes if d100.grow else ()) == (
        Action.GROW, Reason.MOLDED_REGROW, ("n3",))
    assert (d200.action, d200.reason) == (Action.HOLD, Reason.NO_FREE_NODES)
    # not molded, the higher priority grows first, as before
    d100, d200 = decide(make_input([replace(small, molded_request=None), big], nodes(3, busy=["n1", "n2"]),
                                   utils=[util(100, 60), util(200, 95)]), cfg(), NOW)
    assert (d100.action, d200.action) == (Action.HOLD, Action.GROW)


def test_a_regrow_waits_behind_a_waiting_job_of_higher_priority() -> None:
    small = molded(unit(job(100, nodes=("n1",), priority=10, started_ago=3600)), 2)
    inp = make_input([small], nodes(2, busy=["n1"]), utils=[util(100, 60)],
                     pending_jobs=[pending(900, count=1, priority=50)])
    (d,) = decide(inp, cfg(), NOW)
    assert (d.action, d.reason) == (Action.HOLD, Reason.PENDING_HIGHER_PRIORITY)
    # of lower priority than the molded unit: the regrow takes the node first
    inp = make_input([small], nodes(2, busy=["n1"]), utils=[util(100, 60)],
                     pending_jobs=[pending(900, count=1, priority=5)])
    (d,) = decide(inp, cfg(), NOW)
    assert (d.action, d.reason) == (Action.GROW, Reason.MOLDED_REGROW)
