"""Last phase of a cycle: actions held because of the shell's state, each with its reason code.

* **ACTION_IN_PROGRESS**: the unit has an unfinished action (a shrink in its grace period, a grow being
  submitted): no second action for it until that one is done.
* **GROW_BACKOFF**: extension jobs of the unit ended on their own within :data:`SHORT_LIFE_S` of their submission
  (a bad script, an output they cannot open, a failing node): growing again at once would only repeat it. Grows
  wait :data:`FIRST_WAIT_S` after the last such end, doubling per such end in the last :data:`LOOKBACK_S`, at
  most :data:`MAX_WAIT_S`. Ends that are no failure of the job do not count: our own cancels and normal ends
  (CANCELLED, COMPLETED) and Slurm-side losses (:data:`SLURM_LOSS_STATES`: PREEMPTED, NODE_FAIL), after which
  the cooldown is the only wait. A grow the controller saw fail counts whatever Slurm's end state says
  (:attr:`ExtensionEnd.failure`): its prewarm failed (the cancelled extension may end COMPLETED), its
  powered-down node did not resume (NODE_FAIL, or CANCELLED by us), or sbatch refused the extension.

Both run after the walk and the action cap, on the actions those let through: a held action keeps what it was
given there (its nodes stay free for the next cycle, its place under ``max_actions_per_cycle`` is not handed to
another unit), exactly as when the shell held it itself. The held decision says what it would have done
(``inputs["would"]`` and the message); its other inputs are times, not countdowns, so that a hold that goes on
reads the same from one cycle to the next.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType

from slurm_elastic.policy.model import ActionInProgress, Decision, ExtensionEnd, PolicyInput, Scalar
from slurm_elastic.policy.reasons import Action, Reason
from slurm_elastic.policy.wording import ago

SHORT_LIFE_S = 600.0  # an extension that ends sooner than this after submission died on its own
LOOKBACK_S = 3600.0  # such ends count for this long
FIRST_WAIT_S = 60.0
MAX_WAIT_S = 3600.0
#: Extension end states that are no failure of the job: our own cancels (shrink, orphan) and normal ends.
ENDS_BY_US = frozenset({"CANCELLED", "COMPLETED"})
#: Extension end states in which Slurm took the nodes away (the controller records them as losses).
SLURM_LOSS_STATES = frozenset({"PREEMPTED", "NODE_FAIL"})


@dataclass(frozen=True)
class Backoff:
    """A unit's grow back-off at ``now``: the failed extension ends counted, the wait and what is left of it."""

    failures: tuple[ExtensionEnd, ...]  # newest end first
    wait_s: float
    left_s: float


def is_failure(end: ExtensionEnd, now: datetime) -> bool:
    """A grow that failed (the controller says so, or its extension died on its own), recently enough to count
    for the back-off."""
    if end.ended_at <= now - timedelta(seconds=LOOKBACK_S):
        return False
    if end.failure:
        return True
    return (end.state not in ENDS_BY_US and end.state not in SLURM_LOSS_STATES
            and (end.ended_at - end.submitted_at).total_seconds() < SHORT_LIFE_S)


def backoff_until(b: Backoff) -> datetime:
    """When the back-off ``b`` ends: its wait after the newest failure."""
    return b.failures[0].ended_at + timedelta(seconds=b.wait_s)


def describe(end: ExtensionEnd) -> str:
    """One failed grow in words, for messages and views."""
    if end.failure == "GROW_REFUSED":
        return "extension sbatch refused"
    if end.failure:
        return f"extension job {end.job_id}: {end.failure}"
    return f"extension job {end.job_id} ended {end.state}"


def backoff_message(b: Backoff) -> str:
    last, until = b.failures[0], backoff_until(b)
    at = f"next grow in {b.left_s:.0f}s, at {until.strftime('%Y-%m-%dT%H:%M:%SZ')}"
    if not any(e.failure for e in b.failures):
        return (f"{len(b.failures)} extension job(s) ended on their own within {SHORT_LIFE_S:.0f}s "
                f"(last {last.job_id}: {last.state}); {at}")
    return f"{len(b.failures)} failed grow(s) in the last {LOOKBACK_S / 60:.0f} min (last: {describe(last)}); {at}"


def grow_backoff(ends: Iterable[ExtensionEnd], now: datetime) -> Backoff | None:
    """The back-off of one unit's grows given its extension jobs' ends, or None when it may grow."""
    failures = sorted((e for e in ends if is_failure(e, now)), key=lambda e: (e.ended_at, e.job_id), reverse=True)
    if not failures:
        return None
    wait = min(MAX_WAIT_S, FIRST_WAIT_S * 2 ** (len(failures) - 1))
    left = wait - (now - failures[0].ended_at).total_seconds()
    return Backoff(tuple(failures), wait, left) if left > 0 else None


def hold_blocked(decisions: list[Decision], inp: PolicyInput, now: datetime) -> list[Decision]:
    """``decisions`` with the actions of units that have one in progress, or whose grows back off, held."""
    busy: dict[int, ActionInProgress] = {}
    for act in sorted(inp.in_progress, key=lambda a: (a.since, a.kind)):
        busy.setdefault(act.unit_id, act)  # the oldest unfinished action is the one named
    ends: dict[int, list[ExtensionEnd]] = {}
    for e in inp.extension_ends:
        ends.setdefault(e.unit_id, []).append(e)
    out: list[Decision] = []
    for d in decisions:
        if not d.is_action:
            out.append(d)
        elif (a := busy.get(d.unit_id)) is not None:
            since = (now - a.since).total_seconds()
            out.append(_held(d, Reason.ACTION_IN_PROGRESS,
                             f"its {a.kind} decided {ago(since)} ago is not finished",
                             {"in_progress": a.kind, "in_progress_since": a.since.isoformat()}))
        elif d.action is Action.GROW and (b := grow_backoff(ends.get(d.unit_id, ()), now)) is not None:
            last = b.failures[0]
            out.append(_held(d, Reason.GROW_BACKOFF, backoff_message(b),
                             {"extension_failures": len(b.failures), "backoff_s": b.wait_s,
                              "backoff_until": backoff_until(b).isoformat(),
                              "last_failed_extension": last.job_id,
                              "last_failure": last.failure or last.state}))
        else:
            out.append(d)
    return out


def _held(d: Decision, reason: Reason, why: str, extra: Mapping[str, Scalar]) -> Decision:
    inputs = dict(d.inputs)
    inputs["would"] = str(d.reason)
    inputs.update(extra)
    return Decision(
        unit_id=d.unit_id, display_id=d.display_id, action=Action.HOLD, current_nodes=d.current_nodes,
        target_nodes=d.current_nodes, reason=reason,
        message=f"would {d.action} {d.current_nodes} -> {d.target_nodes} ({d.reason}: {d.message}); {why}",
        basis=d.basis, priority=d.priority, inputs=MappingProxyType(inputs), profile=d.profile,
    )
