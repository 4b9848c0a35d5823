"""The workflow's adapters that need no cluster: atomic file writes, command templates, the test-only fault hook,
and the journal adapter over a real store."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from slurm_elastic.mig.adapters import (
    CommandDaemons,
    FileNodeLock,
    LocalFiles,
    MigStoreJournal,
    fault_hook,
)
from slurm_elastic.mig.config import Commands
from slurm_elastic.mig.errors import InjectedFault, WorkflowBusyError, WorkflowError
from slurm_elastic.mig.steps import RecordState
from slurm_elastic.store import ActionState, SqlStore


def test_files_are_replaced_atomically_keeping_their_mode(tmp_path: Path) -> None:
    f = tmp_path / "gres.conf"
    f.write_text("old\n")
    f.chmod(0o640)
    LocalFiles().write(str(f), "new\n")
    assert f.read_text() == "new\n" and (f.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["gres.conf"]  # no temp file left
    with pytest.raises(WorkflowError, match="cannot read"):
        LocalFiles().read(str(tmp_path / "missing"))
    with pytest.raises(WorkflowError, match="cannot write"):
        LocalFiles().write(str(tmp_path / "no-dir" / "x"), "y")


def test_commands_are_argument_lists_with_the_node_filled_in(tmp_path: Path) -> None:
    out = tmp_path / "out"
    script = f"import sys; open({str(out)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')"
    d = CommandDaemons(Commands(slurmd_stop=(sys.executable, "-c", script, "stop", "{node}"),
                                slurmd_start=(sys.executable, "-c", script, "start", "{node}; rm -rf /"),
                                slurmctld_restart=(sys.executable, "-c", "import sys; sys.exit(3)"), timeout_s=30))
    d.stop_slurmd("n4")
    d.start_slurmd("n4")
    assert out.read_text() == "stop n4\nstart n4; rm -rf /\n"  # one argument, never a shell
    with pytest.raises(WorkflowError, match="exited 3"):
        d.restart_slurmctld()


def test_the_fault_hook_kills_or_fails_only_where_asked() -> None:
    killed: list[str] = []
    hook = fault_hook("kill-after:write_gres, fail:verify", kill=lambda: killed.append("x"))
    hook("before:write_gres")
    hook("after:apply_layout")
    assert killed == []
    hook("after:write_gres")
    assert killed == ["x"]
    with pytest.raises(InjectedFault, match="verify"):
        hook("before:verify")
    fault_hook(None)("after:write_gres")  # unset: nothing happens
    assert os.getpid() > 0


def test_the_journal_adapter_records_mig_kinds_with_job_id_zero() -> None:
    store = SqlStore.open("sqlite://")
    try:
        j = MigStoreJournal(store.journal)
        wf = j.create("mig:n4:abc", "mig_workflow", {"node": "n4"}, gpus=2)
        assert (wf.state, wf.params["node"]) == (RecordState.INTENT, "n4")
        assert j.create("mig:n4:abc", "mig_workflow", {}, gpus=2).id == wf.id  # a crashed run's record is reused
        j.start(wf.id)
        assert [r.id for r in j.open_workflows()] == [wf.id]
        j.finish(wf.id, "done")
        assert j.open_workflows() == [] and j.workflows()[0].message == "done"
        (action,) = store.journal.list_actions()
        assert (action.job_id, action.kind.value, action.gpus) == (0, "mig_workflow", 2)
    finally:
        store.close()


def test_the_step_machines_states_are_the_journals() -> None:
    """mig/steps.py keeps its own copy of the journal's states (the pure core does not import the store); the
    adapter maps each journal state onto it, so a state added to one alone must fail here."""
    assert {s.name: s.value for s in RecordState} == {s.name: s.value for s in ActionState}
    assert {s for s in RecordState if s.is_open} == {RecordState(s.value) for s in ActionState if not s.is_terminal}


def test_one_workflow_process_per_node(tmp_path: Path) -> None:
    lock = FileNodeLock(tmp_path / "locks")
    with lock.hold("n4"):
        with pytest.raises(WorkflowBusyError, match="another MIG workflow process is working on n4"):
            with lock.hold("n4"):
                pass
        with lock.hold("n3"):  # other nodes are independent
            pass
    with lock.hold("n4"):  # released with its file descriptor (and with its process)
        pass
    with pytest.raises(WorkflowError, match="bad node name"):
        with lock.hold("../etc"):
            pass
