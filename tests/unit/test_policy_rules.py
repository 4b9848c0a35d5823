"""One table-driven case per reason code: the smallest input that makes ``decide`` give that reason.

A meta-test checks that every Reason has a case here, so a new code can not be added untested.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from slurm_elastic.policy import Action, Basis, Decision, PolicyConfig, PolicyInput, Reason, decide, default_config
from slurm_elastic.policy.model import ActionInProgress, ExtensionEnd, ServingLoad, ServingPoint
from slurm_elastic.policy.reasons import SHELL_REASONS
from tests.unit.policy_builders import (
    NOW,
    ago,
    cfg,
    ext,
    job,
    make_input,
    node,
    nodes,
    pending,
    record,
    tput,
    unit,
    util,
)


@dataclass(frozen=True)
class Case:
    reason: Reason
    action: Action
    build: Callable[[], tuple[PolicyInput, PolicyConfig]]
    message: str  # a substring of the message
    unit_id: int = 100
    basis: Basis | None = None
    target: int | None = None


def one(
    mean: float | None = 50,
    *,
    leader: tuple[str, ...] = ("n1",),
    free: int = 4,
    config: PolicyConfig | None = None,
    **kw: Any,
) -> tuple[PolicyInput, PolicyConfig]:
    """Unit 100 on ``leader`` with ``free`` more idle nodes, at ``mean`` utilization."""
    job_kw = {k: kw.pop(k) for k in list(kw) if k in {"priority", "time_limit_min", "started_ago", "state"}}
    u = unit(job(100, nodes=leader, **job_kw), **kw)
    all_nodes = nodes(len(leader) + free, busy=leader)
    utils = [util(100, mean)] if mean is not None else []
    return make_input([u], all_nodes, utils=utils), config or cfg()


def spoints(p99: float, rps: float, *, span: float = 900, every: float = 10) -> tuple[ServingPoint, ...]:
    """A serving unit's published points, one every ``every`` seconds over the last ``span`` seconds."""
    n = int(span // every)
    return tuple(ServingPoint(ago(span - i * every), rps, p99_ms=p99, replicas=1) for i in range(n + 1))


def serving(p99: float, rps: float = 10.0, *, leader: tuple[str, ...] = ("n1",), free: int = 2,
            forecast: float | None = None, others: tuple[Any, ...] = (), utils: tuple[Any, ...] = (),
            exts: tuple[Any, ...] = (), **kw: Any) -> tuple[PolicyInput, PolicyConfig]:
    """Serving unit 100 (SLO 50ms) on ``leader`` at ``p99``/``rps`` over the last 15 min, ``free`` idle nodes."""
    kw.setdefault("slo_p99_ms", 50)
    u = unit(job(100, nodes=leader, priority=10), serving=True, exts=exts, **kw)
    busy = list(leader) + [n for e in exts for n in e.nodes] + [n for o in others for n in o.job.nodes]
    inp = make_input([u, *others], nodes(len(busy) + free, busy=busy), utils=utils)
    load = ServingLoad(100, spoints(p99, rps), forecast_rps=forecast, forecast_lead_s=None if forecast is None else 60)
    return replace(inp, serving={100: load}), cfg()


def serving_reclaim() -> tuple[PolicyInput, PolicyConfig]:
    train = unit(job(200, nodes=("n2", "n3"), priority=5000))
    return serving(60, free=0, others=(train,), utils=(util(200, 60),))


def with_pending() -> tuple[PolicyInput, PolicyConfig]:
    u = unit(job(100, nodes=("n1",), priority=1000))
    return make_input([u], nodes(2, busy=["n1"]), utils=[util(100, 95)],
                      pending_jobs=[pending(900, priority=1000)]), cfg()


def two_growers_capped() -> tuple[PolicyInput, PolicyConfig]:
    a = unit(job(100, nodes=("n1",), priority=500))
    b = unit(job(200, nodes=("n2",), priority=900))
    return make_input([a, b], nodes(6, busy=["n1", "n2"]), utils=[util(100, 95), util(200, 95)]), cfg(
        max_actions_per_cycle=1)


def admit() -> tuple[PolicyInput, PolicyConfig]:
    u = unit(job(100, nodes=("n1", "n2", "n3"), priority=100))
    return make_input([u], nodes(3, busy=["n1", "n2", "n3"]), utils=[util(100, 60)],
                      pending_jobs=[pending(900, count=2, priority=5000)]), cfg(shrink_to_admit=True)


def tail_regrow() -> tuple[PolicyInput, PolicyConfig]:
    # asked for 3 nodes, runs on 1, shrunk for half of its two hours: back to 3 although 60% is within the band
    u = replace(unit(job(100, nodes=("n1",), started_ago=7200)), requested_nodes=3, shrunk_s=3600.0)
    return make_input([u], nodes(5, busy=["n1"]), utils=[util(100, 60)]), cfg(tail_protection=True)


def molded_regrow() -> tuple[PolicyInput, PolicyConfig]:
    # molded to 1 of the 3 nodes it asked for 400 s ago: back to 3 without metrics (policy/regrow.py)
    u = replace(unit(job(100, nodes=("n1",), started_ago=400)), molded_request=3, requested_nodes=1)
    return make_input([u], nodes(5, busy=["n1"])), cfg()


def tail_protected() -> tuple[PolicyInput, PolicyConfig]:
    # the admit case, but the unit has run shrunk for 4000 of its 7200 s: the pending job waits
    u = replace(unit(job(100, nodes=("n1", "n2", "n3"), priority=100, started_ago=7200)), requested_nodes=3,
                shrunk_s=4000.0)
    return make_input([u], nodes(3, busy=["n1", "n2", "n3"]), utils=[util(100, 60)],
                      pending_jobs=[pending(900, count=2, priority=5000)]), cfg(shrink_to_admit=True,
                                                                                 tail_protection=True)


def fair() -> tuple[PolicyInput, PolicyConfig]:
    a1 = unit(job(100, nodes=("n1",), priority=900, account="a"))
    a2 = unit(job(101, nodes=("n2",), priority=800, account="a"))
    b = unit(job(200, nodes=("n3",), priority=100, account="b"))
    inp = make_input([a1, a2, b], nodes(5, busy=["n1", "n2", "n3"]),
                     utils=[util(100, 95), util(101, 95), util(200, 95)], shares={"a": 0.5, "b": 0.5})
    return inp, cfg(fair_share=True)


def restart_cost() -> tuple[PolicyInput, PolicyConfig]:
    # 20 min left, restart 600 s observed: gain (1200-600)*1/1 = 600 s, not above the cost
    u = unit(job(100, nodes=("n1",), time_limit_min=80, started_ago=3600))
    inp = make_input([u], nodes(3, busy=["n1"]), utils=[util(100, 95, restart=600)])
    return inp, cfg(restart_cost_aware=True, min_remaining_for_grow_s=0)


def flat_throughput() -> tuple[PolicyInput, PolicyConfig]:
    u = unit(job(100, nodes=("n1",)), exts=[ext(500, ("n2",), started_ago=3000)])
    samples = tput(1, 100.0, age=3200) + tput(2, 105.0)
    inp = make_input([u], nodes(4, busy=["n1", "n2"]), utils=[util(100, 95, throughput=samples)])
    return inp, cfg(goodput=True)


def quota() -> tuple[PolicyInput, PolicyConfig]:
    u = unit(job(100, nodes=("n1",)), exts=[ext(500, ("n2",))])
    inp = make_input([u], nodes(4, busy=["n1", "n2"]), utils=[util(100, 95)])
    return inp, cfg(account={"acct": {"max_extension_nodes_per_account": 1}})


def reclaim() -> tuple[PolicyInput, PolicyConfig]:
    u = unit(job(100, nodes=("n1", "n2", "n3"), priority=100))
    inp = make_input([u], nodes(3, busy=["n1", "n2", "n3"]), utils=[util(100, 60)])
    return inp, cfg(partition={"gpu": {"free_node_reserve": 2, "reclaim_reserve": True}})


def goodput_move() -> tuple[PolicyInput, PolicyConfig]:
    # unit 200 at 95% on one node would grow, no node is free; unit 100's third node at 45% is worth little
    grower = unit(job(200, nodes=("n1",), time_limit_min=600))
    donor = unit(job(100, nodes=("n2", "n3", "n4"), time_limit_min=600))
    inp = make_input([grower, donor], nodes(4, busy=["n1", "n2", "n3", "n4"]),
                     utils=[util(200, 95), util(100, 45)])
    return inp, cfg(speedup_growth=True, goodput_moves=True)


def in_progress() -> tuple[PolicyInput, PolicyConfig]:
    inp, config = one(12, leader=("n1", "n2"))
    return replace(inp, in_progress=(ActionInProgress(100, "shrink", ago(90)),)), config


def backoff() -> tuple[PolicyInput, PolicyConfig]:
    inp, config = one(95)
    return replace(inp, extension_ends=(ExtensionEnd(100, 500, "FAILED", ago(60), ago(45)),)), config


def resume_cost() -> tuple[PolicyInput, PolicyConfig]:
    # only a powered-down node fits; 5 min left: gain (300 - 120 - 60) * efficiency 0.95 = 114 s <= 180 s of cost
    u = unit(job(100, nodes=("n1",), time_limit_min=65, started_ago=3600))
    off = node("n2", flags=("CLOUD", "POWERED_DOWN"))
    inp = make_input([u], [node("n1", used=4), off], utils=[util(100, 95, restart=60)])
    return inp, cfg(min_remaining_for_grow_s=0)


def invalid() -> tuple[PolicyInput, PolicyConfig]:
    u = unit(job(100, nodes=("n1",)), scale_up_above=50)  # directive 50, site scale_down_below 60
    return make_input([u], nodes(2, busy=["n1"]), utils=[util(100, 55)]), cfg(scale_down_below=60)


CASES: list[Case] = [
    Case(Reason.UNDERUTILIZED, Action.SHRINK, lambda: one(12, leader=("n1", "n2")),
         "mean util 12% < 40% over 600s (120 samples)", basis=Basis.UTILIZATION, target=1),
    Case(Reason.OVERUTILIZED, Action.GROW, lambda: one(95), "mean util 95% > 80% over 600s", target=2,
         basis=Basis.UTILIZATION),
    Case(Reason.IN_BAND, Action.HOLD, lambda: one(60), "mean util 60% within 40%..80%"),
    Case(Reason.BELOW_MIN, Action.GROW, lambda: one(None, min_nodes=2), "1 nodes < min 2", basis=Basis.BOUNDS,
         target=2),
    Case(Reason.ABOVE_MAX, Action.SHRINK, lambda: one(None, leader=("n1", "n2", "n3"), max_nodes=2),
         "3 nodes > max 2", basis=Basis.BOUNDS, target=2),
    Case(Reason.AT_MIN, Action.HOLD, lambda: one(10), "but at min 1"),
    Case(Reason.AT_MAX, Action.HOLD, lambda: one(95, max_nodes=1), "but at max 1"),
    Case(Reason.NOT_RUNNING, Action.HOLD, lambda: one(95, leader=(), state="PENDING"), "job is PENDING"),
    Case(Reason.STARTUP, Action.HOLD, lambda: one(10, leader=("n1", "n2"), started_ago=60),
         "started 60s ago < startup_protection_s 300s"),
    Case(Reason.COOLDOWN, Action.HOLD,
         lambda: (make_input([unit(job(100, nodes=("n1", "n2")))], nodes(3, busy=["n1", "n2"]),
                             utils=[util(100, 10)], history=[record(100, 100)]), cfg()),
         "last resize 100s ago < cooldown_s 300s (default)"),
    Case(Reason.NEAR_END, Action.HOLD, lambda: one(95, time_limit_min=65, started_ago=3600),
         "300s of time limit left < min_remaining_for_grow_s 900s"),
    Case(Reason.EXTENSION_PENDING, Action.HOLD,
         lambda: (make_input([unit(job(100, nodes=("n1",)), exts=[ext(500, (), state="PENDING", count=1)])],
                             nodes(3, busy=["n1"]), utils=[util(100, 95)]), cfg()),
         "1 extension job(s) still pending"),
    Case(Reason.GROW_DISABLED, Action.HOLD, lambda: one(95, grow=False), "but --no-grow"),
    Case(Reason.SHRINK_DISABLED, Action.HOLD, lambda: one(10, leader=("n1", "n2"), shrink=False),
         "but --no-shrink"),
    Case(Reason.INVALID_SETTINGS, Action.HOLD, invalid,
         "scale_down_below=60 (global) is not below scale_up_above=50 (directive)"),
    Case(Reason.PAUSED, Action.HOLD,
         lambda: one(12, leader=("n1", "n2"), config=cfg(partition={"gpu": {"paused": True}})),
         "paused (partition gpu); would shrink by 1: UNDERUTILIZED"),
    Case(Reason.ACTION_CAP, Action.HOLD, two_growers_capped, "max_actions_per_cycle 1 reached"),
    Case(Reason.NO_METRICS, Action.HOLD, lambda: one(None, leader=("n1", "n2")), "no utilization reported"),
    Case(Reason.STALE_METRICS, Action.HOLD,
         lambda: (make_input([unit(job(100, nodes=("n1", "n2")))], nodes(2, busy=["n1", "n2"]),
                             utils=[util(100, 5, age=600)]), cfg()),
         "last sample 600s old > max_metric_age_s 180s"),
    Case(Reason.WINDOW_NOT_FILLED, Action.HOLD,
         lambda: (make_input([unit(job(100, nodes=("n1", "n2")))], nodes(2, busy=["n1", "n2"]),
                             utils=[util(100, 5, window=300)]), cfg()),
         "samples cover 300s < window 600s"),
    Case(Reason.TOO_FEW_SAMPLES, Action.HOLD,
         lambda: (make_input([unit(job(100, nodes=("n1", "n2")))], nodes(2, busy=["n1", "n2"]),
                             utils=[util(100, 5, samples=4)]), cfg()),
         "4 samples < min_samples 10"),
    Case(Reason.NO_FREE_NODES, Action.HOLD, lambda: one(95, free=0), "no free node of partition gpu fits gpu:4"),
    Case(Reason.PENDING_HIGHER_PRIORITY, Action.HOLD, with_pending,
         "held for pending jobs of priority >= 1000 (e.g. job 900, priority 1000)"),
    Case(Reason.RESERVE_KEPT, Action.HOLD, lambda: one(95, free=1, config=cfg(free_node_reserve=1)),
         "fewer than free_node_reserve 1 free nodes in partition gpu"),
    Case(Reason.RESERVE_RECLAIM, Action.SHRINK, reclaim, "gives back 2 node(s) above min 1 so that partition gpu "
         "keeps free_node_reserve 2 (partition gpu)", basis=Basis.RESERVE, target=1),
    Case(Reason.SHRINK_TO_ADMIT, Action.SHRINK, admit, "so that pending job(s) 900 (priority 5000 > 100) can start",
         basis=Basis.QUEUE, target=1),
    Case(Reason.SHRUNK_TOO_LONG, Action.GROW, tail_regrow, "shrunk 3600s of its 7200s life (50% > "
         "max_shrunk_share 30%): back to its requested 3 node(s) first", basis=Basis.UTILIZATION, target=3),
    Case(Reason.MOLDED_REGROW, Action.GROW, molded_regrow, "molded: started below its request of 3 node(s), runs "
         "on 1; back to 3 first", basis=Basis.BOUNDS, target=3),
    Case(Reason.TAIL_PROTECTED, Action.HOLD, tail_protected, "not shrunk to admit pending job 900 (priority 5000 > "
         "100): shrunk 4000s of its 7200s life (56% > max_shrunk_share 30%) (tail_protection); otherwise IN_BAND",
         basis=Basis.QUEUE),
    Case(Reason.SPEEDUP_GAIN, Action.GROW, lambda: one(95, time_limit_min=600, config=cfg(speedup_growth=True)),
         "+1 node(s) to 1: speedup 1.739 (utilization model, mean util 95%", basis=Basis.UTILIZATION, target=2),
    Case(Reason.LOW_SPEEDUP_GAIN, Action.HOLD, lambda: one(85, time_limit_min=600, config=cfg(speedup_growth=True)),
         "marginal efficiency 0.38, saves", basis=Basis.UTILIZATION),
    Case(Reason.GOODPUT_MOVE, Action.SHRINK, goodput_move, "gives node n4 to unit 200, whose next node saves",
         basis=Basis.UTILIZATION, target=2),
    Case(Reason.FAIR_SHARE_LIMIT, Action.HOLD, fair, "account a has used its fair share", unit_id=101),
    Case(Reason.RESTART_COST, Action.HOLD, restart_cost, "expected gain 600s over the remaining 1200s <= restart "
         "cost 600s"),
    Case(Reason.LOW_MARGINAL_EFFICIENCY, Action.SHRINK, flat_throughput,
         "growing from 1 to 2 nodes gave marginal efficiency 0.05 < 0.50; shrink back", basis=Basis.THROUGHPUT,
         target=1),
    Case(Reason.QUOTA_REACHED, Action.HOLD, quota, "account acct holds 1 extension nodes >= "
         "max_extension_nodes_per_account 1"),
    Case(Reason.ACTION_IN_PROGRESS, Action.HOLD, in_progress,
         "would shrink 2 -> 1 (UNDERUTILIZED: mean util 12% < 40% over 600s (120 samples)); its shrink decided "
         "90s ago is not finished", basis=Basis.UTILIZATION),
    Case(Reason.SLO_AT_RISK, Action.GROW, lambda: serving(60), "p99 60.0ms > 90% of SLO 50ms over the last 60s",
         basis=Basis.SERVING, target=2),
    Case(Reason.SLO_PEAK_AHEAD, Action.GROW, lambda: serving(20, 50, forecast=200, target_rps_per_replica=100),
         "forecast 200.0 req/s in 60s needs 3 replicas at 90% of 100.0 req/s, 1 run", basis=Basis.SERVING,
         target=3),
    Case(Reason.SLO_HEADROOM, Action.SHRINK, lambda: serving(10, leader=("n1", "n2")),
         "p99 <= 10.0ms < 70% of SLO 50ms over the last 900s", basis=Basis.SERVING, target=1),
    Case(Reason.SLO_MET, Action.HOLD, lambda: serving(40, leader=("n1", "n2")),
         "objective met, not enough latency headroom over 900s", basis=Basis.SERVING),
    Case(Reason.REPLICA_WARMING, Action.HOLD, lambda: serving(60, exts=(ext(500, ("n2",), started_ago=30),)),
         "but replicas added 30s ago are still starting (cold start 60s)", basis=Basis.SERVING),
    Case(Reason.SERVING_RECLAIM, Action.SHRINK, serving_reclaim,
         "gives back 1 node(s) above min 1 to serving unit(s) 100 whose SLO is at risk", unit_id=200,
         basis=Basis.SERVING, target=1),
    Case(Reason.POWER_RESUME_COST, Action.HOLD, resume_cost, "no powered-on free node fits, and resuming n2 "
         "(~120s, default) plus a 60s restart costs 180s >= the expected gain 114s over the remaining 300s"),
    Case(Reason.GROW_BACKOFF, Action.HOLD, backoff,
         "1 extension job(s) ended on their own within 600s (last 500: FAILED); next grow in 15s"),
]


def _decision(case: Case) -> Decision:
    inp, config = case.build()
    by_id = {d.unit_id: d for d in decide(inp, config, NOW)}
    return by_id[case.unit_id]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.reason.value)
def test_reason(case: Case) -> None:
    d = _decision(case)
    assert (d.action, d.reason) == (case.action, case.reason), d.message
    assert case.message in d.message
    if case.basis is not None:
        assert d.basis is case.basis
    if case.target is not None:
        assert d.target_nodes == case.target
    if d.action is Action.HOLD:
        assert d.target_nodes == d.current_nodes


def test_every_reason_has_a_case() -> None:
    assert {c.reason for c in CASES} == set(Reason) - SHELL_REASONS  # those are recorded by the controller


def test_global_pause_and_paused_jobs_keep_deciding() -> None:
    inp, _ = one(95)
    (d,) = decide(inp, cfg(paused=True), NOW)
    assert (d.action, d.reason) == (Action.HOLD, Reason.PAUSED)
    assert d.message.startswith("paused (global); would grow by 1: OVERUTILIZED: mean util 95%")
    assert d.inputs["would"] == "OVERUTILIZED"
    (d,) = decide(inp, cfg(paused_jobs=[100]), NOW)
    assert d.message.startswith("paused (paused_jobs); would grow")
    inp, _ = one(60)
    (d,) = decide(inp, cfg(paused=True), NOW)
    assert d.reason is Reason.PAUSED and "would hold: IN_BAND" in d.message


def test_decision_inputs_are_read_only_and_carry_provenance() -> None:
    inp, _ = one(30, leader=("n1", "n2"), scale_down_below=25)
    (d,) = decide(inp, default_config(), NOW)
    assert d.reason is Reason.IN_BAND  # the directive's 25% wins over the default
    assert d.inputs["scale_down_below.source"] == "directive"
    assert d.inputs["scale_up_above.source"] == "default"
    with pytest.raises(TypeError):
        d.inputs["x"] = 1  # type: ignore[index]
