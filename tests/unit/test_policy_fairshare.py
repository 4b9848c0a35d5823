"""Fair share of spare nodes among accounts, and quotas on extension nodes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_elastic.policy import Action, Decision, Reason, decide
from slurm_elastic.policy.fairshare import account_weight, split_spare
from tests.unit.policy_builders import NOW, cfg, ext, job, make_input, nodes, unit, util


@pytest.mark.parametrize(
    ("spare", "demand", "shares", "expected"),
    [
        (4, {"a": 10, "b": 10}, {"a": 3, "b": 1}, {"a": 3, "b": 1}),
        (4, {"a": 10, "b": 10}, {"a": 1, "b": 1}, {"a": 2, "b": 2}),
        (2, {"a": 10, "b": 10}, {"a": 0.99, "b": 0.01}, {"a": 1, "b": 1}),  # nobody takes all
        (5, {"a": 1, "b": 10}, {"a": 9, "b": 1}, {"a": 1, "b": 4}),  # a's unused share goes to b
        (3, {"a": 10}, {}, {"a": 3}),
        (1, {"a": 5, "b": 5}, {"a": 1, "b": 2}, {"a": 0, "b": 1}),  # one node: the heavier account
        (0, {"a": 5}, {"a": 1}, {"a": 0}),
        (6, {"a": 2, "b": 2, "c": 2}, {"a": 1}, {"a": 2, "b": 2, "c": 2}),
    ],
)
def test_split_spare(spare: int, demand: dict[str, int], shares: dict[str, float], expected: dict[str, int]) -> None:
    assert split_spare(spare, demand, shares) == expected


def test_unknown_accounts_get_the_smallest_known_weight() -> None:
    assert account_weight({"a": 0.5, "b": 0.1}, "c") == 0.1
    assert account_weight({}, "c") == 1.0
    assert account_weight({"a": 0.0}, "a") == 1.0


@given(
    spare=st.integers(0, 50),
    demand=st.dictionaries(st.sampled_from("abcde"), st.integers(0, 20), max_size=5),
    shares=st.dictionaries(st.sampled_from("abcde"), st.floats(0, 10), max_size=5),
)
def test_split_spare_properties(spare: int, demand: dict[str, int], shares: dict[str, float]) -> None:
    alloc = split_spare(spare, demand, shares)
    assert sum(alloc.values()) == min(spare, sum(demand.values()))  # work-conserving, never over
    assert all(0 <= alloc[a] <= demand[a] for a in demand)
    wanting = [a for a, d in demand.items() if d > 0]
    if spare >= len(wanting):
        assert all(alloc[a] >= 1 for a in wanting)  # nobody shut out while nodes last
    assert split_spare(spare, dict(reversed(list(demand.items()))), shares) == alloc


def _decide(**kw: Any) -> dict[int, Decision]:
    a1 = unit(job(100, nodes=("n1",), priority=900, account="a"), step=4, max_nodes=8)
    a2 = unit(job(101, nodes=("n2",), priority=800, account="a"), step=4, max_nodes=8)
    b = unit(job(200, nodes=("n3",), priority=100, account="b"), step=4, max_nodes=8)
    shares = kw.pop("shares", {"a": 0.5, "b": 0.5})
    inp = make_input([a1, a2, b], nodes(7, busy=["n1", "n2", "n3"]),
                     utils=[util(100, 95), util(101, 95), util(200, 95)], shares=shares)
    return {d.unit_id: d for d in decide(inp, cfg(**kw), NOW)}


def test_without_fair_share_priority_takes_everything() -> None:
    d = _decide()
    assert d[100].target_nodes == 5 and d[200].reason is Reason.NO_FREE_NODES


def test_fair_share_splits_spare_nodes_by_account_weight() -> None:
    d = _decide(fair_share=True)
    assert d[100].action is Action.GROW and d[100].target_nodes == 3  # account a: 2 of 4 spare nodes
    assert "limited by account a fair share" in d[100].message
    assert d[101].reason is Reason.FAIR_SHARE_LIMIT
    assert d[200].action is Action.GROW and d[200].target_nodes == 3
    d = _decide(fair_share=True, shares={"a": 3, "b": 1})
    assert (d[100].target_nodes, d[200].target_nodes) == (4, 2)


def test_fair_share_per_partition_switch() -> None:
    assert _decide(partition={"gpu": {"fair_share": True}})[200].action is Action.GROW


def test_fair_share_respects_the_reserve() -> None:
    d = _decide(fair_share=True, free_node_reserve=2)
    assert d[100].target_nodes + d[200].target_nodes - 2 == 2


def test_quota_per_account_and_qos() -> None:
    u = unit(job(100, nodes=("n1",), account="a", qos="q"), exts=[ext(500, ("n2",))], step=3, max_nodes=8)
    inp = make_input([u], nodes(8, busy=["n1", "n2"]), utils=[util(100, 95)])
    d = decide(inp, cfg(account={"a": {"max_extension_nodes_per_account": 3}}), NOW)[0]
    assert d.target_nodes == 4 and "limited by account a quota" in d.message
    d = decide(inp, cfg(qos={"q": {"max_extension_nodes_per_qos": 1}}), NOW)[0]
    assert d.reason is Reason.QUOTA_REACHED and "QOS q holds 1 extension nodes" in d.message
    d = decide(inp, cfg(max_extension_nodes_per_account=2), NOW)[0]  # a global value applies to each account
    assert d.target_nodes == 3


def test_gpu_quota_per_account_and_qos() -> None:
    """4 GPUs per node; the unit's extension on n2 holds 4 GPUs of account a / QOS q."""
    u = unit(job(100, nodes=("n1",), account="a", qos="q"), exts=[ext(500, ("n2",))], step=3, max_nodes=8)
    inp = make_input([u], nodes(8, busy=["n1", "n2"]), utils=[util(100, 95)])
    d = decide(inp, cfg(account={"a": {"max_extension_gpus_per_account": 12}}), NOW)[0]
    assert d.target_nodes == 4 and "limited by account a GPU quota" in d.message  # (12 - 4) // 4 = 2 nodes
    assert d.inputs["gpus_account_quota_left"] == 8
    d = decide(inp, cfg(account={"a": {"max_extension_gpus_per_account": 7}}), NOW)[0]
    assert d.reason is Reason.QUOTA_REACHED and "account a holds 4 extension GPUs (4 per node)" in d.message
    d = decide(inp, cfg(qos={"q": {"max_extension_gpus_per_qos": 4}}), NOW)[0]
    assert d.reason is Reason.QUOTA_REACHED and "max_extension_gpus_per_qos 4" in d.message


def test_growth_cap_percent_of_the_cluster_per_partition() -> None:
    """8 nodes; the unit's partition holds 2 (n1, n2). A 50% cap leaves room for 2 more; 25% for none."""
    u = unit(job(100, nodes=("n1", "n2"), account="a"), step=4, max_nodes=8)
    inp = make_input([u], nodes(8, busy=["n1", "n2"]), utils=[util(100, 95)])
    d = decide(inp, cfg(partition={"gpu": {"growth_cap_percent": 50}}), NOW)[0]
    assert d.target_nodes == 4 and "growth_cap_percent 50%" in d.message and d.inputs["growth_cap_nodes_left"] == 2
    d = decide(inp, cfg(growth_cap_percent=25), NOW)[0]
    assert d.reason is Reason.QUOTA_REACHED and "hold 2 of the cluster's 8 nodes >= growth_cap_percent 25%" in d.message
    d = decide(inp, cfg(partition={"other": {"growth_cap_percent": 0}}), NOW)[0]  # another partition's cap
    assert d.target_nodes == 6
