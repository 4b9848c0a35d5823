"""The soak's count of Slurm writes with no journal entry (tests/soak_audit.py), on slurmctld's log and the
controller's journal recorded together from one soak run on the namespace cluster (tests/fixtures/slurm/README.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic.store.records import ActionKind, ActionRecord, ActionState
from tests.soak_audit import SlurmWrite, count_by_rpc, slurm_writes, unjournaled

SOAK = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "22.05" / "soak"
EVER = (datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))


def _action(row: dict[str, Any]) -> ActionRecord:
    times = {k: None if row[k] is None else datetime.fromisoformat(row[k])
             for k in ("created_at", "updated_at", "finished_at")}
    return ActionRecord(**{**row, **times, "kind": ActionKind(row["kind"]), "state": ActionState(row["state"])})


@pytest.fixture(scope="module")
def recorded() -> tuple[list[SlurmWrite], list[ActionRecord], set[int], dict[int, int], dict[int, str]]:
    journal = json.loads((SOAK / "journal.json").read_text())
    actions = [_action(r) for r in journal["actions"]]
    parents = {int(e["job_id"]): int(e["parent_job_id"]) for e in journal["extensions"]}
    keys = {int(e["job_id"]): str(e["idempotency_key"]) for e in journal["extensions"]}
    writes = slurm_writes((SOAK / "slurmctld-soak.log").read_text().splitlines(), *EVER, tz=UTC)
    return writes, actions, set(parents.values()), parents, keys


def test_every_write_of_the_recorded_soak_has_its_journal_row(recorded: Any) -> None:
    writes, actions, leaders, parents, keys = recorded
    counts = count_by_rpc(writes)
    grows = sum(1 for a in actions if a.kind == ActionKind.GROW)
    shrinks = sum(1 for a in actions if a.kind == ActionKind.SHRINK)
    # Each grow is one submit; each shrink one grace signal to the leader and one cancel of an extension.
    assert counts["submit"] == grows > 0 and counts["kill"] == 2 * shrinks > 0
    assert unjournaled(writes, actions, leaders, parents, keys) == []


def test_a_shrink_whose_row_is_missing_leaves_its_signal_and_cancel_unjournaled(recorded: Any) -> None:
    writes, actions, leaders, parents, keys = recorded
    gone = next(a for a in actions if a.kind == ActionKind.SHRINK and a.params.get("cancel_extensions"))
    lost = unjournaled(writes, [a for a in actions if a.id != gone.id], leaders, parents, keys)
    ext = int(gone.params["cancel_extensions"][0])
    assert {(w.rpc, w.job_id) for w in lost} == {("kill", gone.job_id), ("kill", ext)}
    assert all(gone.created_at <= w.at <= gone.finished_at + timedelta(milliseconds=1)
               for w in lost)


def test_a_grow_journaled_after_its_submit_reached_slurm_is_unjournaled(recorded: Any) -> None:
    writes, actions, leaders, parents, keys = recorded
    grow = next(a for a in actions if a.kind == ActionKind.GROW)
    ext = next(j for j, k in keys.items() if k == grow.idempotency_key)
    submit = next(w for w in writes if w.rpc == "submit" and w.job_id == ext)
    late = replace(grow, created_at=submit.at + timedelta(milliseconds=5))
    lost = unjournaled(writes, [late if a.id == grow.id else a for a in actions], leaders, parents, keys)
    assert lost == [submit]


def test_an_extension_whose_key_the_controller_never_recorded_is_unjournaled(recorded: Any) -> None:
    writes, actions, leaders, parents, keys = recorded
    ext = min(keys)
    lost = unjournaled(writes, actions, leaders, parents, {j: k for j, k in keys.items() if j != ext})
    assert [(w.rpc, w.job_id) for w in lost] == [("submit", ext)]


def test_a_write_on_a_job_that_is_neither_leader_nor_extension_is_unjournaled(recorded: Any) -> None:
    writes, actions, leaders, parents, keys = recorded
    stray = SlurmWrite(writes[0].at, "update", 999_999, "_slurm_rpc_update_job: complete JobId=999999 uid=0")
    assert unjournaled([*writes, stray], actions, leaders, parents, keys) == [stray]


def _recovery(gone: ActionRecord, ext: int, cancel: SlurmWrite, named: int) -> ActionRecord:
    """A reconcile recovery's cancel row (controller/cancels.py's params) around ``cancel``, naming ``named``."""
    return replace(gone, id=10**6, kind=ActionKind.CANCEL_EXTENSION, idempotency_key=f"cancel:{named}",
                   params={"extension_job": named, "nodes": [], "reason": "ORPHAN_EXTENSION", "recovery": True},
                   created_at=cancel.at - timedelta(seconds=1), finished_at=cancel.at + timedelta(seconds=1))


def test_a_cancel_extension_row_covers_the_cancel_it_journaled(recorded: Any) -> None:
    writes, actions, leaders, parents, keys = recorded
    gone = next(a for a in actions if a.kind == ActionKind.SHRINK and a.params.get("cancel_extensions"))
    ext = int(gone.params["cancel_extensions"][0])
    cancel = next(w for w in writes if w.rpc == "kill" and w.job_id == ext and w.at >= gone.created_at)
    others = [a for a in actions if a.id != gone.id]
    lost = unjournaled(writes, [*others, _recovery(gone, ext, cancel, ext)], leaders, parents, keys)
    assert [(w.rpc, w.job_id) for w in lost] == [("kill", gone.job_id)]  # the leader's grace signal stays lost
    # a cancel row of the same leader that names another extension covers nothing of this one
    lost = unjournaled(writes, [*others, _recovery(gone, ext, cancel, ext + 10**6)], leaders, parents, keys)
    assert {(w.rpc, w.job_id) for w in lost} == {("kill", gone.job_id), ("kill", ext)}


def test_a_cancel_of_an_extension_while_its_grow_is_open_is_unjournaled_without_its_own_row(recorded: Any) -> None:
    """Reconcile's cancel of a duplicate happens while the grow that made it is still open; the grow's row does not
    cover it: only the cancel's own row does (controller/reconcile.py)."""
    writes, actions, leaders, parents, keys = recorded
    grow = next(a for a in actions if a.kind == ActionKind.GROW and a.finished_at is not None)
    ext = next(j for j, k in keys.items() if k == grow.idempotency_key)
    dup = SlurmWrite(grow.created_at + (grow.finished_at - grow.created_at) / 2, "kill", ext,
                     f"_slurm_rpc_kill_job: REQUEST_KILL_JOB JobId={ext} uid 0")
    assert unjournaled([*writes, dup], actions, leaders, parents, keys) == [dup]
    assert unjournaled([*writes, dup], [*actions, _recovery(grow, ext, dup, ext)], leaders, parents, keys) == []


def test_only_job_writes_inside_the_window_count() -> None:
    lines = (SOAK / "slurmctld-soak.log").read_text().splitlines()
    rpcs = ("_slurm_rpc_submit_batch_job: JobId=", "REQUEST_KILL_JOB JobId=", "_slurm_rpc_update_job: ")
    every = slurm_writes(lines, *EVER, tz=UTC)
    assert len(every) == sum(1 for line in lines if any(r in line for r in rpcs)) < len(lines)
    middle = every[len(every) // 2].at
    first = slurm_writes(lines, EVER[0], middle, tz=UTC)
    assert first == [w for w in every if w.at <= middle] and 0 < len(first) < len(every)
    assert slurm_writes(lines, *EVER, tz=timezone(timedelta(hours=1)))[0].at == every[0].at - timedelta(hours=1)
