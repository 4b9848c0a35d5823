"""Typed errors of the state store, all under :class:`slurm_elastic.errors.SlurmElasticError`.

The rule the controller relies on: a store method that raises did not commit, so the caller must not act on it.
In particular :meth:`Journal.record_intent` returns an action id only after the intent is durably committed; on
any failure it raises, and no Slurm call may follow.
"""

from __future__ import annotations

from typing import Literal

from slurm_elastic.errors import ConfigError, SlurmElasticError

UnavailableReason = Literal[
    "locked",  # SQLite busy past busy_timeout, InnoDB lock wait timeout, deadlock
    "disk_full",  # SQLite "database or disk is full", MySQL "table is full", PostgreSQL disk_full
    "io_error",  # the file system failed a read, write or fsync
    "read_only",  # the database or its directory is not writable
    "cannot_open",  # the SQLite file or its directory cannot be opened
    "connection_lost",  # the server is unreachable or dropped the connection
    "access_denied",  # wrong user, password or grants
    "unavailable",  # anything else operational (too many connections, pool exhausted, ...)
]


class StoreError(SlurmElasticError):
    """Base of every error raised by :mod:`slurm_elastic.store`."""


class StoreUnavailableError(StoreError):
    """The database could not do what was asked; nothing was committed. Usually recovers by itself (a lock is
    released, space is freed, the server comes back), so the daemon logs it and retries on its next cycle.

    ``reason`` is a stable code (see :data:`UnavailableReason`), ``operation`` says what the store was doing
    (``record intent``), ``url`` is the database URL without its password, ``detail`` the driver's own message.
    """

    def __init__(self, reason: UnavailableReason, operation: str, url: str, detail: str) -> None:
        self.reason: UnavailableReason = reason
        self.operation = operation
        self.url = url
        self.detail = detail
        super().__init__(f"state DB {url} unavailable ({reason}) while trying to {operation}: {detail}")


class StoreInputError(StoreError):
    """A caller passed something the store cannot keep (naive datetime, non-JSON parameters, over-long key)."""


class StoreConflictError(StoreError):
    """A uniqueness constraint refused a write (another writer got there first). Nothing was committed."""


class DuplicateIntentError(StoreConflictError):
    """An action with this idempotency key is already journaled; ``existing_id`` is its id. The caller must
    look at that action (and at Slurm) instead of acting again."""

    def __init__(self, key: str, existing_id: int) -> None:
        self.key = key
        self.existing_id = existing_id
        super().__init__(f"an action with idempotency key {key!r} is already journaled (action {existing_id})")


class ActionNotFoundError(StoreError):
    """No journaled action has this id."""

    def __init__(self, action_id: int) -> None:
        self.action_id = action_id
        super().__init__(f"no journaled action with id {action_id}")


class IllegalTransitionError(StoreError):
    """A journal state change that the state machine forbids (e.g. applied -> failed). Nothing was changed."""

    def __init__(self, action_id: int, current: str, wanted: str, why: str = "") -> None:
        self.action_id = action_id
        self.current = current
        self.wanted = wanted
        tail = f": {why}" if why else ""
        super().__init__(f"action {action_id}: illegal transition {current} -> {wanted}{tail}")


class LeaseLostError(StoreError):
    """The caller's fencing token is no longer the lease's current one (expired, taken over or released), so
    the write it guarded was refused."""


class PolicyVersionNotFoundError(StoreError):
    """No stored policy has this version number."""


class SchemaError(StoreError):
    """The database schema does not match what this slurm-elastic expects."""


class SchemaTooNewError(SchemaError):
    """The database was upgraded by a newer slurm-elastic; this one refuses to touch it."""


class SchemaOutdatedError(SchemaError):
    """The database schema is older than this slurm-elastic; run ``slurm-elastic db upgrade``."""


class SchemaMissingError(SchemaError):
    """The database has no slurm-elastic schema and creating one was not allowed."""


class MigrationError(SchemaError):
    """A schema migration step is missing or failed; the schema version was left at the last good step."""


class StoreUrlError(ConfigError):
    """The database URL cannot be used (malformed, unknown driver, bad table prefix)."""
