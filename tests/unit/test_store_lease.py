"""The HA lease: acquire/renew/release, expiry and takeover with fencing tokens, and real races between two
engines on one SQLite file (threads released together by a barrier; the database decides who wins)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from slurm_elastic.store import DuplicateIntentError, LeaseRecord, SqlStore, StoreInputError
from slurm_elastic.store.records import ActionKind
from tests.unit.storehelpers import FakeClock, file_store

TTL = timedelta(seconds=30)


def test_first_acquire_creates_epoch_one_and_reacquire_keeps_it(store: SqlStore, clock: FakeClock) -> None:
    a = store.lease.acquire("ctl-a", TTL)
    assert a is not None and (a.holder, a.epoch, a.expires_at) == ("ctl-a", 1, clock() + TTL)
    clock.advance(5)
    again = store.lease.acquire("ctl-a", TTL)
    assert again is not None and again.epoch == 1 and again.acquired_at == a.acquired_at
    assert again.expires_at == clock() + TTL


def test_other_holder_is_refused_until_expiry_then_takes_over_with_new_epoch(store: SqlStore,
                                                                            clock: FakeClock) -> None:
    a = store.lease.acquire("ctl-a", TTL)
    assert a is not None
    clock.advance(29.999)
    assert store.lease.acquire("ctl-b", TTL) is None
    clock.advance(0.001)  # exactly at expires_at: expired
    b = store.lease.acquire("ctl-b", TTL)
    assert b is not None and (b.holder, b.epoch) == ("ctl-b", 2)
    assert store.lease.renew(a.token(), TTL) is None  # the old holder cannot renew
    assert store.lease.release(a.token()) is False  # nor release the new holder's lease
    current = store.lease.get()
    assert current is not None and current.holder == "ctl-b" and current.is_held(clock())


def test_renew_extends_only_while_held(store: SqlStore, clock: FakeClock) -> None:
    a = store.lease.acquire("ctl-a", TTL)
    assert a is not None
    clock.advance(20)
    r = store.lease.renew(a.token(), TTL)
    assert r is not None and r.expires_at == clock() + TTL and r.epoch == a.epoch
    clock.advance(30)
    assert store.lease.renew(a.token(), TTL) is None  # expired: must re-acquire
    again = store.lease.acquire("ctl-a", TTL)
    assert again is not None and again.epoch == a.epoch + 1  # a new epoch after a lapse


def test_release_lets_the_standby_in_at_once(store: SqlStore) -> None:
    a = store.lease.acquire("ctl-a", TTL)
    assert a is not None
    assert store.lease.release(a.token()) is True
    released = store.lease.get()
    assert released is not None and released.holder is None
    with pytest.raises(ValueError, match="released"):
        released.token()
    b = store.lease.acquire("ctl-b", TTL)
    assert b is not None and b.epoch == 2


def test_leases_are_independent_by_name(store: SqlStore) -> None:
    assert store.lease.acquire("ctl-a", TTL, name="controller") is not None
    assert store.lease.acquire("ctl-b", TTL, name="retention") is not None
    assert store.lease.acquire("ctl-b", TTL, name="controller") is None


def test_bad_arguments(store: SqlStore) -> None:
    with pytest.raises(StoreInputError):
        store.lease.acquire("", TTL)
    with pytest.raises(StoreInputError):
        store.lease.acquire("a", timedelta(0))


# --- races: two engines on the same SQLite file ---------------------------------------------------------------
def race(fns: dict[str, Callable[[], object]]) -> dict[str, object]:
    barrier = threading.Barrier(len(fns))
    out: dict[str, object] = {}
    errors: list[BaseException] = []

    def run(tag: str, fn: Callable[[], object]) -> None:
        barrier.wait()
        try:
            out[tag] = fn()
        except BaseException as e:  # collected and re-raised in the test thread
            errors.append(e)
            out[tag] = e

    threads = [threading.Thread(target=run, args=(t, f)) for t, f in fns.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return out


@pytest.fixture
def two_stores(tmp_path: Path, clock: FakeClock) -> Iterator[tuple[SqlStore, SqlStore]]:
    a = file_store(tmp_path / "state.db", clock)
    b = file_store(tmp_path / "state.db", clock)  # a second engine, its own connections
    yield a, b
    a.close()
    b.close()


def test_race_to_create_the_lease_has_exactly_one_winner(two_stores: tuple[SqlStore, SqlStore]) -> None:
    a, b = two_stores
    for i in range(25):
        name = f"race-{i}"
        out = race({"ctl-a": lambda n=name: a.lease.acquire("ctl-a", TTL, name=n),
                    "ctl-b": lambda n=name: b.lease.acquire("ctl-b", TTL, name=n)})
        winners = [tag for tag, r in out.items() if isinstance(r, LeaseRecord)]
        assert len(winners) == 1, out
        assert all(r is None for tag, r in out.items() if tag not in winners), out
        lease = a.lease.get(name)
        assert lease is not None and lease.holder == winners[0] and lease.epoch == 1


def test_race_to_take_over_an_expired_lease_has_exactly_one_winner(two_stores: tuple[SqlStore, SqlStore],
                                                                  clock: FakeClock) -> None:
    a, b = two_stores
    for i in range(25):
        name = f"takeover-{i}"
        old = a.lease.acquire("ctl-old", TTL, name=name)
        assert old is not None
        clock.advance(TTL.total_seconds())
        out = race({"ctl-a": lambda n=name: a.lease.acquire("ctl-a", TTL, name=n),
                    "ctl-b": lambda n=name: b.lease.acquire("ctl-b", TTL, name=n)})
        winners = [r for r in out.values() if isinstance(r, LeaseRecord)]
        assert len(winners) == 1, out
        assert winners[0].epoch == old.epoch + 1
        assert a.lease.renew(old.token(), TTL) is None


def test_race_on_the_same_idempotency_key_journals_once(two_stores: tuple[SqlStore, SqlStore]) -> None:
    a, b = two_stores
    for i in range(25):
        key = f"grow:42:{i}:1"
        out = race({s: lambda st=st, k=key: st.journal.record_intent(job_id=42, kind=ActionKind.GROW,
                                                                     idempotency_key=k)
                    for s, st in (("a", a), ("b", b))})
        ids = [r for r in out.values() if isinstance(r, int)]
        dups = [r for r in out.values() if isinstance(r, DuplicateIntentError)]
        assert len(ids) == 1 and len(dups) == 1, out
        assert dups[0].existing_id == ids[0]
    assert len(a.journal.list_actions()) == 25


def test_racing_policy_writers_get_distinct_versions(two_stores: tuple[SqlStore, SqlStore]) -> None:
    a, b = two_stores
    for i in range(10):
        race({"a": lambda i=i: a.policies.add_policy(f"a={i}", author="a"),
              "b": lambda i=i: b.policies.add_policy(f"b={i}", author="b")})
    versions = [p.version for p in a.policies.policy_history()]
    assert versions == list(range(20, 0, -1))
