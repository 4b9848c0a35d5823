"""The journal's state machine, as data. Pure: the SQL adapter turns each rule into the WHERE clause of one
conditional UPDATE, so two writers can never both move the same action.

::

    intent ──mark_in_progress──> in_progress ──mark_applied──> applied
      │  ▲                           │  │
      │  └──mark_failed(transient)───┘  ├──mark_failed──> failed
      │                                 └──abort────────> aborted
      ├──abort──> aborted
      ├──mark_failed──> failed   (refused before Slurm was asked, e.g. the job ended)
      └──mark_applied──> applied (only if attempts > 0: reconcile found that an earlier, transiently failed
                                  attempt did take effect in Slurm)

A transient failure sends the action back to ``intent`` (until ``max_attempts`` is reached, then ``failed``):
Slurm may or may not have acted (an sbatch that timed out may still have created the job), so the next try
must first look in Slurm for the idempotency key, exactly like reconcile after a crash.
"""

from __future__ import annotations

from slurm_elastic.store.records import ActionState

INTENT, IN_PROGRESS, APPLIED, FAILED, ABORTED = (ActionState.INTENT, ActionState.IN_PROGRESS, ActionState.APPLIED,
                                                 ActionState.FAILED, ActionState.ABORTED)

# target state -> states it may be reached from
ALLOWED_FROM: dict[ActionState, frozenset[ActionState]] = {
    IN_PROGRESS: frozenset({INTENT}),
    APPLIED: frozenset({IN_PROGRESS, INTENT}),  # from intent only with attempts > 0, see transition_problem
    FAILED: frozenset({INTENT, IN_PROGRESS}),
    ABORTED: frozenset({INTENT, IN_PROGRESS}),
    INTENT: frozenset({IN_PROGRESS}),  # a transient failure, to be retried
}


def transition_problem(current: ActionState, wanted: ActionState, attempts: int) -> str | None:
    """Why ``current -> wanted`` is illegal, or None when it is allowed."""
    if current.is_terminal:
        return f"{current} is terminal"
    if current not in ALLOWED_FROM[wanted]:
        return f"{wanted} is reachable only from {', '.join(sorted(ALLOWED_FROM[wanted]))}"
    if wanted is APPLIED and current is INTENT and attempts == 0:
        return "Slurm was never asked (0 attempts), so the action cannot have been applied"
    return None


def state_after_failure(attempts: int, max_attempts: int, transient: bool) -> ActionState:
    """Where mark_failed sends an action: back to intent for another try, or to failed for good."""
    return INTENT if transient and attempts < max_attempts else FAILED
