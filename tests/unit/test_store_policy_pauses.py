"""Policy versions with rollback, and pauses (job, partition, global)."""

from __future__ import annotations

import pytest

from slurm_elastic.store import (
    JobObservation,
    PauseScope,
    PolicyVersionNotFoundError,
    SqlStore,
    StoreInputError,
)
from tests.unit.storehelpers import FakeClock


def test_versions_grow_and_rollback_is_a_new_version(store: SqlStore, clock: FakeClock) -> None:
    assert store.policies.current_policy() is None
    v1 = store.policies.add_policy('version = 1\n[defaults]\nwindow = "10m"\n', author="root", comment="initial")
    clock.advance(60)
    v2 = store.policies.add_policy('version = 1\n[defaults]\nwindow = "5m"\n', author="alice", comment="faster")
    assert (v1.version, v2.version) == (1, 2)
    assert store.policies.current_policy() == v2
    clock.advance(60)
    v3 = store.policies.rollback_policy(1, author="root")
    assert (v3.version, v3.toml_text, v3.rollback_of, v3.comment) == (3, v1.toml_text, 1, "rollback to version 1")
    assert v3.created_at == clock() and v3.author == "root"
    assert [p.version for p in store.policies.policy_history()] == [3, 2, 1]
    assert [p.version for p in store.policies.policy_history(limit=1)] == [3]
    assert store.policies.get_policy(2) == v2
    with pytest.raises(PolicyVersionNotFoundError):
        store.policies.rollback_policy(9, author="root")
    with pytest.raises(StoreInputError):
        store.policies.add_policy("x = 1", author="")


def test_large_policy_text_round_trips(store: SqlStore) -> None:
    text = "# " + "x" * 200_000 + "\nversion = 1\n"
    assert store.policies.add_policy(text, author="root").toml_text == text
    current = store.policies.current_policy()
    assert current is not None and current.toml_text == text


def test_pause_scopes_and_precedence(store: SqlStore) -> None:
    store.jobs.upsert_job(JobObservation(job_id=7, user="alice", partition="train", state="RUNNING",
                                         current_nodes=1, min_nodes=1, max_nodes=2))
    assert store.pauses.active_pause(7, "train") is None
    job = store.pauses.pause(PauseScope.JOB, "7", who="root", reason="debugging")
    got = store.jobs.get_job(7)
    assert got is not None and got.paused is True
    assert store.pauses.active_pause(7, "train") == job
    assert store.pauses.active_pause(8, "train") is None
    part = store.pauses.pause(PauseScope.PARTITION, "train", who="root")
    assert store.pauses.active_pause(8, "train") == part
    assert store.pauses.active_pause(7, "train") == part  # broadest first
    glob = store.pauses.pause(PauseScope.GLOBAL, None, who="slurm")
    assert store.pauses.active_pause(9, "serve") == glob
    assert [(p.scope, p.target) for p in store.pauses.list_pauses()] == [
        (PauseScope.GLOBAL, ""), (PauseScope.PARTITION, "train"), (PauseScope.JOB, "7")]
    assert store.pauses.resume(PauseScope.GLOBAL, None) is True
    assert store.pauses.resume(PauseScope.GLOBAL, None) is False
    assert store.pauses.resume(PauseScope.JOB, 7) is True
    got = store.jobs.get_job(7)
    assert got is not None and got.paused is False


def test_pausing_twice_keeps_the_first(store: SqlStore, clock: FakeClock) -> None:
    first = store.pauses.pause(PauseScope.PARTITION, "train", who="alice")
    clock.advance(5)
    again = store.pauses.pause(PauseScope.PARTITION, "train", who="bob")
    assert again == first and len(store.pauses.list_pauses()) == 1


@pytest.mark.parametrize(("scope", "target"), [(PauseScope.JOB, "abc"), (PauseScope.JOB, "0"),
                                               (PauseScope.PARTITION, ""), (PauseScope.GLOBAL, "x")])
def test_bad_pause_targets(store: SqlStore, scope: PauseScope, target: str) -> None:
    with pytest.raises(StoreInputError):
        store.pauses.pause(scope, target, who="root")
