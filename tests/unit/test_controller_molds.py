"""Moldable start in the controller (controller/molds.py, the actuator's mold): an in-memory Slurm, a fake clock.
The live-cluster test is tests/cluster/test_moldable_start.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_elastic.controller.config import ControllerConfig
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.policy import parse_config
from slurm_elastic.slurm.errors import SlurmError
from slurm_elastic.slurm.model import Job
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import ActionKind, ActionState, DecisionFilter
from tests.policy_text import UNIT, policy_text
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import POLICY, T0, Agents, FakeSlurm, run

MOLDABLE = parse_config(policy_text(UNIT, moldable_start=True, step=2))
ELASTIC = "#!/bin/bash\n#ELASTIC --min-nodes 1\nsrun train\n"  # no --max-nodes: the request is the max


class MoldingSlurm(FakeSlurm):
    def batch_script(self, job_id: int) -> str:
        return ELASTIC

    def mold(self, job: Job, min_nodes: int, max_nodes: int, time_limit_min: int | None) -> None:
        self.calls.append(("mold", (job.job_id, min_nodes, max_nodes, time_limit_min)))
        self.jobs[job.job_id] = replace(job, node_count=min_nodes, time_limit_min=time_limit_min)


def _world(*, dry_run: bool = False) -> tuple[Controller, MoldingSlurm, Agents, FakeClock, SqlStore]:
    clock = FakeClock(T0)
    store = memory_store(clock)
    slurm = MoldingSlurm(clock)
    agents = Agents(clock)
    ctl = Controller(ControllerConfig(interval_s=2.0, holder="test", dry_run=dry_run), MOLDABLE, slurm=slurm,
                     store=store, collector=agents, clock=clock)
    slurm.add_job(10, ["n1", "n2"])
    agents.util.update({("n1", 10): 60.0, ("n2", 10): 60.0})  # in band: it neither grows nor shrinks
    waiting = slurm.add_job(50, ["n3"])  # asks for all 4 nodes, 600 min
    slurm.jobs[50] = replace(waiting, state="PENDING", state_reason="Resources", nodes=(), batch_host=None,
                             node_count=4, start_time=None)
    return ctl, slurm, agents, clock, store


def test_a_waiting_elastic_job_is_molded_starts_smaller_and_grows_back_to_its_request() -> None:
    ctl, slurm, agents, clock, store = _world()
    run(ctl, clock, 1)
    assert ("mold", (50, 2, 4, 1200)) in slurm.calls  # the 2 free nodes; 600 min x 4/2
    [action] = [a for a in store.journal.list_actions(job_id=50) if a.kind == ActionKind.MOLD]
    assert action.state == ActionState.APPLIED and action.idempotency_key == "mold:50"
    [d] = store.decisions.list_decisions(DecisionFilter(job_id=50))
    assert (d.action, d.reason, d.current_nodes, d.target_nodes) == ("mold", "MOLDABLE_START", 4, 2)
    assert d.inputs["time_limit_add_s"] == 600 * 60 and "2 of its 4 requested node(s)" in d.message
    run(ctl, clock, 2)
    assert sum(c[0] == "mold" for c in slurm.calls) == 1  # molded once
    # Slurm starts it on the two free nodes; later job 10 ends and frees two more
    slurm.jobs[50] = replace(slurm.jobs[50], state="RUNNING", state_reason=None, nodes=("n3", "n4"),
                             batch_host="n3", start_time=clock())
    agents.util.update({("n3", 50): 95.0, ("n4", 50): 95.0})
    run(ctl, clock, 1)
    job = store.jobs.get_job(50)
    assert job is not None and job.max_nodes == 4 and job.time_limit_added_min == 600
    slurm.jobs[10] = replace(slurm.jobs[10], state="COMPLETED")
    agents.util = {k: v for k, v in agents.util.items() if k[1] != 10}
    run(ctl, clock, 8)
    grows = [(g.params["from"], g.params["to"]) for g in store.journal.list_actions(job_id=50)
             if g.kind == ActionKind.GROW]
    assert grows == [(2, 4)]  # back to its request (step 2; without the mold's max it would stay AT_MAX)
    # the grow gives back what the mold added (remaining x (1 - 2/4), a few seconds short of 1200 min)
    assert [c for c in slurm.calls if c[0] == "shorten"] == [("shorten", (50, 599))]


def test_a_mold_cut_short_is_finished_by_the_next_cycle() -> None:
    ctl, slurm, agents, clock, store = _world()

    def crash(step: str) -> None:
        if step == "mold:after-intent":
            raise SlurmError("killed between the intent and the update")

    ctl.actuator.fault = crash
    run(ctl, clock, 1)
    [action] = [a for a in store.journal.list_actions(job_id=50) if a.kind == ActionKind.MOLD]
    assert action.state == ActionState.INTENT and not any(c[0] == "mold" for c in slurm.calls)
    ctl.actuator.fault = lambda step: None
    run(ctl, clock, 1)
    assert store.journal.get(action.id).state == ActionState.APPLIED
    assert [c for c in slurm.calls if c[0] == "mold"] == [("mold", (50, 2, 4, 1200))]


def test_dry_run_records_the_mold_and_never_calls_slurm() -> None:
    ctl, slurm, agents, clock, store = _world(dry_run=True)
    run(ctl, clock, 1)
    assert not any(c[0] == "mold" for c in slurm.calls)
    [d] = store.decisions.list_decisions(DecisionFilter(job_id=50))
    assert d.reason == "MOLDABLE_START" and d.dry_run


def test_switched_off_nothing_is_molded() -> None:
    ctl, slurm, agents, clock, store = _world()
    ctl.policy = POLICY
    run(ctl, clock, 2)
    assert not any(c[0] == "mold" for c in slurm.calls)
    assert store.decisions.list_decisions(DecisionFilter(job_id=50)) == []


def test_adapter_reshapes_a_waiting_job_in_one_absolute_update_and_refuses_the_rest() -> None:
    from slurm_elastic.slurm.adapter import ResizeRefusedError
    from tests.unit.test_controller_time_limit import _cli, _job, _Recorder

    waiting = replace(_job(60), state="PENDING", nodes=(), node_count=4)
    rec = _Recorder()
    _cli(rec).mold(waiting, 2, 4, 120)
    _cli(rec).mold(waiting, 3, 4, None)
    assert rec.argvs == [["scontrol", "update", "JobId=42", "NumNodes=2-4", "TimeLimit=120"],
                         ["scontrol", "update", "JobId=42", "NumNodes=3-4"]]
    for job, lo, hi, limit in ((_job(60), 1, 2, None), (waiting, 0, 4, None), (waiting, 5, 4, None),
                               (waiting, 2, 4, 0)):
        with pytest.raises(ResizeRefusedError):
            _cli(rec).mold(job, lo, hi, limit)
    assert len(rec.argvs) == 2


def test_the_journal_finds_many_keys_in_one_call() -> None:
    store = memory_store(FakeClock(T0))
    ids = {f"mold:{j}": store.journal.record_intent(job_id=j, kind=ActionKind.MOLD, idempotency_key=f"mold:{j}",
                                                    nodes=1) for j in range(1, 1200, 2)}
    found = store.journal.find_by_idempotency_keys([f"mold:{j}" for j in range(0, 1200)] + ["mold:1"])
    assert {k: a.id for k, a in found.items()} == ids
    assert store.journal.find_by_idempotency_keys([]) == {}


def test_a_policy_that_does_not_name_it_gets_the_packaged_default_on() -> None:
    ctl, slurm, agents, clock, store = _world()
    ctl.policy = parse_config(policy_text(UNIT, moldable_start=None))
    run(ctl, clock, 1)
    assert ("mold", (50, 2, 4, 1200)) in slurm.calls
