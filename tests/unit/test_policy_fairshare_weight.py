"""The fair-share weight a grow decision used is recorded in its inputs (for explain and the DB)."""

from __future__ import annotations

from slurm_elastic.policy import Action, Reason, decide
from tests.unit.policy_builders import NOW, cfg, job, make_input, nodes, unit, util


def test_weights_from_account_shares_are_recorded_and_decide_one_spare_node() -> None:
    # One spare node, bob's vision job has the higher priority, nlp has the larger share: nlp gets the node.
    alice = unit(job(100, nodes=("n1",), priority=100, account="nlp"), step=2)
    bob = unit(job(200, nodes=("n2",), priority=900, account="vision", user="bob"), step=2)
    inp = make_input([alice, bob], nodes(3, busy=["n1", "n2"]), utils=[util(100, 95), util(200, 95)],
                     shares={"nlp": 0.5, "vision": 0.25})
    d = {x.unit_id: x for x in decide(inp, cfg(fair_share=True), NOW)}
    assert d[100].action is Action.GROW and d[100].target_nodes == 2
    assert d[100].inputs["account_weight"] == 0.5 and d[100].inputs["account_weight.source"] == "account_shares"
    assert d[200].reason is Reason.FAIR_SHARE_LIMIT
    assert d[200].inputs["account_weight"] == 0.25 and d[200].inputs["fair_share_nodes_left"] == 0
    # Without weights (sshare unreadable): equal weights, recorded as defaults.
    d = {x.unit_id: x for x in decide(make_input([alice, bob], nodes(3, busy=["n1", "n2"]),
                                                 utils=[util(100, 95), util(200, 95)]), cfg(fair_share=True), NOW)}
    assert d[100].inputs["account_weight.source"] == "default" and d[100].inputs["account_weight"] == 1.0
