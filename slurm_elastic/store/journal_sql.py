"""The action journal over SQL: write the intent, then act, then record the outcome.

Every state change is a conditional ``UPDATE ... WHERE id=:id AND state=:expected`` inside a write transaction,
checked against :mod:`slurm_elastic.store.journal_states`; a change that the state machine forbids, or that
lost a race, raises IllegalTransitionError and changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from slurm_elastic.store.coltypes import dump_json
from slurm_elastic.store.database import Database, require_aware
from slurm_elastic.store.errors import (
    ActionNotFoundError,
    DuplicateIntentError,
    IllegalTransitionError,
    StoreConflictError,
    StoreInputError,
)
from slurm_elastic.store.journal_states import state_after_failure, transition_problem
from slurm_elastic.store.lease_sql import check_fencing
from slurm_elastic.store.models import ActionColumns
from slurm_elastic.store.records import (
    OPEN_STATES,
    ActionKind,
    ActionRecord,
    ActionState,
    FencingToken,
    GpuTotals,
)

KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}$")  # printable ASCII without spaces: it also goes into job comments
MAX_MESSAGE = 16000
DEFAULT_MAX_ATTEMPTS = 3


def action_record(row: ActionColumns) -> ActionRecord:
    return ActionRecord(
        id=row.id, job_id=row.job_id, kind=ActionKind(row.kind), idempotency_key=row.idempotency_key,
        params=dict(row.params), state=ActionState(row.state), message=row.message, transient=row.transient,
        attempts=row.attempts, nodes=row.nodes, gpus=row.gpus, decision_id=row.decision_id, cycle_id=row.cycle_id,
        fencing_epoch=row.fencing_epoch, created_at=row.created_at, updated_at=row.updated_at,
        finished_at=row.finished_at,
    )


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 15] + " ...[truncated]"


class SqlJournal:
    def __init__(self, db: Database, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> None:
        if max_attempts < 1:
            raise StoreInputError(f"max_attempts must be >= 1, got {max_attempts}")
        self._db = db
        self.max_attempts = max_attempts

    # --- writing --------------------------------------------------------------------------------------------
    def record_intent(
        self,
        *,
        job_id: int,
        kind: ActionKind,
        idempotency_key: str,
        params: Mapping[str, object] | None = None,
        decision_id: int | None = None,
        cycle_id: int | None = None,
        nodes: int = 0,
        gpus: int = 0,
        fencing: FencingToken | None = None,
    ) -> int:
        """Journal an intent and return its action id once it is durably committed. Raises (and commits
        nothing) when the key is already journaled (DuplicateIntentError), the fencing token is stale
        (LeaseLostError) or the database fails (StoreUnavailableError): the caller must then NOT act."""
        if not KEY_RE.match(idempotency_key):
            raise StoreInputError(f"idempotency key must be 1..255 printable ASCII characters without spaces, "
                                  f"got {idempotency_key!r}")
        if nodes < 0 or gpus < 0:
            raise StoreInputError(f"nodes and gpus are magnitudes (>= 0), got nodes={nodes} gpus={gpus}")
        kind = ActionKind(kind)
        payload = dict(params or {})
        try:
            dump_json(payload)
        except (TypeError, ValueError) as e:
            raise StoreInputError(f"action parameters are not JSON: {e}") from e
        now = self._db.now()
        A = self._db.models.action
        try:
            with self._db.write("record intent") as s:
                if fencing is not None:
                    check_fencing(s, self._db.models, fencing, now)
                existing = s.execute(select(A.id).where(A.idempotency_key == idempotency_key)).scalar()
                if existing is not None:
                    raise DuplicateIntentError(idempotency_key, int(existing))
                row = A(job_id=job_id, kind=kind.value, idempotency_key=idempotency_key, params=payload,
                        state=ActionState.INTENT.value, message="", transient=False, attempts=0, nodes=nodes,
                        gpus=gpus, decision_id=decision_id, cycle_id=cycle_id,
                        fencing_epoch=None if fencing is None else fencing.epoch, created_at=now, updated_at=now,
                        finished_at=None)
                s.add(row)
                s.flush()
                action_id = int(row.id)
        except StoreConflictError as e:
            if isinstance(e, DuplicateIntentError):
                raise
            found = self.find_by_idempotency_key(idempotency_key)
            if found is not None:  # lost a race with another writer of the same key
                raise DuplicateIntentError(idempotency_key, found.id) from e
            raise
        return action_id

    def mark_in_progress(self, action_id: int, *, fencing: FencingToken | None = None) -> ActionRecord:
        """intent -> in_progress: the action is under way (Slurm is called next; a shrink's job has been warned
        already); counts one attempt."""
        return self._move(action_id, ActionState.IN_PROGRESS, "mark action in progress", fencing=fencing,
                          attempt=True)

    def mark_applied(self, action_id: int, message: str = "") -> ActionRecord:
        """-> applied, with Slurm's message (e.g. the new extension job's id)."""
        return self._move(action_id, ActionState.APPLIED, "mark action applied", message=message)

    def mark_failed(self, action_id: int, message: str, *, transient: bool) -> ActionRecord:
        """Record Slurm's refusal. From in_progress: a transient failure goes back to intent for another try
        while attempts < max_attempts, anything else goes to failed. From intent (Slurm never asked): failed."""
        op = "mark action failed"
        with self._db.write(op) as s:
            row = self._row(s, action_id)
            current = ActionState(row.state)
            wanted = (state_after_failure(row.attempts, self.max_attempts, transient)
                      if current is ActionState.IN_PROGRESS else ActionState.FAILED)
            if wanted is ActionState.FAILED and transient and current is ActionState.IN_PROGRESS:
                message = f"{message} (gave up after {row.attempts} attempts)"
            return self._apply(s, row, wanted, message=message, transient=transient)

    def note_joined(self, action_id: int, at: datetime) -> ActionRecord:
        """An applied grow's extension joined its job (ran there: Slurm started it, and its prewarm, if any,
        succeeded): ``params["joined_at"]``, once. Only joined grows count as GPUs granted (:meth:`gpu_totals`)."""
        with self._db.write("note grow joined") as s:
            row = self._row(s, action_id)
            if ActionKind(row.kind) is not ActionKind.GROW or ActionState(row.state) is not ActionState.APPLIED:
                raise IllegalTransitionError(row.id, row.state, row.state, "only an applied grow joins")
            if "joined_at" not in (row.params or {}):
                row.params = {**dict(row.params or {}), JOINED_AT: require_aware(at, "at").isoformat()}
                row.updated_at = self._db.now()
                s.flush()
            return action_record(row)

    def abort(self, action_id: int, message: str) -> ActionRecord:
        """-> aborted: reconcile found the action was not (and will not be) done, e.g. the job ended."""
        return self._move(action_id, ActionState.ABORTED, "abort action", message=message)

    def _move(self, action_id: int, wanted: ActionState, op: str, *, message: str | None = None,
              fencing: FencingToken | None = None, attempt: bool = False) -> ActionRecord:
        now = self._db.now()
        with self._db.write(op) as s:
            if fencing is not None:
                check_fencing(s, self._db.models, fencing, now)
            row = self._row(s, action_id)
            return self._apply(s, row, wanted, message=message, attempt=attempt)

    def _row(self, s: Session, action_id: int) -> ActionColumns:
        A = self._db.models.action
        row = s.execute(select(A).where(A.id == action_id).with_for_update()).scalar_one_or_none()
        if row is None:
            raise ActionNotFoundError(action_id)
        return row

    def _apply(self, s: Session, row: ActionColumns, wanted: ActionState, *, message: str | None = None,
               transient: bool | None = None, attempt: bool = False) -> ActionRecord:
        current = ActionState(row.state)
        problem = transition_problem(current, wanted, row.attempts)
        if problem:
            raise IllegalTransitionError(row.id, current.value, wanted.value, problem)
        now = self._db.now()
        values: dict[str, Any] = {"state": wanted.value, "updated_at": now}
        if wanted.is_terminal:
            values["finished_at"] = now
        if message is not None:
            values["message"] = _clip(message)
        if transient is not None:
            values["transient"] = transient
        if attempt:
            values["attempts"] = row.attempts + 1
        A = self._db.models.action
        result = s.execute(
            update(A).where(A.id == row.id, A.state == current.value).values(**values)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            raise IllegalTransitionError(row.id, current.value, wanted.value, "changed concurrently")
        s.refresh(row)
        return action_record(row)

    # --- reading --------------------------------------------------------------------------------------------
    def get(self, action_id: int) -> ActionRecord:
        with self._db.read("read action") as s:
            row = s.get(self._db.models.action, action_id)
            if row is None:
                raise ActionNotFoundError(action_id)
            return action_record(row)

    def find_by_idempotency_key(self, key: str) -> ActionRecord | None:
        A = self._db.models.action
        with self._db.read("find action by idempotency key") as s:
            row = s.execute(select(A).where(A.idempotency_key == key)).scalar_one_or_none()
            return None if row is None else action_record(row)

    def find_by_idempotency_keys(self, keys: Sequence[str]) -> dict[str, ActionRecord]:
        """The actions of those ``keys`` that exist, by key: one query per 500 keys (the controller looks up
        the mold keys of every unit it has not seen yet at once)."""
        A = self._db.models.action
        wanted = sorted(set(keys))
        found: dict[str, ActionRecord] = {}
        with self._db.read("find actions by idempotency keys") as s:
            for i in range(0, len(wanted), 500):
                for row in s.execute(select(A).where(A.idempotency_key.in_(wanted[i:i + 500]))).scalars():
                    found[row.idempotency_key] = action_record(row)
        return found

    def dangling(self, older_than: timedelta = timedelta(0)) -> list[ActionRecord]:
        """Open actions (intent, in_progress) not touched for ``older_than``: after a crash, or a transient
        failure, these must be settled by reading Slurm before anything else is done to their jobs."""
        cutoff = self._db.now() - older_than
        A = self._db.models.action
        with self._db.read("list dangling actions") as s:
            rows = s.execute(
                select(A).where(A.state.in_([st.value for st in OPEN_STATES]), A.updated_at <= cutoff)
                .order_by(A.id)
            ).scalars()
            return [action_record(r) for r in rows]

    def open_actions(self, job_id: int | None = None) -> list[ActionRecord]:
        A = self._db.models.action
        stmt = select(A).where(A.state.in_([st.value for st in OPEN_STATES]))
        if job_id is not None:
            stmt = stmt.where(A.job_id == job_id)
        with self._db.read("list open actions") as s:
            return [action_record(r) for r in s.execute(stmt.order_by(A.id)).scalars()]

    def list_actions(self, *, job_id: int | None = None, since: datetime | None = None,
                     states: Sequence[ActionState] | None = None, limit: int | None = None) -> list[ActionRecord]:
        """Newest first."""
        A = self._db.models.action
        stmt = select(A)
        if job_id is not None:
            stmt = stmt.where(A.job_id == job_id)
        if since is not None:
            stmt = stmt.where(A.created_at >= require_aware(since, "since"))
        if states is not None:
            stmt = stmt.where(A.state.in_([ActionState(st).value for st in states]))
        stmt = stmt.order_by(A.id.desc())
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._db.read("list actions") as s:
            return [action_record(r) for r in s.execute(stmt).scalars()]

    def action_counts(self, since: datetime) -> dict[tuple[ActionKind, ActionState], int]:
        """Actions journaled since ``since``, by kind and current state."""
        A = self._db.models.action
        stmt = (select(A.kind, A.state, func.count()).where(A.created_at >= require_aware(since, "since"))
                .group_by(A.kind, A.state))
        with self._db.read("count actions") as s:
            return {(ActionKind(k), ActionState(st)): int(n) for k, st, n in s.execute(stmt).all()}

    def gpu_totals(self, since: datetime) -> GpuTotals:
        """GPUs granted and reclaimed since ``since``, from applied actions only: granted = the GPUs of grows whose
        extension joined its job since then (:meth:`note_joined`; a grow whose prewarm or resume failed, or that
        never started, grants nothing); reclaimed = the GPUs released by shrinks applied since then (their
        cancelled extensions included) and by applied extension cancels."""
        since = require_aware(since, "since")
        A = self._db.models.action
        stmt = (select(A.kind, func.coalesce(func.sum(A.gpus), 0))
                .where(A.state == ActionState.APPLIED.value, A.finished_at >= since,
                       A.kind.in_([ActionKind.SHRINK.value, ActionKind.CANCEL_EXTENSION.value]))
                .group_by(A.kind))
        # A grow joins after it is applied (submitted): the ones applied up to a day before may join in the window.
        grows = (select(A.gpus, A.params).where(A.state == ActionState.APPLIED.value,
                                                A.kind == ActionKind.GROW.value,
                                                A.finished_at >= since - timedelta(days=1)))
        with self._db.read("sum GPUs moved") as s:
            by_kind = {ActionKind(k): int(n) for k, n in s.execute(stmt).all()}
            granted = sum(int(gpus or 0) for gpus, params in s.execute(grows).all()
                          if _joined_since(params, since))
        return GpuTotals(
            granted=granted,
            reclaimed=by_kind.get(ActionKind.SHRINK, 0) + by_kind.get(ActionKind.CANCEL_EXTENSION, 0),
        )


JOINED_AT = "joined_at"


def _joined_since(params: Mapping[str, Any] | None, since: datetime) -> bool:
    text = (params or {}).get(JOINED_AT)
    if not isinstance(text, str):
        return False
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return False
    return at.tzinfo is not None and at >= since
