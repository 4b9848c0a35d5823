"""Moldable start in the controller (controller/molds.py, the actuator's mold): the real SlurmCli on replies
recorded from the live test cluster (tests/unit/resize_scenarios.py), a fake clock. The live-cluster test is
tests/cluster/test_moldable_start_cluster.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_elastic.controller.actuator import mold_key
from slurm_elastic.controller.molds import Molds
from slurm_elastic.controller.units import UnitsResult
from slurm_elastic.store.records import ActionKind, ActionState, DecisionFilter
from tests.unit import resize_scenarios  # noqa: F401 - registers the scenarios replayed here
from tests.unit.policy_builders import job as make_job
from tests.unit.policy_builders import unit
from tests.unit.slurm_replay import SCENARIOS, STEP_S, Replayed, replay
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import T0, Agents


def _writes(r: Replayed) -> list[list[str]]:
    return [c for c in r.runner.calls if c[0] in ("sbatch", "scancel", "runuser") or c[:2] == ["scontrol", "update"]]


def _molds(r: Replayed) -> list[list[str]]:
    return [c for c in _writes(r) if any(a.startswith("NumNodes=") for a in c)]


def test_a_waiting_elastic_job_is_molded_starts_smaller_and_grows_back_to_its_request() -> None:
    r = replay("mold_waiting_job", Agents)
    waiting = r.rec.jobs["waiting"]
    # the 2 free nodes, its request (4) as the max; the recorded 30 min x 4/2
    assert _molds(r) == [["scontrol", "update", f"JobId={waiting}", "NumNodes=2-4", "TimeLimit=60"]]  # once
    assert _writes(r)[0] == _molds(r)[0]
    [action] = [a for a in r.store.journal.list_actions(job_id=waiting) if a.kind == ActionKind.MOLD]
    assert action.state == ActionState.APPLIED and action.idempotency_key == f"mold:{waiting}"
    [d] = r.store.decisions.list_decisions(DecisionFilter(job_id=waiting, action="mold"))
    assert (d.action, d.reason, d.current_nodes, d.target_nodes) == ("mold", "MOLDABLE_START", 4, 2)
    assert d.inputs["time_limit_add_s"] == 30 * 60 and "2 of its 4 requested node(s)" in d.message
    # Slurm started it on the two free nodes; the other job was cancelled: it grows back to its request (step 2;
    # without the mold's max it would stay AT_MAX)
    grows = [(g.params["from"], g.params["to"]) for g in r.store.journal.list_actions(job_id=waiting)
             if g.kind == ActionKind.GROW]
    assert grows == [(2, 4)]
    [grow] = [g for g in r.store.decisions.list_decisions(DecisionFilter(job_id=waiting, action="grow"))]
    assert grow.reason == "MOLDED_REGROW" and grow.inputs["molded_request"] == 4
    (submit,) = r.runner.ran("runuser")
    assert "--nodes=2" in submit
    # the grow gives back what the mold added: remaining x (1 - 2/4), in whole minutes, a little under 30
    (shorten,) = [c for c in _writes(r) if c[-1].startswith("TimeLimit=") and "NumNodes=2-4" not in c]
    assert shorten == ["scontrol", "update", f"JobId={waiting}", "TimeLimit=31"]
    job = r.store.jobs.get_job(waiting)
    assert job is not None and job.max_nodes == 4 and job.time_limit_added_min == 30 - 29


def test_a_mold_cut_short_is_finished_by_the_next_cycle() -> None:
    r = replay("mold_cut_short", Agents)
    waiting = r.rec.jobs["waiting"]
    [action] = [a for a in r.store.journal.list_actions(job_id=waiting) if a.kind == ActionKind.MOLD]
    assert action.state == ActionState.APPLIED and action.finished_at is not None
    assert (action.finished_at - action.created_at).total_seconds() >= STEP_S  # journaled in one cycle, done next
    assert _molds(r) == [["scontrol", "update", f"JobId={waiting}", "NumNodes=2-4", "TimeLimit=60"]]
    snapshots = [i for i, c in enumerate(r.runner.calls) if c[:2] == ["squeue", "--all"]]
    assert r.runner.calls.index(_molds(r)[0]) > snapshots[1]  # not in the first cycle


def test_dry_run_records_the_mold_and_never_calls_slurm() -> None:
    r = replay("mold_default_dry_run", Agents)
    assert _writes(r) == []
    molds = r.store.decisions.list_decisions(DecisionFilter(job_id=r.rec.jobs["waiting"], action="mold"))
    assert len(molds) == 2  # nothing journaled: decided again each cycle
    assert all(d.reason == "MOLDABLE_START" and d.dry_run and (d.current_nodes, d.target_nodes) == (4, 2)
               for d in molds)
    assert r.store.journal.list_actions() == []


def test_switched_off_nothing_is_molded() -> None:
    r = replay("mold_switched_off", Agents)
    assert "moldable_start = false" in SCENARIOS["mold_switched_off"].policy_text
    assert _writes(r) == []
    assert r.store.decisions.list_decisions(DecisionFilter(job_id=r.rec.jobs["waiting"])) == []


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
    """The dry-run scenario's policy does not name moldable_start: the mold is decided all the same."""
    assert "moldable_start" not in SCENARIOS["mold_default_dry_run"].policy_text
    r = replay("mold_default_dry_run", Agents)
    assert r.store.decisions.list_decisions(DecisionFilter(job_id=r.rec.jobs["waiting"], reason="MOLDABLE_START"))


def test_a_molded_unit_seen_running_for_the_first_time_carries_its_added_minutes_in_that_cycle() -> None:
    """The mold's added minutes reach the store after the cycle that first sees the job running; MOLDED_REGROW
    may grow it back in that very cycle (no metrics window), so the unit of that cycle carries them already,
    or the grow would give none of them back (seen on the cluster: a molded job back at 4 nodes kept its
    doubled time limit)."""
    store = memory_store(FakeClock(T0))
    action = store.journal.record_intent(job_id=100, kind=ActionKind.MOLD, idempotency_key=mold_key(100),
                                         params={"from": 4, "to": 2, "time_limit_add_min": 60})
    store.journal.mark_in_progress(action)
    store.journal.mark_applied(action)
    built = UnitsResult(units=(unit(make_job(100, nodes=("n1", "n2"))),), sources={}, not_elastic={})
    molds = Molds(store, None, {})  # type: ignore[arg-type]  # apply() reads the journal only
    (first,) = molds.apply(built, known=[]).units
    assert first.time_limit_added_s == 3600 and first.molded_request == 4
