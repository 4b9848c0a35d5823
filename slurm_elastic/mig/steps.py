"""The MIG workflow's pure step machine: what to do next, decided from the journal's step records alone.

Forward steps, each recorded in the journal before it acts (intent -> in_progress -> applied/failed)::

    drain -> wait_jobs -> apply_layout -> write_gres -> restart_slurm -> verify -> resume

Every step is idempotent, so a workflow whose process died (``in_progress`` step, or a step not yet recorded)
is finished by running the interrupted step again (``slurm-elastic mig resume-workflows``, or automatically
before the next ``mig apply`` on that node). What happens when a step fails is decided by :func:`next_move`
from the journal alone:

* ``wait_jobs`` timed out: the node is put back as it was (``restore_node``); outcome ``aborted``.
* ``drain`` failed: ``restore_node``; outcome ``failed``.
* ``resume`` failed: the node stays drained (``hold_drained``); outcome ``failed``.
* any other step failed: what was done is undone (``rollback_layout``, ``rollback_gres``,
  ``rollback_restart``, then ``rollback_verify``) and the node stays drained with a reason that names the
  failed step (``hold_drained``); outcome ``failed``. It is never resumed with GRES that do not match.
* an operator asked for a rollback (``resume-workflows --rollback``): the interrupted step is recorded as
  ``aborted``, the same undo steps run, and if they all succeed and verify, the node goes back to the state it
  had before (``restore_node``); outcome ``aborted``.

The loop that runs the steps is :mod:`slurm_elastic.mig.workflow`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

REASON_MAX = 200  # Slurm keeps longer reasons, but sinfo columns and humans do not


class Step(StrEnum):
    DRAIN = "drain"
    WAIT_JOBS = "wait_jobs"
    APPLY_LAYOUT = "apply_layout"
    WRITE_GRES = "write_gres"
    RESTART_SLURM = "restart_slurm"
    VERIFY = "verify"
    RESUME = "resume"
    ROLLBACK_LAYOUT = "rollback_layout"
    ROLLBACK_GRES = "rollback_gres"
    ROLLBACK_RESTART = "rollback_restart"
    ROLLBACK_VERIFY = "rollback_verify"
    HOLD_DRAINED = "hold_drained"
    RESTORE_NODE = "restore_node"


FORWARD: tuple[Step, ...] = (Step.DRAIN, Step.WAIT_JOBS, Step.APPLY_LAYOUT, Step.WRITE_GRES, Step.RESTART_SLURM,
                             Step.VERIFY, Step.RESUME)
UNDO: tuple[Step, ...] = (Step.ROLLBACK_LAYOUT, Step.ROLLBACK_GRES, Step.ROLLBACK_RESTART, Step.ROLLBACK_VERIFY)


class RecordState(StrEnum):
    """The journal's states, the values of :class:`slurm_elastic.store.ActionState`: a copy, because this pure
    core does not import the store (its package loads SQLAlchemy); mig/adapters.py maps one onto the other and
    tests/unit/test_mig_adapters.py keeps the two the same."""

    INTENT = "intent"
    IN_PROGRESS = "in_progress"
    APPLIED = "applied"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def is_open(self) -> bool:
        return self in (RecordState.INTENT, RecordState.IN_PROGRESS)


class MigStepOutcome(StrEnum):
    APPLIED = "applied"
    FAILED = "failed"
    ABORTED = "aborted"


@dataclass(frozen=True)
class Record:
    """One journal row, as the workflow sees it."""

    id: int
    key: str
    kind: str
    state: RecordState
    params: Mapping[str, Any]
    message: str = ""


@dataclass(frozen=True)
class RunStep:
    step: Step
    rerun: bool  # the step has a record already: the process died in it (or before marking it done)


@dataclass(frozen=True)
class Finish:
    outcome: MigStepOutcome
    message: str


Move = RunStep | Finish


def stopped_step(steps: Mapping[Step, Record]) -> Step | None:
    """The forward step that failed (or was aborted by an operator), if any."""
    for s in FORWARD:
        r = steps.get(s)
        if r is not None and r.state in (RecordState.FAILED, RecordState.ABORTED):
            return s
    return None


def undo_plan(stopped: Step, steps: Mapping[Step, Record]) -> tuple[Step, ...]:
    """The undo steps a workflow stopped at ``stopped`` needs, in order (without the final node step)."""
    if stopped in (Step.DRAIN, Step.WAIT_JOBS):
        return ()
    if stopped is Step.RESUME and steps[stopped].state is RecordState.FAILED:
        return ()  # the node is right; only Slurm's resume failed
    plan: list[Step] = []
    if Step.APPLY_LAYOUT in steps:
        plan.append(Step.ROLLBACK_LAYOUT)
    if Step.WRITE_GRES in steps:
        plan += [Step.ROLLBACK_GRES, Step.ROLLBACK_RESTART]
    if plan:
        plan.append(Step.ROLLBACK_VERIFY)
    return tuple(plan)


def final_step(stopped: Step, steps: Mapping[Step, Record]) -> Step:
    """``restore_node`` when the node may go back to how it was, else ``hold_drained``."""
    record = steps[stopped]
    undo = undo_plan(stopped, steps)
    undone = all(steps.get(u) is not None and steps[u].state is RecordState.APPLIED for u in undo)
    if stopped is Step.WAIT_JOBS or stopped is Step.DRAIN:
        return Step.RESTORE_NODE
    if record.state is RecordState.ABORTED and undone:
        return Step.RESTORE_NODE
    return Step.HOLD_DRAINED


def next_move(steps: Mapping[Step, Record]) -> Move:
    """What to do next, from the step records alone (pure; the whole recovery logic lives here)."""
    stopped = stopped_step(steps)
    if stopped is None:
        return _first_to_run(FORWARD, steps) or Finish(
            MigStepOutcome.APPLIED, "layout applied, GRES verified, node back in its previous state")
    undo = undo_plan(stopped, steps)
    skip_verify = any(steps.get(u) is not None and steps[u].state is RecordState.FAILED for u in undo)
    to_run = _first_to_run([s for s in undo if not (s is Step.ROLLBACK_VERIFY and skip_verify)], steps)
    if to_run is not None:
        return to_run
    last = final_step(stopped, steps)
    return _first_to_run((last,), steps) or Finish(*_outcome(stopped, steps, last, steps[last]))


def _first_to_run(candidates: Sequence[Step], steps: Mapping[Step, Record]) -> RunStep | None:
    """The first of ``candidates`` not done: not recorded yet, or still open (the process died in it)."""
    for s in candidates:
        r = steps.get(s)
        if r is None:
            return RunStep(s, rerun=False)
        if r.state.is_open:
            return RunStep(s, rerun=True)
    return None


def _cause(stopped: Step, cause: Record) -> str:
    return (f"rollback requested at {stopped}" if cause.state is RecordState.ABORTED
            else f"{stopped} failed: {cause.message}")


def _outcome(stopped: Step, steps: Mapping[Step, Record], last: Step,
             last_record: Record) -> tuple[MigStepOutcome, str]:
    cause = steps[stopped]
    what = _cause(stopped, cause)
    failed_undo = [f"{s} failed: {steps[s].message}" for s in UNDO
                   if s in steps and steps[s].state is RecordState.FAILED]
    parts = [what, *failed_undo]
    if last_record.state is not RecordState.APPLIED:
        parts.append(f"{last} failed: {last_record.message}")
        return MigStepOutcome.FAILED, "; ".join(parts)
    if last is Step.RESTORE_NODE and stopped is Step.WAIT_JOBS and cause.state is RecordState.FAILED:
        return MigStepOutcome.ABORTED, "; ".join([*parts, "node restored as it was"])
    if last is Step.RESTORE_NODE and cause.state is RecordState.ABORTED:
        return MigStepOutcome.ABORTED, "; ".join([*parts, "rolled back, node restored as it was"])
    if last is Step.RESTORE_NODE:
        return MigStepOutcome.FAILED, "; ".join([*parts, "node restored as it was"])
    return MigStepOutcome.FAILED, "; ".join([*parts, "node left drained"])


def hold_reason(prefix: str, workflow_id: int, steps: Mapping[Step, Record]) -> str:
    """The drain reason after a failure: names the failed step (and a failed rollback step)."""
    stopped = stopped_step(steps)
    if stopped is None:
        return f"{prefix} #{workflow_id}: failed"
    text = _cause(stopped, steps[stopped])
    bad = [s for s in UNDO if s in steps and steps[s].state is RecordState.FAILED]
    if bad:
        text += f"; {bad[0]} failed too"
    return one_line(f"{prefix} #{workflow_id}: {text}", REASON_MAX)


def one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
