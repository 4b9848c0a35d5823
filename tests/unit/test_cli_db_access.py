"""A user who may not open the state DB is told that it is the controller's and to ask the controller through its
socket, not to make a directory writable; root and the DB's owner keep the store's own hint (the fix is theirs).

The end-to-end case forks a child that becomes another user (needs root) and runs the real CLI against a 0600
state DB: the kernel's permission checks, SQLite's real error."""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_elastic.api.authz import Caller
from slurm_elastic.api.server import answer
from slurm_elastic.api.service import Service, ServiceSettings
from slurm_elastic.cli import main
from slurm_elastic.cli.db_access import Blocked, denied_message, explain_denied
from slurm_elastic.store import SqlStore, StoreUnavailableError, sqlite_url

DB = Path("/var/lib/slurm-elastic/state.db")


def test_another_user_is_told_to_use_the_socket() -> None:
    msg = denied_message("alice", 1001, DB, Blocked(DB, "read", 0o600, "root"))
    assert msg == ("alice may not open the state DB /var/lib/slurm-elastic/state.db: the file "
                   "/var/lib/slurm-elastic/state.db (mode 0600, owned by root) is private to the controller, and "
                   "that is as it should be; leave out --url (and unset SLURM_ELASTIC_DB_URL) to ask the "
                   "controller through its socket, which shows you your own jobs")
    assert "writable" not in msg
    d = denied_message("alice", 1001, DB, Blocked(DB.parent, "search", 0o700, "slurm"))
    assert d is not None and "the directory /var/lib/slurm-elastic (mode 0700, owned by slurm)" in d


def test_root_and_the_owner_keep_the_fix_the_permissions_hint() -> None:
    assert denied_message("root", 0, DB, Blocked(DB, "write", 0o400, "slurm")) is None
    assert denied_message("slurm", 64030, DB, Blocked(DB, "write", 0o400, "slurm")) is None


def test_errors_that_are_not_about_permission_are_left_alone() -> None:
    locked = StoreUnavailableError("locked", "read", sqlite_url(DB), "database is locked")
    assert explain_denied(sqlite_url(DB), locked, uid=1001) is None
    denied = StoreUnavailableError("access_denied", "connect", "mysql+pymysql://u@db/se", "Access denied for user")
    msg = explain_denied("mysql+pymysql://u@db/se", denied, uid=1001)
    assert msg is not None and "leave out --url" in msg


def _as_user(uid: int, gid: int, args: list[str]) -> tuple[int, str]:
    """Run the CLI in a forked child that dropped to ``uid``; its exit code and output."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            r = CliRunner().invoke(main, args)
            os.write(write_fd, f"{r.exit_code}\n{r.output}".encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        out = f.read()
    os.waitpid(pid, 0)
    code, _, text = out.partition("\n")
    return int(code), text


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root")
def test_an_ordinary_user_with_url_is_told_the_db_is_the_controllers(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    tmp_path.chmod(0o755)
    store = SqlStore.open(sqlite_url(tmp_path / "state.db"))
    store.close()
    (tmp_path / "state.db").chmod(0o600)  # as the controller leaves it (restrict_sqlite_file)
    url = sqlite_url(tmp_path / "state.db")
    assert CliRunner().invoke(main, ["jobs", "--url", url]).exit_code == 0  # root may; and imports are loaded
    code, out = _as_user(nobody.pw_uid, nobody.pw_gid, ["jobs", "--url", url])
    assert code == 1
    assert f"nobody may not open the state DB {tmp_path / 'state.db'}" in out and "owned by root" in out
    assert "leave out --url" in out and "writable" not in out


class _DbDown(Service):
    def handle(self, caller: Caller, op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        raise StoreUnavailableError("cannot_open", "list jobs", "sqlite:////var/lib/slurm-elastic/state.db",
                                    "unable to open database file; check that the directory exists and is writable")


def test_through_the_socket_a_user_is_not_told_to_fix_the_controllers_db(tmp_path: Path) -> None:
    store = SqlStore.open(sqlite_url(tmp_path / "s.db"))
    try:
        service = _DbDown(store, ServiceSettings())
        user = answer(service, Caller(1001, "alice"), b'{"op": "jobs"}')
        assert user == {"ok": False, "kind": "unavailable", "error": (
            "the controller cannot use its state DB right now (cannot_open, while trying to list jobs); nothing "
            "for alice to fix: it retries by itself, and its administrators find the details in its log")}
        admin = answer(service, Caller(0, "root"), b'{"op": "jobs"}')
        assert "check that the directory exists and is writable" in admin["error"]  # root's to fix
    finally:
        store.close()
