"""The grows that ended, as the grow back-off counts them (policy/holds.py, GROW_BACKOFF).

From the store: each extension job that ended within the look-back with Slurm's end state, and every grow the
controller saw fail whatever that state says:

* ``PREWARM_FAILED`` (controller/coldstart.py): the controller cancelled the extension, whose launcher then often
  exits 0, so Slurm says COMPLETED, an end "by us" that would not count;
* ``RESUME_FAILED`` (controller/power.py): Slurm ended the extension NODE_FAIL (a loss, not counted) or the
  controller cancelled it;
* a grow whose sbatch Slurm refused (journaled FAILED; there is no extension job): ``GROW_REFUSED``.

Such a failure ends when the controller saw it fail (its record's ``failed_at``; else the record's time).
:func:`unit_backoff` is the same back-off for one job, for ``explain``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from slurm_elastic.policy.holds import LOOKBACK_S, Backoff, backoff_until, grow_backoff
from slurm_elastic.policy.model import ExtensionEnd
from slurm_elastic.policy.reasons import Reason
from slurm_elastic.store.protocols import ControllerStore
from slurm_elastic.store.records import ActionKind, ActionState, DecisionFilter

#: Holds the controller records for a grow that failed, naming its extension job (inputs["extension_job"]).
FAILED_GROW_REASONS = (Reason.PREWARM_FAILED, Reason.RESUME_FAILED)
REFUSED = "GROW_REFUSED"
#: The failure record's input naming when the grow failed (the cycle's clock, which the back-off it names uses).
FAILED_AT = "failed_at"


def _failed_at(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None


def extension_ends(store: ControllerStore, now: datetime, job_id: int | None = None) -> list[ExtensionEnd]:
    """The grows of the look-back that ended (of ``job_id``, or of every unit), each once."""
    since = now - timedelta(seconds=LOOKBACK_S)
    failed: dict[int, tuple[datetime, str, int]] = {}  # extension job -> (recorded at, reason, unit)
    for reason in FAILED_GROW_REASONS:
        for d in store.decisions.list_decisions(DecisionFilter(job_id=job_id, reason=str(reason), since=since)):
            ext = d.inputs.get("extension_job")
            if isinstance(ext, int) and not isinstance(ext, bool) and ext not in failed:
                failed[ext] = (_failed_at(d.inputs.get(FAILED_AT)) or d.time, str(reason), d.job_id)
    out: list[ExtensionEnd] = []
    for e in store.jobs.extensions(job_id, active_only=False, ended_since=since):
        if e.job_id in failed:
            at, why, _ = failed.pop(e.job_id)
            out.append(ExtensionEnd(e.parent_job_id, e.job_id, e.state, e.created_at, at, failure=why))
        elif e.ended_at is not None:
            out.append(ExtensionEnd(e.parent_job_id, e.job_id, e.state, e.created_at, e.ended_at))
    for ext, (at, why, unit) in failed.items():  # an extension record no longer listed: the failure counts
        out.append(ExtensionEnd(unit, ext, why, at, at, failure=why))
    for a in store.journal.list_actions(job_id=job_id, since=since, states=[ActionState.FAILED]):
        if a.kind == ActionKind.GROW:
            out.append(refused_grow_end(a.job_id, a.created_at, a.finished_at or a.updated_at))
    return out


def refused_grow_end(unit_id: int, decided_at: datetime, failed_at: datetime) -> ExtensionEnd:
    """A grow journaled FAILED (no extension job ran) as the back-off counts it: the controller's refused sbatch,
    the simulator's grow the engine could not apply (sim/policy_adapter.py). Pure."""
    return ExtensionEnd(unit_id, 0, "REFUSED", decided_at, failed_at, failure=REFUSED)


def unit_backoff(store: ControllerStore, job_id: int, now: datetime) -> Backoff | None:
    """Job ``job_id``'s grow back-off at ``now`` (None: it may grow), as the next cycle's policy sees it."""
    return grow_backoff(extension_ends(store, now, job_id), now)


def backoff_after(store: ControllerStore, unit_id: int, failed: ExtensionEnd, now: datetime) -> Backoff | None:
    """The unit's grow back-off once ``failed`` (a failure being recorded now) counts: for its record's text."""
    return backoff_with(extension_ends(store, now, unit_id), unit_id, failed, now)


def backoff_with(ends: Iterable[ExtensionEnd], unit_id: int, failed: ExtensionEnd, now: datetime) -> Backoff | None:
    """The unit's grow back-off once ``failed`` counts, from the look-back's ``ends`` (:func:`extension_ends` of
    every unit, read before this cycle recorded anything). Pure: :func:`backoff_after` without the store."""
    mine = [e for e in ends if e.unit_id == unit_id and (e.job_id != failed.job_id or failed.job_id == 0)]
    return grow_backoff([*mine, failed], now)


def backoff_note(b: Backoff | None) -> dict[str, object]:
    """The inputs a failure record carries about the back-off it starts."""
    if b is None:
        return {}
    return {FAILED_AT: b.failures[0].ended_at.isoformat(), "grow_backoff_s": b.wait_s,
            "grow_backoff_until": backoff_until(b).isoformat(),
            "failed_grows": len(b.failures)}


def backoff_text(b: Backoff | None) -> str:
    """The back-off a failure starts, for its record's message."""
    if b is None:
        return "its grows back off (GROW_BACKOFF)"
    return (f"its grows back off until {backoff_until(b).strftime('%Y-%m-%dT%H:%M:%SZ')} (GROW_BACKOFF, "
            f"{len(b.failures)} failed grow(s) in the last hour)")
