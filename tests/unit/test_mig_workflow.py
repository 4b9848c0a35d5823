"""The MIG apply workflow: the pure step machine, and its recovery logic through port fakes with the real journal.

A crash is a BaseException raised by the fault hook at a step boundary; "restart" is a new MigWorkflow on the
same journal and fakes running ``resume_open``. Slurm's side is the recorded replies of
tests/unit/mig_workflow_support.py (RecordedSlurm); what the workflow does to the live Slurm (drain, wait for
jobs, restart, verify, resume, crash and rollback) is replayed in test_mig_workflow_replay.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slurm_elastic.mig.errors import LayoutError
from slurm_elastic.mig.model import Layout, NodeLayout
from slurm_elastic.mig.slurmconf import gres_summary, node_gres_lines, node_gres_value
from slurm_elastic.mig.steps import (
    FORWARD,
    Finish,
    MigStepOutcome,
    Record,
    RecordState,
    RunStep,
    Step,
    hold_reason,
    next_move,
)
from slurm_elastic.store import SqlStore
from tests.unit.mig_workflow_support import (
    NODE,
    Crash,
    Rig,
    crash_at,
    fail_at,
    make_rig,
)
from tests.unit.storehelpers import FakeClock as StoreClock
from tests.unit.storehelpers import memory_store

TARGET = NodeLayout.of({0: Layout.of({"3g.20gb": 2}), 1: Layout.of({"1g.5gb": 7})})
AFTER_GRES = {"gpu:3g.20gb": 2, "gpu:1g.5gb": 7, "gpu:a100": 2, "mps": 200}  # n4's 4 GPUs, as recorded
RESTART = ["stop slurmd n4", "restart slurmctld", "start slurmd n4"]


@pytest.fixture
def rig() -> Iterator[Rig]:
    store = memory_store(StoreClock())
    yield make_rig(store)
    store.close()


def assert_applied(rig: Rig) -> None:
    assert rig.layout() == {0: {"3g.20gb": 2}, 1: {"1g.5gb": 7}, 2: "off", 3: "off"}
    files = rig.files.files
    assert gres_summary(node_gres_value(files[rig.settings.slurm_conf], NODE) or "") == AFTER_GRES
    assert node_gres_value(files[rig.settings.slurm_conf], "n1") == "gpu:4,mps:400"  # other nodes untouched
    assert len(node_gres_lines(files[rig.settings.gres_conf], NODE)) == 13
    assert gres_summary(rig.slurm.served.gres) == AFTER_GRES  # the reply recorded after such a restart
    assert not rig.slurm.drained and rig.daemons.calls[-3:] == RESTART
    assert rig.journal.open_workflows() == []


def assert_original(rig: Rig) -> None:
    assert rig.layout() == {0: "off", 1: "off", 2: "off", 3: "off"}
    assert rig.files.files == rig.original_files
    assert gres_summary(rig.slurm.served.gres) == {"gpu": 4, "mps": 400}
    assert rig.daemons.calls[-3:] in ([], RESTART)  # no restart, or a whole one last


# ---- the pure step machine -------------------------------------------------------------------------------------


def rec(step: Step, state: RecordState, message: str = "") -> Record:
    return Record(id=list(Step).index(step) + 1, key=str(step), kind="mig_step", state=state, params={},
                  message=message)


def steps(**states: RecordState) -> dict[Step, Record]:
    return {Step(k): rec(Step(k), v, f"{k} says no") for k, v in states.items()}


A, F, N, P, X = (RecordState.APPLIED, RecordState.FAILED, RecordState.INTENT, RecordState.IN_PROGRESS,
                 RecordState.ABORTED)
DONE_TO_WRITE = {"drain": A, "wait_jobs": A, "apply_layout": A, "write_gres": A}


@pytest.mark.parametrize(("records", "expected"), [
    ({}, RunStep(Step.DRAIN, False)),
    ({"drain": A}, RunStep(Step.WAIT_JOBS, False)),
    ({"drain": A, "wait_jobs": P}, RunStep(Step.WAIT_JOBS, True)),
    ({"drain": A, "wait_jobs": A, "apply_layout": N}, RunStep(Step.APPLY_LAYOUT, True)),
    ({s.value: A for s in FORWARD}, Finish(MigStepOutcome.APPLIED, "")),
    # a timeout while waiting: the node goes back as it was, the workflow is aborted
    ({"drain": A, "wait_jobs": F}, RunStep(Step.RESTORE_NODE, False)),
    ({"drain": A, "wait_jobs": F, "restore_node": A}, Finish(MigStepOutcome.ABORTED, "")),
    ({"drain": F}, RunStep(Step.RESTORE_NODE, False)),
    ({"drain": F, "restore_node": A}, Finish(MigStepOutcome.FAILED, "")),
    # a failure after the apply: undo everything, then hold the node drained
    ({"drain": A, "wait_jobs": A, "apply_layout": F}, RunStep(Step.ROLLBACK_LAYOUT, False)),
    ({"drain": A, "wait_jobs": A, "apply_layout": F, "rollback_layout": A}, RunStep(Step.ROLLBACK_VERIFY, False)),
    ({"drain": A, "wait_jobs": A, "apply_layout": F, "rollback_layout": A, "rollback_verify": A},
     RunStep(Step.HOLD_DRAINED, False)),
    ({**DONE_TO_WRITE, "restart_slurm": F}, RunStep(Step.ROLLBACK_LAYOUT, False)),
    ({**DONE_TO_WRITE, "restart_slurm": F, "rollback_layout": A}, RunStep(Step.ROLLBACK_GRES, False)),
    ({**DONE_TO_WRITE, "restart_slurm": F, "rollback_layout": A, "rollback_gres": P},
     RunStep(Step.ROLLBACK_GRES, True)),
    ({**DONE_TO_WRITE, "restart_slurm": F, "rollback_layout": A, "rollback_gres": A},
     RunStep(Step.ROLLBACK_RESTART, False)),
    # a failed undo step: the rest still runs, verification is skipped, the node is held drained
    ({**DONE_TO_WRITE, "verify": F, "restart_slurm": A, "rollback_layout": F, "rollback_gres": A,
      "rollback_restart": A}, RunStep(Step.HOLD_DRAINED, False)),
    ({**DONE_TO_WRITE, "restart_slurm": A, "verify": A, "resume": F}, RunStep(Step.HOLD_DRAINED, False)),
    # an operator's rollback: undo, and if it all worked the node goes back as it was
    ({**DONE_TO_WRITE, "restart_slurm": X, "rollback_layout": A, "rollback_gres": A, "rollback_restart": A,
      "rollback_verify": A}, RunStep(Step.RESTORE_NODE, False)),
    ({**DONE_TO_WRITE, "restart_slurm": X, "rollback_layout": A, "rollback_gres": A, "rollback_restart": A,
      "rollback_verify": F}, RunStep(Step.HOLD_DRAINED, False)),
    ({"drain": A, "wait_jobs": X}, RunStep(Step.RESTORE_NODE, False)),
])
def test_next_move(records: dict[str, RecordState], expected: RunStep | Finish) -> None:
    move = next_move(steps(**records))
    if isinstance(expected, Finish):
        assert isinstance(move, Finish) and move.outcome is expected.outcome
    else:
        assert move == expected


def test_the_hold_reason_names_the_failed_step_and_a_failed_undo() -> None:
    recs = steps(**DONE_TO_WRITE, restart_slurm=F, rollback_layout=F)
    assert hold_reason("slurm-elastic mig", 7, recs) == (
        "slurm-elastic mig #7: restart_slurm failed: restart_slurm says no; rollback_layout failed too")


def test_finish_messages_say_what_happened() -> None:
    move = next_move(steps(**DONE_TO_WRITE, restart_slurm=F, rollback_layout=A, rollback_gres=A, rollback_restart=A,
                           rollback_verify=A, hold_drained=A))
    assert isinstance(move, Finish) and move.outcome is MigStepOutcome.FAILED
    assert move.message == "restart_slurm failed: restart_slurm says no; node left drained"


# ---- the shell, end to end through fakes ---------------------------------------------------------------------


def test_applying_the_same_layout_again_changes_no_gpu(rig: Rig) -> None:
    rig.workflow().start(NODE, TARGET)
    rig.slurm.served = rig.after_apply  # the next apply starts from n4 as Slurm then showed it
    calls = [len(d.calls) for d in rig.agent.devices]
    result = rig.workflow().start(NODE, TARGET)
    assert result.outcome is MigStepOutcome.APPLIED
    assert [len(d.calls) for d in rig.agent.devices] == calls
    assert dict((s, m) for s, _, m in result.steps)["apply_layout"] == "the GPUs already had the layout"
    assert_applied(rig)


def test_an_impossible_layout_is_refused_before_anything_is_journaled(rig: Rig) -> None:
    with pytest.raises(LayoutError, match="needs 9 compute slices"):
        rig.workflow().start(NODE, NodeLayout.of({0: Layout.of({"3g.20gb": 3})}))
    assert rig.store.journal.list_actions() == []
    assert rig.slurm.calls == []


POINTS = [f"{when}:{step}" for step in FORWARD for when in ("before", "during", "after")]


@pytest.mark.parametrize("point", POINTS)
def test_a_crash_at_any_point_then_restart_completes_the_workflow(rig: Rig, point: str) -> None:
    with pytest.raises(Crash):
        rig.workflow(crash_at(point)).start(NODE, TARGET)
    if not point.startswith("after:resume"):
        assert rig.journal.open_workflows(), "a crash leaves the workflow open"
        if point not in ("before:drain", "during:resume"):  # resumed only after verify
            assert rig.slurm.drained, "never in service half-way"
    (result,) = rig.workflow().resume_open()
    assert result.outcome is MigStepOutcome.APPLIED, result
    assert_applied(rig)


@pytest.mark.parametrize("point", POINTS)
def test_a_crash_then_operator_rollback_restores_everything(rig: Rig, point: str) -> None:
    with pytest.raises(Crash):
        rig.workflow(crash_at(point)).start(NODE, TARGET)
    results = rig.workflow().resume_open(rollback=True)
    if point == "after:resume":  # the workflow had finished: nothing left to roll back
        assert results[0].outcome is MigStepOutcome.APPLIED
        return
    (result,) = results
    assert result.outcome is MigStepOutcome.ABORTED, result
    assert "rolled back" in result.message or "restored" in result.message
    assert_original(rig)
    assert not rig.slurm.drained


@pytest.mark.parametrize("step", [Step.APPLY_LAYOUT, Step.WRITE_GRES, Step.RESTART_SLURM, Step.VERIFY])
def test_a_failed_step_rolls_back_and_leaves_the_node_drained_naming_it(rig: Rig, step: Step) -> None:
    result = rig.workflow(fail_at(step.value)).start(NODE, TARGET)
    assert result.outcome is MigStepOutcome.FAILED
    assert_original(rig)
    assert rig.slurm.drained
    assert rig.slurm.reason is not None and f"#1: {step} failed: injected failure at {step}" in rig.slurm.reason
    assert result.steps[-1][:2] == ("hold_drained", "applied")


def test_a_failed_drain_puts_the_node_back(rig: Rig) -> None:
    rig.slurm.refuse = {"drain"}
    result = rig.workflow().start(NODE, TARGET)
    assert result.outcome is MigStepOutcome.FAILED and "drain failed" in result.message
    assert rig.layout() == {0: "off", 1: "off", 2: "off", 3: "off"} and not rig.slurm.drained


def test_a_failed_resume_keeps_the_new_layout_and_the_node_drained(rig: Rig) -> None:
    rig.slurm.refuse = {"resume"}
    result = rig.workflow().start(NODE, TARGET)
    assert result.outcome is MigStepOutcome.FAILED
    assert rig.layout() == {0: {"3g.20gb": 2}, 1: {"1g.5gb": 7}, 2: "off", 3: "off"}
    assert gres_summary(rig.slurm.served.gres) == AFTER_GRES
    assert rig.slurm.drained and "resume failed" in (rig.slurm.reason or "")


def test_a_crash_during_the_rollback_is_finished_by_the_restart(rig: Rig) -> None:
    def hook(point: str) -> None:
        fail_at("verify")(point)
        crash_at("before:rollback_gres")(point)

    with pytest.raises(Crash):
        rig.workflow(hook).start(NODE, TARGET)
    (result,) = rig.workflow().resume_open()
    assert result.outcome is MigStepOutcome.FAILED
    assert_original(rig)
    assert rig.slurm.drained and "verify failed" in (rig.slurm.reason or "")


def test_a_failed_agent_apply_is_undone(rig: Rig) -> None:
    rig.agent.fail_apply = 1
    result = rig.workflow().start(NODE, TARGET)
    assert result.outcome is MigStepOutcome.FAILED and "apply failed (test)" in result.message
    assert rig.slurm.drained and rig.layout() == {0: "off", 1: "off", 2: "off", 3: "off"}
    assert rig.files.writes == []


def test_the_next_apply_finishes_an_open_workflow_first(rig: Rig) -> None:
    with pytest.raises(Crash):
        rig.workflow(crash_at("after:apply_layout")).start(NODE, TARGET)

    def resumed(point: str) -> None:  # after the first one's resume, Slurm shows n4 as recorded then
        if point == "after:resume":
            rig.slurm.served = rig.after_apply

    result = rig.workflow(resumed).start(NODE, TARGET)
    assert result.outcome is MigStepOutcome.APPLIED
    assert [r.state.value for r in rig.journal.workflows()] == ["applied", "applied"]
    assert dict((s, m) for s, _, m in result.steps)["apply_layout"] == "the GPUs already had the layout"
    assert rig.said[0].startswith("workflow #1: n4 -> ") and "finishing open workflow #1 on n4 first" in rig.said
    assert_applied(rig)


def test_a_file_changed_behind_the_workflows_back_is_not_overwritten(rig: Rig) -> None:
    def hook(point: str) -> None:
        if point == "before:write_gres":
            rig.files.files[rig.settings.gres_conf] += "# someone else\n"

    result = rig.workflow(hook).start(NODE, TARGET)
    assert result.outcome is MigStepOutcome.FAILED
    assert "changed since the workflow read it" in result.message
    assert rig.slurm.drained


def test_journal_records_survive_a_new_store_object(tmp_path: object) -> None:
    from pathlib import Path

    from slurm_elastic.store import sqlite_url
    from tests.unit.mig_workflow_support import make_rig as mk

    url = sqlite_url(Path(str(tmp_path)) / "state.db")
    store = SqlStore.open(url)
    r1 = mk(store)
    with pytest.raises(Crash):
        r1.workflow(crash_at("after:write_gres")).start(NODE, TARGET)
    store.close()
    store2 = SqlStore.open(url)
    try:
        from slurm_elastic.mig.adapters import MigStoreJournal

        r1.journal = MigStoreJournal(store2.journal)
        (result,) = r1.workflow().resume_open()
        assert result.outcome is MigStepOutcome.APPLIED
        assert_applied(r1)
    finally:
        store2.close()


def test_a_node_held_by_another_live_process_is_refused_before_anything_is_journaled(
        rig: Rig, tmp_path: object) -> None:
    from pathlib import Path

    from slurm_elastic.mig.adapters import FileNodeLock
    from slurm_elastic.mig.errors import WorkflowBusyError

    lock = FileNodeLock(Path(str(tmp_path)))
    wf = rig.workflow()
    wf.p.lock = lock
    with lock.hold(NODE), pytest.raises(WorkflowBusyError):
        wf.start(NODE, TARGET)
    assert rig.store.journal.list_actions() == [] and rig.slurm.calls == []
    assert wf.start(NODE, TARGET).outcome is MigStepOutcome.APPLIED
