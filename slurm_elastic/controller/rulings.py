"""What the controller's own deciders return (kueue's shape: facts in, decisions out, writes after).

Besides the policy (``decide``), four pure deciders look at a cycle's facts: failed resumes (power.py), failed or
joined prewarms (coldstart.py), losses to Slurm (losses.py) and moldable starts (policy/moldable.py's
``decide_molds``, run by molds.py). The first three return :class:`Ruling`\\ s: the decision to record (a stable
reason code and a message with its numbers) and, where the decision ends an extension job, the
:class:`CancelExtension` the actuator carries out after the decision is recorded, journaled first
(``cancel_extension``, store/records.py). :class:`CycleContext` is what every write step of one cycle shares.
Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from slurm_elastic.store.records import FencingToken, NewDecision

#: Slurm job states in which an extension job still holds (or waits for) its nodes: one to cancel.
LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING"})


@dataclass(frozen=True)
class CancelExtension:
    """End extension job ``extension_job`` of ``unit_id``: a grow that failed before it joined (``reason``), or
    one of reconcile's recoveries (``recovery``: a duplicate, an orphan, an extension pending on a dead node)."""

    unit_id: int
    extension_job: int
    # the decision's reason code (RESUME_FAILED, PREWARM_FAILED), or the recovery's (controller/reconcile.py):
    # DUPLICATE_EXTENSION, ORPHAN_EXTENSION, PENDING_ON_DEAD_NODE
    reason: str
    nodes: tuple[str, ...] = ()  # the extension's nodes, for the journal
    recovery: bool = False  # reconcile's, with no decision: it changes no running unit's size either



@dataclass(frozen=True)
class Ruling:
    """One decision of a controller decider, and the Slurm write it asks for (None: record only)."""

    decision: NewDecision
    cancel: CancelExtension | None = None


@dataclass(frozen=True)
class CycleContext:
    """What every action of one cycle shares."""

    cycle_id: int
    token: FencingToken | None
    now: datetime
