"""GPU-granular growth (gpu_granular_growth, policy/gpugrain.py): a grow with no whole free node takes k GPUs of a
partly used node as one extension job; --whole-nodes, pending jobs, own nodes and quotas keep it from doing so."""

from __future__ import annotations

from typing import Any

from slurm_elastic.policy import Action, Reason, decide
from slurm_elastic.policy.model import Decision, PolicyInput
from slurm_elastic.slurm.model import GresCount
from tests.unit.policy_builders import NOW, cfg, ext, job, make_input, node, pending, unit, util

# n1: the elastic job 10 (4 GPUs); n2: job 20 holds 2 of 4 GPUs; n3, n4: full.
BUSY = [node("n1", used=4), node("n2", used=2), node("n3", used=4), node("n4", used=4)]
OTHER = [job(20, nodes=("n2",), gpus=2, priority=500)]


def _one(inp: PolicyInput, **keys: Any) -> Decision:
    return {d.unit_id: d for d in decide(inp, cfg(**keys), NOW)}[10]


def _busy_unit(**spec_kw: Any) -> PolicyInput:
    return make_input([unit(job(10, nodes=("n1",)), **spec_kw)], BUSY, other_jobs=OTHER, utils=[util(10, 95)])


def test_off_by_default_no_whole_node_means_no_grow() -> None:
    d = _one(_busy_unit())
    assert d.action is Action.HOLD and d.reason is Reason.NO_FREE_NODES


def test_on_a_refused_grow_takes_the_free_gpus_of_a_shared_node() -> None:
    d = _one(_busy_unit(), gpu_granular_growth=True)
    assert d.action is Action.GROW and d.reason is Reason.OVERUTILIZED
    assert (d.current_nodes, d.target_nodes) == (1, 2)
    assert d.grow is not None and d.grow.nodes == ("n2",)
    assert d.grow.gres_per_node == (GresCount("gpu", None, 2),)
    assert d.inputs["grow_gpus"] == 2 and d.inputs["grow_node"] == "n2"
    assert "+2 GPU(s) on n2" in d.message and ", but " not in d.message


def test_at_most_the_units_gpus_per_node() -> None:
    two = make_input([unit(job(10, nodes=("n1",), gpus=1))],
                     [node("n1", used=1, state="ALLOCATED"), node("n2", used=1), node("n3", used=4),
                      node("n4", used=4)],
                     other_jobs=[job(20, nodes=("n2",), gpus=1)], utils=[util(10, 95, gpus=1)])
    d = _one(two, gpu_granular_growth=True)
    assert d.grow is not None and d.grow.nodes == ("n2",) and d.grow.gres_per_node == (GresCount("gpu", None, 1),)


def test_whole_nodes_directive_keeps_whole_nodes() -> None:
    d = _one(_busy_unit(whole_nodes=True), gpu_granular_growth=True)
    assert d.action is Action.HOLD and d.reason is Reason.NO_FREE_NODES


def test_a_whole_free_node_still_goes_whole() -> None:
    nodes = [*BUSY[:3], node("n4")]
    inp = make_input([unit(job(10, nodes=("n1",)))], nodes, other_jobs=OTHER, utils=[util(10, 95)])
    d = _one(inp, gpu_granular_growth=True)
    assert d.grow is not None and d.grow.nodes == ("n4",) and d.grow.gres_per_node == (GresCount("gpu", None, 4),)


def test_a_pending_job_that_fits_keeps_the_gpus_whatever_its_priority() -> None:
    # Slurm's backfill would start a lower-priority job on those GPUs too.
    for prio in (2000, 10):
        inp = make_input([unit(job(10, nodes=("n1",)))], BUSY, other_jobs=OTHER, utils=[util(10, 95)],
                         pending_jobs=[pending(30, gpus=2, priority=prio)])
        d = _one(inp, gpu_granular_growth=True)
        assert d.action is Action.HOLD and d.reason is Reason.NO_FREE_NODES
    one = make_input([unit(job(10, nodes=("n1",)))], BUSY, other_jobs=OTHER, utils=[util(10, 95)],
                     pending_jobs=[pending(30, gpus=1, priority=10)])
    d = _one(one, gpu_granular_growth=True)  # the 1-GPU job leaves one of n2's two free GPUs
    assert d.grow is not None and d.grow.gres_per_node == (GresCount("gpu", None, 1),)


def test_never_its_own_node() -> None:
    inp = make_input([unit(job(10, nodes=("n1",), gpus=2))],
                     [node("n1", used=2), node("n2", used=4), node("n3", used=4), node("n4", used=4)],
                     utils=[util(10, 95, gpus=2)])
    d = _one(inp, gpu_granular_growth=True)
    assert d.action is Action.HOLD and d.reason is Reason.NO_FREE_NODES


def test_not_onto_a_node_a_pending_extension_asked_for() -> None:
    other = make_input([unit(job(10, nodes=("n1",))), unit(job(11, nodes=("n3",)), exts=[ext(12, ("n2",),
                        state="PENDING", started_ago=None)])], BUSY, other_jobs=OTHER, utils=[util(10, 95)])
    d = _one(other, gpu_granular_growth=True)
    assert d.action is Action.HOLD


def test_extension_quotas_keep_whole_nodes() -> None:
    d = _one(_busy_unit(), gpu_granular_growth=True, max_extension_gpus_per_account=100)
    assert d.action is Action.HOLD and d.reason is Reason.NO_FREE_NODES


def test_a_shrink_gives_the_gpus_back_by_cancelling_the_extension() -> None:
    # job 10 grew by 2 GPUs on n2 (extension 11); now idle: the shrink cancels extension 11, the leader stays.
    grown = make_input([unit(job(10, nodes=("n1",)), exts=[ext(11, ("n2",))])], BUSY, other_jobs=OTHER,
                       utils=[util(10, 5)])
    d = _one(grown, gpu_granular_growth=True)
    assert d.action is Action.SHRINK and (d.current_nodes, d.target_nodes) == (2, 1)
    assert d.shrink is not None and d.shrink.cancel_extensions == (11,) and d.shrink.leader_keep_nodes is None


def test_a_pending_job_that_fits_no_node_still_keeps_the_free_gpus_it_could_use() -> None:
    # job 30 asks 2 nodes x 4 GPUs: no partly used node fits one of its nodes, but a job asking GPUs per job
    # could start on them; the grow waits behind it (the simulator measured the difference).
    inp = make_input([unit(job(10, nodes=("n1",)))], BUSY, other_jobs=OTHER, utils=[util(10, 95)],
                     pending_jobs=[pending(30, count=2, gpus=4, priority=2000)])
    d = _one(inp, gpu_granular_growth=True)
    assert d.action is Action.HOLD and d.reason is Reason.NO_FREE_NODES
