"""Slurm's GPU limits (GrpTRES, MaxTRESPerUser/PerAccount gres/gpu) as quotas on grows (policy/gpulimits.py)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from slurm_elastic.policy import Action, Decision, Reason, decide
from slurm_elastic.policy.gpulimits import scope_key
from slurm_elastic.slurm.model import Job
from tests.unit.policy_builders import NOW, cfg, ext, job, make_input, nodes, unit, util

# The unit under test: job 100 of alice, account a, QOS q, 1 node with 4 GPUs, busy, wants +3 nodes.
LEADER: dict[str, Any] = {"account": "a", "qos": "q", "user": "alice"}


def _other(job_id: int, node: str, **kw: Any) -> Job:
    """Another running job on ``node`` with 4 GPUs (defaults: alice, account a, QOS q)."""
    return job(job_id, nodes=(node,), **{**LEADER, **kw})


def _grow(limits: dict[str, int], others: tuple[Job, ...] = (), gpus: int = 4) -> Decision:
    u = unit(job(100, nodes=("n1",), gpus=gpus, **LEADER), step=3, max_nodes=8)
    busy = ["n1", *(o.nodes[0] for o in others if o.nodes)]
    inp = make_input([u], nodes(8, busy=busy), other_jobs=others, utils=[util(100, 95)])
    inp = type(inp)(inp.snapshot, inp.units, inp.utilization, inp.history, inp.account_shares, limits)
    return decide(inp, cfg(), NOW)[0]


# (case, limits, other running jobs, expected nodes added (0: QUOTA_REACHED), text in the message)
CASES: list[tuple[str, dict[str, int], tuple[Job, ...], int, str]] = [
    ("no limits", {}, (), 3, "+3 node(s)"),
    ("limit elsewhere", {"account:b": 0, "qos:other": 0}, (), 3, "+3 node(s)"),
    ("account leaves 2 nodes", {"account:a": 12}, (), 2, "account a GrpTRES gres/gpu=12 with 4 GPU(s) in use"),
    ("account full", {"account:a": 4}, (), 0, "account a GrpTRES gres/gpu=4 with 4 GPU(s) in use leaves 0"),
    ("part of a node is no node", {"account:a": 7}, (), 0, "leaves 3 (4 per node)"),
    ("unlimited is negative", {"account:a": -1}, (), 3, "+3 node(s)"),
    ("same account's job counts", {"account:a": 12}, (_other(300, "n2", user="bob"),), 1, "8 GPU(s) in use"),
    ("other account's job does not", {"account:a": 12}, (_other(300, "n2", account="b"),), 2, "4 GPU(s) in use"),
    ("pending jobs do not count", {"account:a": 12},
     (job(301, nodes=(), state="PENDING", node_count=2, reason="AssocGrpGRES", **LEADER),), 2, "4 GPU(s) in use"),
    ("user association", {scope_key("user", "a", "alice"): 8}, (), 1, "association a/alice GrpTRES gres/gpu=8"),
    ("another user's association", {scope_key("user", "a", "bob"): 0}, (), 3, "+3 node(s)"),
    ("QOS GrpTRES", {"qos:q": 8}, (_other(300, "n2", account="b", user="bob"),), 0, "QOS q GrpTRES gres/gpu=8"),
    ("QOS per user: other users free", {"qos_user:q": 8}, (_other(300, "n2", user="bob"),), 1,
     "QOS q MaxTRESPerUser (user alice) gres/gpu=8 with 4 GPU(s)"),
    ("QOS per user: own jobs count", {"qos_user:q": 8}, (_other(300, "n2"),), 0, "MaxTRESPerUser"),
    ("QOS per account", {"qos_account:q": 16}, (_other(300, "n2", account="b"), _other(301, "n3")), 2,
     "QOS q MaxTRESPerAccount (account a) gres/gpu=16 with 8 GPU(s)"),
    ("tightest wins", {"account:a": 100, "qos:q": 8, "user:a/alice": 12}, (), 1, "QOS q GrpTRES gres/gpu=8"),
    ("other QOS's jobs", {"qos:q": 8}, (_other(300, "n2", qos="r"),), 1, "QOS q GrpTRES"),
]


@pytest.mark.parametrize(("case", "limits", "others", "added", "text"), CASES, ids=[c[0] for c in CASES])
def test_grow_within_slurm_gpu_limits(case: str, limits: dict[str, int], others: tuple[Job, ...], added: int,
                                      text: str) -> None:
    d = _grow(limits, others)
    if added == 0:
        assert (d.action, d.reason) == (Action.HOLD, Reason.QUOTA_REACHED), d.message
        assert "Slurm would leave an extension job pending" in d.message
    else:
        assert d.action is Action.GROW, d.message
        assert d.target_nodes == 1 + added
        assert d.grow is not None and len(d.grow.nodes) == added
        if added < 3:
            assert f"+{added} of 3 wanted, limited by" in d.message
    assert text in d.message


def test_the_tightest_limit_is_recorded_in_the_inputs() -> None:
    d = _grow({"account:a": 100, "qos:q": 8})
    assert d.inputs["gpu_limit_left"] == 4 and d.inputs["gpu_limit_scope"] == "qos:q"
    assert "gpu_limit_left" not in _grow({}).inputs


def test_a_unit_without_gpus_is_not_limited_by_gpu_limits() -> None:
    d = _grow({"account:a": 0}, gpus=0)
    assert d.action is Action.GROW and d.target_nodes == 4


def _two_units(limits: dict[str, int], first_exts: tuple[Any, ...] = ()) -> dict[int, Decision]:
    first = unit(job(100, nodes=("n1",), priority=900, **LEADER), exts=first_exts, step=3, max_nodes=8)
    second = unit(job(200, nodes=("n2",), priority=100, **LEADER), step=3, max_nodes=8)
    inp = make_input([first, second], nodes(8, busy=["n1", "n2"]), utils=[util(100, 95), util(200, 95)])
    inp = type(inp)(inp.snapshot, inp.units, inp.utilization, inp.history, inp.account_shares, limits)
    return {d.unit_id: d for d in decide(inp, cfg(), NOW)}


def test_grants_of_the_same_cycle_count() -> None:
    d = _two_units({"account:a": 16})  # 8 in use: room for 2 nodes, all to the higher priority
    assert d[100].action is Action.GROW and d[100].target_nodes == 3
    assert d[200].reason is Reason.QUOTA_REACHED and "with 16 GPU(s) in use" in d[200].message


def test_our_pending_extension_jobs_count() -> None:
    # Unit 100 has a 1-node extension pending: it will take 4 GPUs when it starts.
    d = _two_units({"account:a": 12}, first_exts=(ext(500, (), state="PENDING", count=1, started_ago=None),))
    assert d[100].reason is Reason.EXTENSION_PENDING
    assert d[200].reason is Reason.QUOTA_REACHED and "with 12 GPU(s) in use" in d[200].message


def test_deterministic_whatever_the_order() -> None:
    others = (_other(300, "n2"), _other(301, "n3", account="b", user="carol"), _other(302, "n4", user="bob"))
    u1 = unit(job(100, nodes=("n1",), priority=900, **LEADER), step=3, max_nodes=8)
    u2 = unit(job(200, nodes=("n5",), priority=100, **LEADER), step=3, max_nodes=8)
    limits = {"account:a": 24, "qos_user:q": 16, "qos:q": 40}
    base = make_input([u1, u2], nodes(10, busy=["n1", "n2", "n3", "n4", "n5"]), other_jobs=others,
                      utils=[util(100, 95), util(200, 95)])
    expected = None
    rng = random.Random(9)
    for _ in range(6):
        jobs = list(base.snapshot.jobs)
        units = list(base.units)
        keys = list(limits.items())
        rng.shuffle(jobs)
        rng.shuffle(units)
        rng.shuffle(keys)
        snap = type(base.snapshot)(base.snapshot.taken_at, tuple(jobs), base.snapshot.nodes,
                                   base.snapshot.partitions)
        inp = type(base)(snap, tuple(units), base.utilization, (), {}, dict(keys))
        got = [d.to_dict() for d in decide(inp, cfg(), NOW)]
        assert expected is None or got == expected
        expected = got
    assert expected is not None
    # alice's QOS q jobs use 12 of MaxTRESPerUser 16: one node for the higher priority, none left after it
    assert [(d["action"], d["target_nodes"], d["reason"]) for d in expected] == [
        ("grow", 2, "OVERUTILIZED"), ("hold", 1, "QUOTA_REACHED")]


def test_scope_key_refuses_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="unknown GPU limit scope"):
        scope_key("partition", "gpu")


def _grow_as_extension_qos(limits: dict[str, int], others: tuple[Job, ...] = (), **cfg_values: Any) -> Decision:
    """The same unit, with extension jobs submitted in QOS "scav" ([extension] qos)."""
    u = unit(job(100, nodes=("n1",), **LEADER), step=3, max_nodes=8)
    busy = ["n1", *(o.nodes[0] for o in others if o.nodes)]
    inp = make_input([u], nodes(8, busy=busy), other_jobs=others, utils=[util(100, 95)])
    inp = type(inp)(inp.snapshot, inp.units, inp.utilization, inp.history, inp.account_shares, limits, "scav")
    return decide(inp, cfg(**cfg_values), NOW)[0]


def test_with_an_extension_qos_its_limits_apply_not_the_leaders() -> None:
    # The leader's QOS is full, but extensions run in "scav": they are not held by q's limit.
    d = _grow_as_extension_qos({"qos:q": 4})
    assert d.action is Action.GROW and d.target_nodes == 4
    # scav's own GrpTRES, with another scavenger job running, leaves one node.
    d = _grow_as_extension_qos({"qos:scav": 8}, (_other(300, "n2", account="b", user="bob", qos="scav"),))
    assert d.action is Action.GROW and d.target_nodes == 2 and "QOS scav GrpTRES gres/gpu=8" in d.message
    # The policy's own per-QOS extension quota is counted in the extension QOS too.
    d = _grow_as_extension_qos({}, qos={"scav": {"max_extension_nodes_per_qos": 1}})
    assert d.target_nodes == 2 and "QOS scav quota" in d.message
