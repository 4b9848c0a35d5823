"""Cancel an extension job, journaled first: one whose grow failed before it joined (power.py, coldstart.py), or one
of reconcile's recoveries (a duplicate, an orphan, one pending on a dead node: reconcile.py).

Journal an intent ``cancel_extension`` under the key ``cancel:<extension job>`` (one per extension job), mark it
in progress, ``scancel`` the job, close the extension's record and mark the action applied. A job Slurm no
longer knows was ended already: applied too. A crash in between leaves an open action that
:func:`resolve_cancel` (reconcile) finishes: ``scancel`` again while Slurm still holds the job (cancelling twice
is harmless), else applied. The key makes a repeated pass (or a decider asking twice) neither cancel twice nor open
a second row. Nothing about a running unit's size changes (the extension never joined, or its leader is gone), so
the action carries no GPUs (``reclaimed`` counts only what a job gave back) and is no resize in the job's usage.
"""

from __future__ import annotations

from collections.abc import Callable

from slurm_elastic.controller.rulings import LIVE_STATES, CancelExtension
from slurm_elastic.slurm.adapter import SlurmControl
from slurm_elastic.slurm.errors import SlurmError, SlurmJobNotFoundError, SlurmTransientError
from slurm_elastic.slurm.model import ClusterSnapshot
from slurm_elastic.store.protocols import ActuatorStore
from slurm_elastic.store.records import ActionKind, ActionRecord, ActionState, FencingToken

#: The outcome of a cancel asked for again (its key is journaled): nothing sent to Slurm.
ALREADY = "cancel already journaled"


def cancel_key(extension_job: int) -> str:
    """The journal key of an extension job's cancel: one per extension job."""
    return f"cancel:{int(extension_job)}"


def cancel_extension(slurm: SlurmControl, store: ActuatorStore, c: CancelExtension, *, decision_id: int | None,
                     cycle_id: int | None, token: FencingToken | None, fault: Callable[[str], None]) -> str:
    """Journal, then cancel extension job ``c.extension_job``; returns the outcome text (:data:`ALREADY` when its
    cancel is journaled already: nothing is sent)."""
    key = cancel_key(c.extension_job)
    if store.journal.find_by_idempotency_key(key) is not None:
        return f"extension job {c.extension_job}: {ALREADY}"
    params: dict[str, object] = {"extension_job": c.extension_job, "nodes": list(c.nodes), "reason": c.reason}
    params.update({"recovery": True} if c.recovery else {"failed_grow": True})
    action_id = store.journal.record_intent(
        job_id=c.unit_id, kind=ActionKind.CANCEL_EXTENSION, idempotency_key=key, decision_id=decision_id,
        cycle_id=cycle_id, nodes=len(c.nodes), gpus=0, fencing=token, params=params)
    fault("cancel:after-intent")
    store.journal.mark_in_progress(action_id, fencing=token)
    return _cancel(slurm, store, action_id, c.extension_job)


def _cancel(slurm: SlurmControl, store: ActuatorStore, action_id: int, ext: int, note: str = "") -> str:
    try:
        slurm.cancel(ext)
    except SlurmJobNotFoundError:
        outcome = f"{note}extension job {ext} already gone"
    except SlurmError as e:
        msg = getattr(e, "message", None) or str(e)
        store.journal.mark_failed(action_id, msg, transient=isinstance(e, SlurmTransientError))
        return f"{note}cancel of extension job {ext} failed: {msg}"
    else:
        outcome = f"{note}extension job {ext} cancelled"
    store.jobs.update_extension(ext, state="CANCELLED", ended=True)
    store.journal.mark_applied(action_id, outcome)
    return outcome


def resolve_cancel(slurm: SlurmControl, store: ActuatorStore, action: ActionRecord, snap: ClusterSnapshot) -> str:
    """An open cancel (a crash, or a transient refusal): cancel again while Slurm still holds the job."""
    ext = int(action.params.get("extension_job") or 0)
    job = snap.job(ext)
    if action.state == ActionState.INTENT:
        store.journal.mark_in_progress(action.id)
    if job is not None and job.state in LIVE_STATES:
        return _cancel(slurm, store, action.id, ext, "reconciled: ")
    if job is not None:
        store.jobs.update_extension(ext, state=job.state, ended=True)
    store.journal.mark_applied(action.id, f"reconciled: extension job {ext} no longer runs")
    return f"reconciled: extension job {ext} no longer runs"
