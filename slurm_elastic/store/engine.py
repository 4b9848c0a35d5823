"""Engine factory: any SQLAlchemy URL, with the settings the journal's durability and locking rely on.

SQLite (the default, one file on the controller's host):

* ``journal_mode=WAL``: readers (``slurm-elastic status``) never block the controller's writes, nor the reverse;
* ``synchronous=FULL``: every COMMIT is fsynced before it returns. With WAL, NORMAL would be faster but a power
  cut could lose the last commits, i.e. an intent the controller already acted on;
* ``foreign_keys=ON`` and ``busy_timeout`` (how long a writer waits for another writer's lock before
  :class:`~slurm_elastic.store.errors.StoreUnavailableError` ``locked``);
* the driver's own transaction handling is switched off and we emit ``BEGIN`` ourselves: ``BEGIN IMMEDIATE`` for
  write transactions, so the write lock is taken up front and a read-then-write (lease, journal transitions)
  can never fail half-way with SQLITE_BUSY on lock upgrade.

MariaDB/MySQL (``mysql+pymysql://...``): READ COMMITTED, ``innodb_lock_wait_timeout`` from the busy timeout,
``utf8mb4``, pre-ping (a dropped connection is replaced transparently), and ``timeout_s`` on every socket read and
write, the server's greeting included (pymysql's ``connect_timeout`` covers only the TCP connect), so a server
that went silent (a network partition: nothing refused, nothing answered) makes a call fail with
``connection_lost`` after ``timeout_s`` instead of hanging the controller. On MariaDB the session also gets
``idle_transaction_timeout = timeout_s``: a controller cut off in the middle of a transaction leaves its row
locks (the lease row's ``FOR UPDATE``) for at most that long, not until ``wait_timeout`` (8 hours by default),
so a standby can take the lease. PostgreSQL URLs get ``lock_timeout`` and pre-ping; they are not tested here.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from slurm_elastic.store.errors import StoreUrlError

log = logging.getLogger(__name__)

DEFAULT_DB_URL = "sqlite:////var/lib/slurm-elastic/state.db"
DEFAULT_BUSY_TIMEOUT_MS = 5000
BEGIN_OPTION = "slurm_elastic_begin"  # execution option read by the SQLite "begin" hook
MYSQL_SOCKET_TIMEOUT_S = 60.0  # default timeout_s: the longest a MySQL/MariaDB statement or connect may take


def parse_url(url: str | URL) -> URL:
    try:
        return make_url(url)
    except (ArgumentError, ValueError) as e:
        raise StoreUrlError(f"database URL {url!r} is not a valid SQLAlchemy URL: {e}") from e


def redacted(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def is_sqlite_memory(url: URL) -> bool:
    db = url.database or ""
    return url.get_backend_name() == "sqlite" and (db in ("", ":memory:") or "mode=memory" in str(url))


def make_engine(url: str | URL, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS, echo: bool = False,
                timeout_s: float = MYSQL_SOCKET_TIMEOUT_S) -> Engine:
    """An Engine for ``url`` with the per-backend settings above. Raises StoreUrlError for a bad URL or a
    missing driver (e.g. pymysql not installed). ``timeout_s`` bounds each network read/write of a server DB."""
    if busy_timeout_ms < 1:
        raise StoreUrlError(f"busy timeout must be >= 1 ms, got {busy_timeout_ms}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise StoreUrlError(f"database timeout must be a positive number of seconds, got {timeout_s}")
    u = parse_url(url)
    backend = u.get_backend_name()
    try:
        if backend == "sqlite":
            return _sqlite_engine(u, busy_timeout_ms, echo)
        if backend in ("mysql", "mariadb"):
            return _mysql_engine(u, busy_timeout_ms, echo, timeout_s)
        if backend == "postgresql":
            return _postgresql_engine(u, busy_timeout_ms, echo)
        return create_engine(u, echo=echo, pool_pre_ping=True)
    except (NoSuchModuleError, ModuleNotFoundError, ArgumentError) as e:
        raise StoreUrlError(f"cannot use database URL {redacted(u)}: {e}") from e


def _sqlite_engine(u: URL, busy_timeout_ms: int, echo: bool) -> Engine:
    memory = is_sqlite_memory(u)
    kwargs: dict[str, Any] = {
        "connect_args": {"timeout": busy_timeout_ms / 1000, "check_same_thread": False},
    }
    if memory:
        kwargs["poolclass"] = StaticPool  # one connection, or each checkout would see its own empty database
    engine = create_engine(u, echo=echo, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves, see _on_begin
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cur.execute("PRAGMA foreign_keys = ON")
            if not memory:
                mode = cur.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    log.warning("SQLite %s: journal_mode is %s, not WAL (file system without shared memory?)",
                                u.database, mode)
            cur.execute("PRAGMA synchronous = FULL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(BEGIN_OPTION, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {'IMMEDIATE' if mode == 'IMMEDIATE' else 'DEFERRED'}")

    return engine


def _mysql_engine(u: URL, busy_timeout_ms: int, echo: bool, timeout_s: float) -> Engine:
    if "charset" not in u.query:
        u = u.update_query_dict({"charset": "utf8mb4"})
    lock_wait_s = max(1, math.ceil(busy_timeout_ms / 1000))
    engine = create_engine(
        u,
        echo=echo,
        isolation_level="READ COMMITTED",
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args={"connect_timeout": min(10.0, timeout_s), "read_timeout": timeout_s,
                      "write_timeout": timeout_s},
    )
    idle_s = max(1, math.floor(timeout_s))  # not above timeout_s: the server gives up on a transaction first

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"SET SESSION innodb_lock_wait_timeout = {lock_wait_s}")
            if "mariadb" in str(dbapi_conn.get_server_info()).lower():  # MySQL has no such variable
                cur.execute(f"SET SESSION idle_transaction_timeout = {idle_s}")
        finally:
            cur.close()

    return engine


def _postgresql_engine(u: URL, busy_timeout_ms: int, echo: bool) -> Engine:
    return create_engine(u, echo=echo, pool_pre_ping=True,
                         connect_args={"options": f"-c lock_timeout={int(busy_timeout_ms)}"})
