"""The action journal: state machine, idempotency, dangling detection, fencing."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from slurm_elastic.store import (
    ActionKind,
    ActionNotFoundError,
    ActionState,
    DuplicateIntentError,
    IllegalTransitionError,
    LeaseLostError,
    SqlStore,
    StoreInputError,
)
from slurm_elastic.store.journal_states import state_after_failure, transition_problem
from tests.unit.storehelpers import FakeClock, memory_store

S = ActionState


@pytest.fixture
def store(clock: FakeClock) -> Iterator[SqlStore]:
    st = memory_store(clock, max_attempts=3)
    yield st
    st.close()


def intent(store: SqlStore, key: str = "grow:42:7:1", job_id: int = 42, **kw: object) -> int:
    return store.journal.record_intent(job_id=job_id, kind=ActionKind.GROW, idempotency_key=key, **kw)  # type: ignore[arg-type]


# --- the pure state machine, table-driven -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("current", "wanted", "attempts", "legal"),
    [
        (S.INTENT, S.IN_PROGRESS, 0, True),
        (S.INTENT, S.ABORTED, 0, True),
        (S.INTENT, S.FAILED, 0, True),
        (S.INTENT, S.APPLIED, 0, False),  # Slurm never asked
        (S.INTENT, S.APPLIED, 1, True),  # a transiently failed attempt did take effect
        (S.INTENT, S.INTENT, 1, False),
        (S.IN_PROGRESS, S.APPLIED, 1, True),
        (S.IN_PROGRESS, S.FAILED, 1, True),
        (S.IN_PROGRESS, S.ABORTED, 1, True),
        (S.IN_PROGRESS, S.INTENT, 1, True),  # transient failure, retry
        (S.IN_PROGRESS, S.IN_PROGRESS, 1, False),
        *[(t, w, 1, False) for t in (S.APPLIED, S.FAILED, S.ABORTED) for w in S],
    ],
)
def test_transition_table(current: ActionState, wanted: ActionState, attempts: int, legal: bool) -> None:
    assert (transition_problem(current, wanted, attempts) is None) is legal


@pytest.mark.parametrize(
    ("attempts", "transient", "expected"),
    [(1, True, S.INTENT), (2, True, S.INTENT), (3, True, S.FAILED), (1, False, S.FAILED)],
)
def test_state_after_failure(attempts: int, transient: bool, expected: ActionState) -> None:
    assert state_after_failure(attempts, 3, transient) is expected


# --- through the store --------------------------------------------------------------------------------------
def test_happy_path_intent_in_progress_applied(store: SqlStore, clock: FakeClock) -> None:
    aid = intent(store, params={"nodes": ["n2"], "partition": "train"}, nodes=1, gpus=4, cycle_id=7)
    rec = store.journal.get(aid)
    assert (rec.state, rec.attempts, rec.message, rec.finished_at) == (S.INTENT, 0, "", None)
    assert rec.params == {"nodes": ["n2"], "partition": "train"} and rec.created_at == clock()
    clock.advance(1)
    rec = store.journal.mark_in_progress(aid)
    assert (rec.state, rec.attempts, rec.updated_at) == (S.IN_PROGRESS, 1, clock())
    clock.advance(2)
    rec = store.journal.mark_applied(aid, "Submitted batch job 77")
    assert (rec.state, rec.message, rec.finished_at) == (S.APPLIED, "Submitted batch job 77", clock())
    assert store.journal.get(aid) == rec


@pytest.mark.parametrize("terminal", ["applied", "failed", "aborted"])
def test_terminal_states_reject_every_transition(store: SqlStore, terminal: str) -> None:
    aid = intent(store)
    store.journal.mark_in_progress(aid)
    {"applied": lambda: store.journal.mark_applied(aid, "ok"),
     "failed": lambda: store.journal.mark_failed(aid, "Invalid job id", transient=False),
     "aborted": lambda: store.journal.abort(aid, "job ended")}[terminal]()
    before = store.journal.get(aid)
    for move in (lambda: store.journal.mark_in_progress(aid), lambda: store.journal.mark_applied(aid, "again"),
                 lambda: store.journal.mark_failed(aid, "x", transient=True), lambda: store.journal.abort(aid, "x")):
        with pytest.raises(IllegalTransitionError, match=f"{terminal} is terminal"):
            move()
    assert store.journal.get(aid) == before  # nothing changed


def test_cannot_apply_what_slurm_was_never_asked(store: SqlStore) -> None:
    aid = intent(store)
    with pytest.raises(IllegalTransitionError, match="0 attempts"):
        store.journal.mark_applied(aid, "?")
    assert store.journal.get(aid).state is S.INTENT


def test_in_progress_twice_is_illegal(store: SqlStore) -> None:
    aid = intent(store)
    store.journal.mark_in_progress(aid)
    with pytest.raises(IllegalTransitionError, match="in_progress -> in_progress"):
        store.journal.mark_in_progress(aid)
    assert store.journal.get(aid).attempts == 1


def test_transient_failures_retry_until_max_attempts(store: SqlStore) -> None:
    aid = intent(store)
    for attempt in (1, 2):
        store.journal.mark_in_progress(aid)
        rec = store.journal.mark_failed(aid, "slurm_load_jobs error: Socket timed out", transient=True)
        assert (rec.state, rec.attempts, rec.transient) == (S.INTENT, attempt, True)
        assert rec.finished_at is None
    store.journal.mark_in_progress(aid)
    rec = store.journal.mark_failed(aid, "Socket timed out", transient=True)
    assert rec.state is S.FAILED and rec.attempts == 3
    assert rec.message == "Socket timed out (gave up after 3 attempts)"


def test_transiently_failed_attempt_found_applied_by_reconcile(store: SqlStore) -> None:
    aid = intent(store)
    store.journal.mark_in_progress(aid)
    store.journal.mark_failed(aid, "sbatch timed out", transient=True)
    rec = store.journal.mark_applied(aid, "found extension job 88 with the key in its comment")
    assert rec.state is S.APPLIED and rec.attempts == 1


def test_permanent_failure_is_final_with_slurms_message(store: SqlStore) -> None:
    aid = intent(store)
    store.journal.mark_in_progress(aid)
    rec = store.journal.mark_failed(aid, "scontrol: error: Invalid job id specified", transient=False)
    assert (rec.state, rec.transient, rec.message) == (S.FAILED, False, "scontrol: error: Invalid job id specified")


def test_failing_an_intent_before_slurm_is_final_even_if_transient(store: SqlStore) -> None:
    aid = intent(store)
    assert store.journal.mark_failed(aid, "job already gone", transient=True).state is S.FAILED


def test_unknown_action(store: SqlStore) -> None:
    with pytest.raises(ActionNotFoundError):
        store.journal.mark_in_progress(999)
    with pytest.raises(ActionNotFoundError):
        store.journal.get(999)


# --- idempotency ----------------------------------------------------------------------------------------------
def test_duplicate_idempotency_key_is_refused_and_points_at_the_original(store: SqlStore) -> None:
    first = intent(store, "grow:42:7:1")
    with pytest.raises(DuplicateIntentError) as err:
        intent(store, "grow:42:7:1")
    assert err.value.existing_id == first
    assert len(store.journal.list_actions()) == 1
    found = store.journal.find_by_idempotency_key("grow:42:7:1")
    assert found is not None and found.id == first
    assert store.journal.find_by_idempotency_key("grow:42:7:2") is None


def test_key_stays_taken_after_the_action_finished(store: SqlStore) -> None:
    aid = intent(store)
    store.journal.mark_in_progress(aid)
    store.journal.mark_applied(aid, "ok")
    with pytest.raises(DuplicateIntentError):
        intent(store)


@pytest.mark.parametrize("key", ["", "has space", "new\nline", "x" * 256, "ünï"])
def test_bad_keys_are_refused(store: SqlStore, key: str) -> None:
    with pytest.raises(StoreInputError, match="idempotency key"):
        intent(store, key)
    assert store.journal.list_actions() == []


def test_non_json_params_are_refused_before_anything_is_written(store: SqlStore) -> None:
    with pytest.raises(StoreInputError, match="not JSON"):
        intent(store, params={"x": object()})
    with pytest.raises(StoreInputError, match="not JSON"):
        intent(store, params={"x": float("nan")})
    assert store.journal.list_actions() == []


# --- dangling, queries ----------------------------------------------------------------------------------------
def test_dangling_lists_open_actions_older_than_the_cutoff(store: SqlStore, clock: FakeClock) -> None:
    stuck_intent = intent(store, "grow:1:1:1", job_id=1)
    stuck_progress = intent(store, "shrink:2:1:1", job_id=2)
    store.journal.mark_in_progress(stuck_progress)
    done = intent(store, "shrink:3:1:1", job_id=3)
    store.journal.mark_in_progress(done)
    store.journal.mark_applied(done, "ok")
    clock.advance(120)
    fresh = intent(store, "grow:4:2:1", job_id=4)
    assert [a.id for a in store.journal.dangling(timedelta(seconds=60))] == [stuck_intent, stuck_progress]
    assert [a.id for a in store.journal.dangling()] == [stuck_intent, stuck_progress, fresh]
    assert [a.id for a in store.journal.open_actions(job_id=2)] == [stuck_progress]
    store.journal.abort(stuck_intent, "reconcile: job 1 ended")
    assert [a.id for a in store.journal.dangling(timedelta(seconds=60))] == [stuck_progress]


def test_counts_and_gpu_totals(store: SqlStore, clock: FakeClock) -> None:
    since = clock()
    g = intent(store, "grow:1:1:1", job_id=1, gpus=8, nodes=2)
    store.journal.mark_in_progress(g)
    store.journal.mark_applied(g, "ok")
    s = store.journal.record_intent(job_id=2, kind=ActionKind.SHRINK, idempotency_key="shrink:2:1:1", gpus=4, nodes=1)
    store.journal.mark_in_progress(s)
    store.journal.mark_applied(s, "ok")
    c = store.journal.record_intent(job_id=1, kind=ActionKind.CANCEL_EXTENSION, idempotency_key="cancel:9:1", gpus=2)
    store.journal.mark_in_progress(c)
    store.journal.mark_applied(c, "ok")
    f = intent(store, "grow:3:1:1", job_id=3, gpus=16)
    store.journal.mark_in_progress(f)
    store.journal.mark_failed(f, "no", transient=False)  # failed grows grant nothing
    totals = store.journal.gpu_totals(since)
    assert (totals.granted, totals.reclaimed) == (0, 6)  # submitted, not joined: nothing granted yet
    unjoined = intent(store, "grow:5:1:1", job_id=5, gpus=4)  # applied, its extension never ran (failed prewarm)
    store.journal.mark_in_progress(unjoined)
    store.journal.mark_applied(unjoined, "ok")
    joined_at = clock.advance(5)
    store.journal.note_joined(g, joined_at)
    store.journal.note_joined(g, clock.advance(5))  # once: the first join stands
    assert store.journal.get(g).params["joined_at"] == joined_at.isoformat()
    with pytest.raises(IllegalTransitionError):
        store.journal.note_joined(f, joined_at)  # a failed grow never joins
    assert store.journal.gpu_totals(since).granted == 8
    assert store.journal.gpu_totals(joined_at).granted == 8
    assert store.journal.gpu_totals(clock.advance(1)).granted == 0  # joined before the window
    counts = store.journal.action_counts(since)
    assert counts == {(ActionKind.GROW, S.APPLIED): 2, (ActionKind.SHRINK, S.APPLIED): 1,
                      (ActionKind.CANCEL_EXTENSION, S.APPLIED): 1, (ActionKind.GROW, S.FAILED): 1}
    assert [a.id for a in store.journal.list_actions(job_id=1)] == [c, g]
    assert [a.id for a in store.journal.list_actions(states=[S.FAILED])] == [f]


def test_negative_magnitudes_refused(store: SqlStore) -> None:
    with pytest.raises(StoreInputError):
        intent(store, gpus=-1)


# --- fencing --------------------------------------------------------------------------------------------------
def test_intent_needs_a_current_fencing_token(store: SqlStore, clock: FakeClock) -> None:
    ttl = timedelta(seconds=30)
    lease_a = store.lease.acquire("ctl-a", ttl)
    assert lease_a is not None
    aid = intent(store, "grow:1:1:1", fencing=lease_a.token())
    assert store.journal.get(aid).fencing_epoch == lease_a.epoch
    clock.advance(31)  # ctl-a stalls past its TTL; ctl-b takes over
    lease_b = store.lease.acquire("ctl-b", ttl)
    assert lease_b is not None and lease_b.epoch == lease_a.epoch + 1
    with pytest.raises(LeaseLostError, match="held by ctl-b"):
        intent(store, "grow:1:2:1", fencing=lease_a.token())
    with pytest.raises(LeaseLostError):
        store.journal.mark_in_progress(aid, fencing=lease_a.token())
    assert store.journal.find_by_idempotency_key("grow:1:2:1") is None
    assert store.journal.get(aid).state is S.INTENT
    assert intent(store, "grow:1:2:1", fencing=lease_b.token()) > aid


def test_expired_token_is_refused_even_if_nobody_took_over(store: SqlStore, clock: FakeClock) -> None:
    lease = store.lease.acquire("ctl-a", timedelta(seconds=10))
    assert lease is not None
    clock.advance(10)
    with pytest.raises(LeaseLostError, match="expired"):
        intent(store, fencing=lease.token())
