"""Every Slurm write the soak's jobs received, as slurmctld logged it, held against the controller's journal.

The controller's rule is "journaled first": before it submits an extension, signals or resizes a job, or cancels an
extension, an action row exists (``created_at``), and the row is closed (``finished_at``) only after Slurm answered.
So each write that slurmctld logs on one of the soak's jobs must fall inside the life of a journal row that names
that job; a write no row covers is a Slurm write with no journal entry.

What slurmctld 22.05 logs at ``SlurmctldDebug=info`` for the three client calls the controller makes (one line per
RPC, local time with milliseconds, written after the RPC arrived and before the reply):

* ``sbatch``: ``_slurm_rpc_submit_batch_job: JobId=N InitPrio=... usec=...``
* ``scancel`` (a cancel, or a signal such as the grace signal): ``_slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=N uid U``
* ``scontrol update JobId=N ...``: ``_slurm_rpc_update_job: complete JobId=N uid=U usec=...`` (or, refused,
  ``_slurm_rpc_update_job: JobId=N uid=U: <error>``)

Which row covers a write on job X, unit L (X is L itself, or one of L's extension jobs), at time t
(``created_at <= t <= finished_at``, an open row covering everything after its creation):

* a submit of extension X: L's GROW whose idempotency key is the one X carries (the extension records hold it);
* a kill or update of the leader L: any row of L (a shrink's grace signal and release, a grow's give-back of
  time, a mold);
* a kill or update of extension X: a row of X itself, or a row of L that names X in its parameters (a shrink's
  ``cancel_extensions``/``shrink_extension``, a ``cancel_extension``'s ``extension_job``: a failed grow's, or one
  of reconcile's recoveries of a duplicate, an orphan or an extension pending on a dead node). Nothing else: the
  GROW that made X no longer covers reconcile's cancel of a duplicate, which is journaled on its own now.

Pure functions over text and records; tests/unit/test_soak_audit.py checks them on a log recorded from the
namespace cluster.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

from slurm_elastic.store.records import ActionKind, ActionRecord

_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\] (.*)$")
_RPCS = (
    ("submit", re.compile(r"_slurm_rpc_submit_batch_job: JobId=(\d+)\b")),
    ("kill", re.compile(r"_slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=(\d+)\b")),
    ("update", re.compile(r"_slurm_rpc_update_job: (?:complete )?JobId=(\d+)\b")),
)
#: The log's milliseconds are truncated: a write logged at t arrived before t + 1 ms.
TICK = timedelta(milliseconds=1)


@dataclass(frozen=True)
class SlurmWrite:
    at: datetime  # aware
    rpc: str  # submit | kill | update
    job_id: int
    line: str


def slurm_writes(lines: Iterable[str], since: datetime, until: datetime, tz: tzinfo | None = None
                 ) -> list[SlurmWrite]:
    """The job writes slurmctld logged in [since, until] (aware datetimes). The log's times are naive, in
    slurmctld's time zone: ``tz``, or this host's (where the test cluster's slurmctld runs) when None."""
    out = []
    for line in lines:
        m = _STAMP.match(line)
        if m is None:
            continue
        for rpc, pattern in _RPCS:
            hit = pattern.search(m.group(2))
            if hit is not None:
                naive = datetime.fromisoformat(m.group(1))
                at = naive.astimezone() if tz is None else naive.replace(tzinfo=tz)
                if since <= at <= until:
                    out.append(SlurmWrite(at, rpc, int(hit.group(1)), line.rstrip("\n")))
                break
    return out


def _names(value: object, job_id: int) -> bool:
    """Whether ``job_id`` appears anywhere in an action's parameters (as a number or its digits)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value == job_id
    if isinstance(value, str):
        return value == str(job_id)
    if isinstance(value, Mapping):
        return any(_names(v, job_id) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_names(v, job_id) for v in value)
    return False


def _alive(a: ActionRecord, at: datetime) -> bool:
    return a.created_at <= at + TICK and (a.finished_at is None or a.finished_at + TICK >= at)


def _covers(a: ActionRecord, w: SlurmWrite, leader: int, key: str | None) -> bool:
    if w.rpc == "submit":
        return a.kind == ActionKind.GROW and a.job_id == leader and key is not None and a.idempotency_key == key
    if w.job_id == leader:
        return a.job_id == leader
    if a.job_id == w.job_id:
        return True
    return a.job_id == leader and _names(a.params, w.job_id)


def unjournaled(writes: Iterable[SlurmWrite], actions: Sequence[ActionRecord], leaders: Iterable[int],
                extension_parent: Mapping[int, int], extension_key: Mapping[int, str]) -> list[SlurmWrite]:
    """The writes no journal row covers. ``extension_parent``: every extension job id -> its leader (from sacct,
    Slurm's own record); ``extension_key``: extension job id -> the idempotency key the controller recorded for it.
    A write on a job that is neither a leader nor an extension of one is uncovered too (nothing else may be
    written while the soak runs)."""
    by_job: dict[int, list[ActionRecord]] = {}
    for a in actions:
        by_job.setdefault(a.job_id, []).append(a)
    leader_ids = set(leaders)
    out = []
    for w in writes:
        leader = w.job_id if w.job_id in leader_ids else extension_parent.get(w.job_id)
        if leader is None:
            out.append(w)
            continue
        key = extension_key.get(w.job_id)
        rows = by_job.get(leader, []) + (by_job.get(w.job_id, []) if w.job_id != leader else [])
        if not any(_alive(a, w.at) and _covers(a, w, leader, key) for a in rows):
            out.append(w)
    return out


def count_by_rpc(writes: Iterable[SlurmWrite]) -> dict[str, int]:
    out = {"submit": 0, "kill": 0, "update": 0}
    for w in writes:
        out[w.rpc] += 1
    return out
