"""DB trouble, for real: a locked SQLite file, a full file system, a killed writer, an unreachable server.

The contract under test is the controller's: it acts only after ``record_intent`` returned, so an intent that
was not durably committed must raise (typed, clear) and leave no row behind; and the store recovers by itself
when the lock is released or space comes back.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import event

from slurm_elastic.controller.config import ControllerConfig
from slurm_elastic.store import (
    ActionKind,
    ActionState,
    NewDecision,
    SqlStore,
    StoreError,
    StoreUnavailableError,
    StoreUrlError,
    sqlite_url,
)
from slurm_elastic.store.dberrors import classify
from slurm_elastic.store.engine import MYSQL_SOCKET_TIMEOUT_S
from tests.unit.storehelpers import FakeClock, file_store

REPO = Path(__file__).resolve().parents[2]


class Controller:
    """The controller's journal-before-acting contract, reduced to its essence."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.acted: list[str] = []
        self.errors: list[StoreError] = []

    def act(self, key: str, pad: int = 0) -> bool:
        """As the actuator: intent, then in progress, then Slurm; a store error on either step stops it."""
        try:
            aid = self.store.journal.record_intent(job_id=1, kind=ActionKind.GROW, idempotency_key=key,
                                                   params={"pad": "x" * pad})
            self.store.journal.mark_in_progress(aid)
        except StoreError as e:
            self.errors.append(e)
            return False  # not journaled as in progress: never call Slurm
        self.acted.append(key)
        return True


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[SqlStore]:
    st = file_store(tmp_path / "state.db", clock, busy_timeout_ms=50)
    yield st
    st.close()


def test_sqlite_pragmas_for_durability(store: SqlStore) -> None:
    with store.db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL: fsync on every commit
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 50


# --- locked -----------------------------------------------------------------------------------------------------
@contextmanager
def exclusive_lock(path: Path) -> Iterator[sqlite3.Connection]:
    """Another process's view: a connection holding an exclusive write transaction."""
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("BEGIN EXCLUSIVE")
    try:
        yield raw
    finally:
        raw.execute("ROLLBACK")
        raw.close()


def test_locked_database_gives_a_typed_error_and_no_action(store: SqlStore, tmp_path: Path) -> None:
    ctl = Controller(store)
    assert ctl.act("grow:1:1:1")
    with exclusive_lock(tmp_path / "state.db"):
        assert not ctl.act("grow:1:2:1")
        err = ctl.errors[-1]
        assert isinstance(err, StoreUnavailableError) and err.reason == "locked"
        assert "database is locked (waited 50 ms)" in str(err) and "record intent" in str(err)
        with pytest.raises(StoreUnavailableError, match=r"\(locked\)"):
            store.decisions.record_decisions(1, [NewDecision(1, "hold", "OK", "m")])
        with pytest.raises(StoreUnavailableError, match=r"\(locked\)"):
            store.lease.acquire("ctl-a", timedelta(seconds=30))
        # WAL: readers are not blocked by the writer, so status/decisions keep working
        assert [a.idempotency_key for a in store.journal.dangling()] == ["grow:1:1:1"]
    assert ctl.acted == ["grow:1:1:1"]
    assert store.journal.find_by_idempotency_key("grow:1:2:1") is None  # nothing half-written
    assert ctl.act("grow:1:2:1")  # recovers once the lock is gone
    assert store.decisions.list_decisions() == []


# --- full disk ------------------------------------------------------------------------------------------------
def fill_until_refused(ctl: Controller, limit: int = 5000) -> int:
    """Journal intents with ~3 KiB of parameters until the store refuses one; how many were accepted."""
    for i in range(limit):
        if not ctl.act(f"grow:1:{i}:1", pad=3000):
            return i
    raise AssertionError(f"the store accepted {limit} intents: the file system never filled up")


def check_full_then_recover(ctl: Controller, store: SqlStore, accepted: int, free: Callable[[], None]) -> None:
    err = ctl.errors[-1]
    assert isinstance(err, StoreUnavailableError), err
    assert err.reason == "disk_full", err
    assert "database or disk is full" in str(err) and "free space" in str(err)
    refused = f"grow:1:{accepted}:1"
    assert ctl.acted == [f"grow:1:{i}:1" for i in range(accepted)]  # acted exactly on what was journaled
    for key in ctl.acted:  # every intent reported as journaled is there, in progress
        rec = store.journal.find_by_idempotency_key(key)
        assert rec is not None and rec.state is ActionState.IN_PROGRESS
    # The write that did not fit was the intent (nothing stored) or the step to in progress (an open intent,
    # never acted on, that reconcile closes): either way nothing reached Slurm.
    half = store.journal.find_by_idempotency_key(refused)
    assert half is None or half.state is ActionState.INTENT, half
    free()
    retry = refused if half is None else f"grow:1:{accepted}:retry"
    assert ctl.act(retry, pad=3000), ctl.errors[-1]
    assert ctl.act("grow:1:after:1", pad=3000)


def test_full_database_simulated_with_max_page_count(store: SqlStore) -> None:
    """Portable variant (no root needed): SQLite's max_page_count makes it answer SQLITE_FULL, the same code
    path as a full file system. The real thing is the next test."""
    limit = {"pages": 0}

    @event.listens_for(store.db.engine, "checkout")
    def _cap(dbapi_conn: sqlite3.Connection, _rec: object, _proxy: object) -> None:
        dbapi_conn.execute(f"PRAGMA max_page_count = {limit['pages'] or 2147483646}")

    with store.db.engine.connect() as conn:
        limit["pages"] = int(conn.exec_driver_sql("PRAGMA page_count").scalar() or 0) + 8
    ctl = Controller(store)
    accepted = fill_until_refused(ctl)
    assert accepted > 0

    def free() -> None:
        limit["pages"] = 0

    check_full_then_recover(ctl, store, accepted, free)


def can_mount_tmpfs(where: Path) -> str | None:
    if os.geteuid() != 0:
        return "needs root to mount a size-limited tmpfs"
    cp = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True,
                        text=True, timeout=30, check=False)
    return None if cp.returncode == 0 else f"mount -t tmpfs refused here: {cp.stderr.strip()}"


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "tinyfs"
    where.mkdir()
    why = can_mount_tmpfs(where)
    if why:
        pytest.fail(f"cannot run the full-disk test: {why} (scripts/test runs as root, where it works)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30, check=False)


def test_full_file_system_for_real(tiny_fs: Path, clock: FakeClock) -> None:
    """A 1 MiB tmpfs: the database fills it, the intent that does not fit is refused with disk_full, nothing is
    acted on without its intent, and it all works again once space is freed."""
    ballast = tiny_fs / "ballast"
    ballast.write_bytes(b"\0" * 256 * 1024)  # freed later to "make space"
    st = file_store(tiny_fs / "state.db", clock, busy_timeout_ms=50)
    try:
        ctl = Controller(st)
        accepted = fill_until_refused(ctl)
        assert accepted > 0
        check_full_then_recover(ctl, st, accepted, ballast.unlink)
    finally:
        st.close()


# --- a writer killed right after record_intent returned -------------------------------------------------------
def test_intent_survives_sigkill_of_the_writer(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    code = textwrap.dedent(f"""
        import os, signal
        from slurm_elastic.store import ActionKind, SqlStore
        st = SqlStore.open({sqlite_url(db)!r})
        aid = st.journal.record_intent(job_id=5, kind=ActionKind.GROW, idempotency_key="grow:5:1:1")
        st.journal.mark_in_progress(aid)
        print(aid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # crash between "Slurm called" and the outcome
    """)
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                        check=False)
    assert cp.returncode == -signal.SIGKILL, cp.stderr
    aid = int(cp.stdout.strip())
    st = SqlStore.open(sqlite_url(db))  # the real clock, as the child used
    try:
        dangling = st.journal.dangling()
        assert [(a.id, a.state, a.idempotency_key) for a in dangling] == [
            (aid, ActionState.IN_PROGRESS, "grow:5:1:1")]
    finally:
        st.close()


# --- URLs and servers -------------------------------------------------------------------------------------------
def test_unreachable_server_is_connection_lost_and_hides_the_password() -> None:
    pytest.importorskip("pymysql")
    secret = uuid.uuid4().hex
    with pytest.raises(StoreUnavailableError) as err:
        SqlStore.open(f"mysql+pymysql://slurm:{secret}@127.0.0.1:1/slurm_elastic", busy_timeout_ms=1000)
    assert err.value.reason == "connection_lost"
    assert secret not in str(err.value) and "***" in str(err.value)


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port whose server accepts connections and never says a word: a MySQL server behind a silent network cut
    (the kernel completes the TCP handshake from the listen backlog; nothing is ever read or sent)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    try:
        yield srv.getsockname()[1]
    finally:
        srv.close()


def _bounded(call: Callable[[], object], guard_s: float) -> BaseException | None:
    """Run ``call`` in a thread; the exception it raised, or fail the test if it is still blocked after
    ``guard_s`` (a hang, not a slow answer: the call's own timeout is far below the guard)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(guard_s)
    if t.is_alive():
        pytest.fail(f"the call still hangs after {guard_s}s on a server that never answers")
    return outcome[0]


def test_a_silent_server_fails_the_call_after_the_timeout_instead_of_hanging(silent_server: int) -> None:
    pytest.importorskip("pymysql")
    url = f"mysql+pymysql://slurm:x@127.0.0.1:{silent_server}/slurm_elastic"
    # The store's open (connect + schema check) waits for the server's greeting: timeout_s bounds that read.
    err = _bounded(lambda: SqlStore.open(url, timeout_s=0.5), guard_s=30)
    assert isinstance(err, StoreUnavailableError) and err.reason == "connection_lost", err
    # The controller's timeout follows its lease TTL (at most the 60 s default).
    assert ControllerConfig(lease_ttl_s=10).db_timeout_s == 10
    assert ControllerConfig().db_timeout_s == MYSQL_SOCKET_TIMEOUT_S
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(StoreUrlError, match="timeout"):
            SqlStore.open(url, timeout_s=bad)


def test_missing_directory_cannot_open(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailableError) as err:
        SqlStore.open(sqlite_url(tmp_path / "nope" / "state.db"))
    assert err.value.reason == "cannot_open" and "directory exists" in str(err.value)


@pytest.mark.parametrize("url", ["not a url", "nosuchdialect://x/y"])
def test_bad_urls_are_config_errors(url: str) -> None:
    with pytest.raises(StoreUrlError):
        SqlStore.open(url)


class _Err(Exception):
    def __init__(self, *args: object, sqlstate: str | None = None) -> None:
        super().__init__(*args)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (_Err(1205, "Lock wait timeout exceeded"), "locked"),
        (_Err(1213, "Deadlock found"), "locked"),
        (_Err(1114, "The table 'x' is full"), "disk_full"),
        (_Err(2013, "Lost connection to MySQL server during query"), "connection_lost"),
        (_Err(1045, "Access denied"), "access_denied"),
        (_Err("could not obtain lock", sqlstate="55P03"), "locked"),
        (_Err("could not extend file: No space left on device", sqlstate="53100"), "disk_full"),
        (_Err("terminating connection", sqlstate="57P01"), "connection_lost"),
        (_Err(1064, "You have an error in your SQL syntax"), None),
    ],
)
def test_classification_of_server_errors(error: Exception, reason: str | None) -> None:
    assert classify(error) == reason
