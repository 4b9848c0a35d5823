"""Messages for a state DB the caller may not open, worded for who is asking.

The state DB is private to the controller (its SQLite file is 0600, in a directory of the controller's user):
ordinary users read through the controller's socket, which shows each user their own jobs. So when a user who
is neither root nor the file's owner tries ``--url`` (or ``SLURM_ELASTIC_DB_URL``), the store's own hint ("make
the directory writable") is wrong for them: they are told that the DB is not theirs to open and to ask the
controller instead. Root and the controller's user keep the store's hint: the fix is theirs.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.store.errors import StoreUnavailableError

PERMISSION_REASONS = frozenset({"cannot_open", "read_only", "access_denied"})
USE_THE_SOCKET = ("leave out --url (and unset SLURM_ELASTIC_DB_URL) to ask the controller through its socket, "
                  "which shows you your own jobs")


@dataclass(frozen=True)
class Blocked:
    """The first path on the way to the DB file that the caller may not use, and why."""

    path: Path
    need: str  # "search" (a directory), "read" or "write"
    mode: int | None  # None: cannot even stat it
    owner: str | None


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def sqlite_path(url: str) -> Path | None:
    try:
        db = make_url(url)
    except ArgumentError:
        return None
    if db.get_backend_name() != "sqlite" or not db.database or db.database == ":memory:":
        return None
    return Path(db.database)


def blocked_on(path: Path, *, write: bool) -> Blocked | None:
    """The first directory the caller cannot search, or the file it cannot read (or write, for ``write``);
    None when nothing in the way is a permission problem for this caller."""
    for directory in reversed(path.parents):
        if directory.exists() and not os.access(directory, os.X_OK):
            return _blocked(directory, "search")
    if not path.exists():
        return None
    if not os.access(path, os.R_OK):
        return _blocked(path, "read")
    if write and not os.access(path, os.W_OK):
        return _blocked(path, "write")
    return None


def _blocked(path: Path, need: str) -> Blocked:
    try:
        st = path.stat()
    except OSError:
        return Blocked(path, need, None, None)
    return Blocked(path, need, stat.S_IMODE(st.st_mode), _owner(st.st_uid))


def denied_message(user: str, uid: int, db: Path, blocked: Blocked) -> str | None:
    """The message for ``user`` who may not use ``blocked`` on the way to the state DB ``db``; None for root and
    for the owner of the blocking path (their fix is the permissions: the store's own hint says so)."""
    if uid == 0 or blocked.owner == user:
        return None
    what = "directory" if blocked.need == "search" else "file"
    mode = "" if blocked.mode is None else f"mode {blocked.mode:04o}, "
    owner = f"owned by {blocked.owner}" if blocked.owner else "not yours"
    return (f"{user} may not open the state DB {db}: the {what} {blocked.path} ({mode}{owner}) is private to the "
            f"controller, and that is as it should be; {USE_THE_SOCKET}")


def explain_denied(url: str, error: SlurmElasticError, uid: int | None = None) -> str | None:
    """A message for a caller refused by the state DB because of who they are, or None (keep the error's)."""
    if not isinstance(error, StoreUnavailableError) or error.reason not in PERMISSION_REASONS:
        return None
    uid = os.getuid() if uid is None else uid
    if uid == 0:
        return None
    user = _owner(uid)
    path = sqlite_path(url)
    if path is None:  # a database server: its grants decide
        if error.reason != "access_denied":
            return None
        return f"the database server refused {user} ({error.detail}); {USE_THE_SOCKET}"
    blocked = blocked_on(path, write=error.reason == "read_only")
    return None if blocked is None else denied_message(user, uid, path, blocked)
