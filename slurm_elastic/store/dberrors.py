"""Turn SQLAlchemy/driver exceptions into the store's typed errors, with a stable reason code.

SQLite errors are classified by ``sqlite_errorname`` (Python >= 3.11), MySQL/MariaDB by the server's error
number, PostgreSQL by SQLSTATE (untested here); the message text is the fallback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc

from slurm_elastic.store.errors import (
    SchemaError,
    StoreConflictError,
    StoreError,
    StoreInputError,
    StoreUnavailableError,
    UnavailableReason,
)

_SQLITE: dict[str, UnavailableReason] = {
    "SQLITE_BUSY": "locked",
    "SQLITE_LOCKED": "locked",
    "SQLITE_FULL": "disk_full",
    "SQLITE_IOERR": "io_error",
    "SQLITE_READONLY": "read_only",
    "SQLITE_CANTOPEN": "cannot_open",
    "SQLITE_PERM": "read_only",
    "SQLITE_NOLFS": "disk_full",
}

_MYSQL: dict[int, UnavailableReason] = {
    1205: "locked",  # lock wait timeout exceeded
    1213: "locked",  # deadlock found, transaction rolled back
    1114: "disk_full",  # the table is full
    1021: "disk_full",  # disk full, waiting for someone to free some space
    3: "io_error",  # error writing file
    1030: "io_error",  # got error from storage engine
    2002: "connection_lost",  # can't connect through socket
    2003: "connection_lost",  # can't connect to server
    2006: "connection_lost",  # server has gone away
    2013: "connection_lost",  # lost connection during query
    2055: "connection_lost",  # lost connection, system error
    1927: "connection_lost",  # connection was killed (MariaDB)
    1053: "connection_lost",  # server shutdown in progress
    1040: "unavailable",  # too many connections
    1044: "access_denied",
    1045: "access_denied",
    1142: "access_denied",  # command denied to user for table
    1290: "read_only",  # --read-only
    1792: "read_only",  # read-only transaction
}

_PG_PREFIX: dict[str, UnavailableReason] = {
    "40P01": "locked",  # deadlock
    "55P03": "locked",  # lock_not_available (lock_timeout)
    "53100": "disk_full",
    "58030": "io_error",
    "08": "connection_lost",  # connection exception class
    "57P": "connection_lost",  # admin/crash shutdown
    "28": "access_denied",
    "25006": "read_only",
}

_TEXT: list[tuple[str, UnavailableReason]] = [
    ("database is locked", "locked"),
    ("database table is locked", "locked"),
    ("database or disk is full", "disk_full"),
    ("no space left", "disk_full"),
    ("disk i/o error", "io_error"),
    ("readonly database", "read_only"),
    ("unable to open database", "cannot_open"),
    ("lost connection", "connection_lost"),
    ("gone away", "connection_lost"),
    ("connection refused", "connection_lost"),
    ("server closed the connection", "connection_lost"),
]

_HINT: dict[UnavailableReason, str] = {
    "locked": "another process holds the database lock (is a second controller or a manual sqlite3 session "
    "writing to it?)",
    "disk_full": "free space on the file system that holds the database",
    "io_error": "check the file system and the kernel log",
    "read_only": "make the database file and its directory writable by the controller",
    "cannot_open": "check that the directory exists and is writable",
}


def classify(error: BaseException) -> UnavailableReason | None:
    """The availability reason for a driver error, or None when the error is not about availability (a bad
    statement, a missing table...)."""
    if isinstance(error, sa_exc.TimeoutError):  # connection pool exhausted
        return "unavailable"
    if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
        return "connection_lost"
    orig = getattr(error, "orig", None) or error
    name = getattr(orig, "sqlite_errorname", None)
    if isinstance(name, str) and name:
        for prefix, reason in _SQLITE.items():
            if name == prefix or name.startswith(prefix + "_"):
                return reason
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in _MYSQL:
        return _MYSQL[args[0]]
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if isinstance(sqlstate, str):
        for prefix, reason in _PG_PREFIX.items():
            if sqlstate.startswith(prefix):
                return reason
    text = str(orig).lower()
    for needle, reason in _TEXT:
        if needle in text:
            return reason
    if isinstance(error, sa_exc.InterfaceError | sa_exc.DisconnectionError):
        return "connection_lost"
    return None


def _detail(error: BaseException, reason: UnavailableReason | None, busy_timeout_ms: int) -> str:
    orig = getattr(error, "orig", None) or error
    text = str(orig).strip() or type(orig).__name__
    if reason == "locked":
        text += f" (waited {busy_timeout_ms} ms)"
    hint = _HINT.get(reason) if reason else None
    return f"{text}; {hint}" if hint else text


@contextmanager
def translated(operation: str, url: str, busy_timeout_ms: int) -> Iterator[None]:
    """Run the block; re-raise database failures as typed store errors (our own StoreErrors pass through)."""
    try:
        yield
    except StoreError:
        raise
    except sa_exc.IntegrityError as e:
        raise StoreConflictError(f"{operation}: {_detail(e, None, busy_timeout_ms)}") from e
    except (sa_exc.DBAPIError, sa_exc.TimeoutError, sa_exc.DisconnectionError) as e:
        reason = classify(e)
        if reason is not None:
            raise StoreUnavailableError(reason, operation, url, _detail(e, reason, busy_timeout_ms)) from e
        text = _detail(e, None, busy_timeout_ms)
        if "no such table" in text.lower() or "doesn't exist" in text.lower() or "no such column" in text.lower():
            raise SchemaError(f"state DB {url}: {operation}: {text} (schema missing or damaged; "
                              "run `slurm-elastic db upgrade`)") from e
        raise StoreError(f"state DB {url}: {operation} failed: {text}") from e
    except sa_exc.StatementError as e:  # a bind value our column types refused (e.g. not JSON)
        raise StoreInputError(f"{operation}: {e.orig}") from e
    except sa_exc.SQLAlchemyError as e:
        raise StoreError(f"state DB {url}: {operation} failed: {e}") from e
