"""extend_time_limit_on_shrink: a shrink from n to m nodes adds remaining x (n/m - 1) to the job's time limit; a
later grow from m to n gives back remaining x (1 - m/n), at most what shrinks added."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_elastic.policy import Action, Decision, ElasticUnit, Reason, decide, default_config, resolve_unit
from slurm_elastic.policy.shrink import time_limit_extension_s, time_limit_giveback_s
from tests.unit.policy_builders import NOW, cfg, job, make_input, node, nodes, pending, unit, util


def _decide(u: ElasticUnit, mean: float = 5, **cfg_values: Any) -> Decision:
    inp = make_input([u], nodes(8, busy=u.job.nodes), utils=[util(u.unit_id, mean)])
    (d,) = decide(inp, cfg(**cfg_values), NOW)
    return d


def _idle(limit_min: int | None, started_ago: float = 3600, n: int = 3, **spec_kw: Any) -> ElasticUnit:
    names = tuple(f"n{i}" for i in range(1, n + 1))
    return unit(job(10, nodes=names, time_limit_min=limit_min, started_ago=started_ago), **spec_kw)


def test_on_by_default_with_a_one_day_cap() -> None:
    s = resolve_unit(default_config(), _idle(120))
    assert s.extend_time_limit_on_shrink is True and s.max_time_limit_extension_s == 86400


@pytest.mark.parametrize(
    ("limit_min", "step", "add_s"),
    [
        (120, 1, 1800),  # 3600 s left, 3 -> 2 nodes: 3600 x (3/2 - 1)
        (120, 2, 7200),  # 3 -> 1: 3600 x 2
        (61, 1, 60),  # 60 s left x 0.5 = 30 s, rounded up to a whole minute
    ],
)
def test_underutilized_shrink_adds_remaining_times_ratio(limit_min: int, step: int, add_s: int) -> None:
    d = _decide(_idle(limit_min), step=step)
    assert d.action is Action.SHRINK and d.reason is Reason.UNDERUTILIZED
    assert d.shrink is not None and d.shrink.time_limit_add_s == add_s
    assert d.inputs["time_limit_add_s"] == add_s
    assert d.inputs["remaining_s"] == limit_min * 60 - 3600
    assert f"time limit +{add_s // 60}min" in d.message
    assert d.shrink.to_dict()["time_limit_add_s"] == add_s


def test_capped_per_shrink() -> None:
    d = _decide(_idle(600), step=2, max_time_limit_extension_s=3000)  # 9 h left x 2, capped at 50 min
    assert d.shrink is not None and d.shrink.time_limit_add_s == 3000
    assert "capped by max_time_limit_extension_s" in d.message
    assert d.inputs["max_time_limit_extension_s.source"] == "global"


def test_unlimited_overrun_or_switched_off_adds_nothing() -> None:
    d = _decide(_idle(None))
    assert d.action is Action.SHRINK and d.shrink is not None and d.shrink.time_limit_add_s == 0
    assert "time_limit_add_s" not in d.inputs and "time limit" not in d.message
    d = _decide(_idle(50))  # started an hour ago with a 50 min limit: already overrun
    assert d.shrink is not None and d.shrink.time_limit_add_s == 0 and d.inputs["time_limit_add_s"] == 0
    d = _decide(_idle(120), extend_time_limit_on_shrink=False)
    assert d.action is Action.SHRINK and d.shrink is not None and d.shrink.time_limit_add_s == 0
    assert "time_limit_add_s" not in d.inputs


def test_per_scope() -> None:
    config = cfg(extend_time_limit_on_shrink=False, partition={"gpu": {"extend_time_limit_on_shrink": True}})
    u = _idle(120)
    inp = make_input([u], nodes(8, busy=u.job.nodes), utils=[util(10, 5)])
    (d,) = decide(inp, config, NOW)
    assert d.shrink is not None and d.shrink.time_limit_add_s == 1800


def test_shrink_to_admit_extends_too() -> None:
    u = unit(job(100, nodes=("n1", "n2", "n3", "n4"), priority=10, time_limit_min=240), min_nodes=1)
    busy = [node(n, used=4) for n in ("n1", "n2", "n3", "n4")]
    inp = make_input([u], busy, pending_jobs=[pending(900, count=2, priority=100)], utils=[util(100, 60)])
    (d,) = decide(inp, cfg(shrink_to_admit=True), NOW)
    assert d.reason is Reason.SHRINK_TO_ADMIT and d.target_nodes == 2
    assert d.shrink is not None and d.shrink.time_limit_add_s == 3 * 3600  # 3 h left x (4/2 - 1)
    assert "time limit +180min" in d.message


def test_above_max_extends_too() -> None:
    d = _decide(_idle(120, n=4, max_nodes=2), mean=60)
    assert d.reason is Reason.ABOVE_MAX and d.target_nodes == 2
    assert d.shrink is not None and d.shrink.time_limit_add_s == 3600


def test_holds_and_grows_carry_no_extension() -> None:
    assert "time_limit_add_s" not in _decide(_idle(120), mean=60).inputs  # in band
    grow = _decide(_idle(120, n=1), mean=95)
    assert grow.action is Action.GROW and "time_limit_add_s" not in grow.inputs
    assert grow.grow is not None and grow.grow.time_limit_sub_s == 0  # nothing was added: nothing to give back


def _extended(limit_min: int, added_min: int, n: int = 1) -> ElasticUnit:
    """A busy job on ``n`` nodes whose limit shrinks raised by ``added_min`` (started an hour ago)."""
    u = _idle(limit_min, n=n)
    return ElasticUnit(u.job, u.spec, u.extensions, u.submitted_nodes, time_limit_added_s=added_min * 60)


def test_a_grow_gives_back_what_shrinks_added() -> None:
    # 120 min left at 1 node; 1 -> 2 nodes (step 1): half of it, 60 min, is no longer needed.
    d = _decide(_extended(180, added_min=90), mean=95)
    assert d.action is Action.GROW and d.target_nodes == 2 and d.grow is not None
    assert d.grow.time_limit_sub_s == 3600
    assert d.grow.time_limit_s == 7200 - 3600  # the extension job never outlives the leader's new limit
    assert d.inputs["time_limit_added_s"] == 5400 and d.inputs["time_limit_sub_s"] == 3600
    assert "time limit -60min: 7200s left x (1 - 1/2), out of +90min added by shrinks" in d.message


def test_the_give_back_is_at_most_what_was_added_and_off_with_the_switch() -> None:
    d = _decide(_extended(180, added_min=20), mean=95)  # 60 min would be spare; only 20 were ever added
    assert d.grow is not None and d.grow.time_limit_sub_s == 1200 and d.grow.time_limit_s == 7200 - 1200
    d = _decide(_extended(180, added_min=90), mean=95, extend_time_limit_on_shrink=False)
    assert d.grow is not None and d.grow.time_limit_sub_s == 0 and "time limit" not in d.message


@pytest.mark.parametrize(
    ("remaining", "before", "after", "added", "want"),
    [
        (7200, 1, 2, 86400, 3600),
        (7200, 2, 3, 86400, 2400),
        (7200, 1, 2, 600, 600),  # at most what was added
        (7200, 1, 2, 659, 600),  # whole minutes, rounded down
        (119, 1, 2, 86400, 0),  # 59.5 s spare: under a minute
        (None, 1, 2, 86400, 0),
        (0, 1, 2, 86400, 0),
        (7200, 2, 2, 86400, 0),
        (7200, 2, 1, 86400, 0),  # not a grow
        (7200, 1, 2, 0, 0),
    ],
)
def test_giveback_arithmetic(remaining: float | None, before: int, after: int, added: int, want: int) -> None:
    assert time_limit_giveback_s(remaining, before, after, added) == want


@pytest.mark.parametrize(
    ("remaining", "before", "after", "cap", "want"),
    [
        (3600, 2, 1, 86400, 3600),
        (3600, 4, 3, 86400, 1200),
        (59, 2, 1, 86400, 60),
        (3600, 2, 1, 90, 60),  # the cap in whole minutes
        (3600, 2, 1, 0, 0),
        (None, 2, 1, 86400, 0),
        (0, 2, 1, 86400, 0),
        (3600, 2, 2, 86400, 0),
        (3600, 2, 0, 86400, 0),
    ],
)
def test_extension_arithmetic(remaining: float | None, before: int, after: int, cap: int, want: int) -> None:
    assert time_limit_extension_s(remaining, before, after, cap) == want
