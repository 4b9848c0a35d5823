"""The controller lease: with a shared database, only the holder acts.

Every change is ONE conditional statement, so the database decides who wins a race:

* acquire: ``UPDATE lease SET ... WHERE name=:n AND (holder IS NULL OR holder=:me OR expires_at <= :now)``;
  if no row matched and the lease row does not exist yet, ``INSERT`` it: the primary key lets exactly one of
  several racing inserts through. The epoch (fencing token) grows by one whenever the lease is taken by a new
  holder, re-taken after it expired, or taken after a release; a holder that acquires while still holding keeps
  its epoch.
* renew: ``UPDATE ... WHERE name AND holder=:me AND epoch=:epoch AND expires_at > :now``: a lease that already
  expired cannot be renewed (someone else may have it now); acquire again and get a new epoch.
* release: ``UPDATE ... SET holder=NULL WHERE name AND holder=:me AND epoch=:epoch``.
* take_over: ``UPDATE ... WHERE name AND epoch=:seen_epoch AND renewed_at=:seen_heartbeat``: the caller saw the
  holder dead (its process is gone, or its heartbeat is stale; controller/lease.py decides which) and takes the
  lease before its TTL, with a new epoch, unless the holder renewed or someone else took it since.

The holder also records its process (:class:`HolderProcess`) and its heartbeat bound (``stale_after``). "Me" is
the holder name AND that process: a second process under the same configured name is another holder (new
epoch), so the first one, if alive, can journal nothing more.

Writes that must only happen under the lease (journal intents) pass a :class:`FencingToken`;
:func:`check_fencing` verifies it inside the same transaction, with the lease row locked, so a controller that
was paused past its lease (GC, SIGSTOP, network partition) cannot journal after its successor took over.

Times come from the controllers' clocks: keep the hosts NTP-synchronized and the TTL well above any skew.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, case, or_, select, update
from sqlalchemy.orm import Session

from slurm_elastic.store.database import Database
from slurm_elastic.store.errors import LeaseLostError, StoreConflictError, StoreInputError
from slurm_elastic.store.models import LeaseColumns, Models
from slurm_elastic.store.records import FencingToken, HolderProcess, LeaseRecord

DEFAULT_LEASE = "controller"


def _record(row: LeaseColumns) -> LeaseRecord:
    process = None
    if row.holder is not None and row.holder_host is not None and row.holder_pid is not None:
        process = HolderProcess(host=row.holder_host, pid=row.holder_pid, scope=row.holder_scope,
                                start=row.holder_start)
    stale = None if row.stale_after_s is None else timedelta(seconds=row.stale_after_s)
    return LeaseRecord(name=row.name, holder=row.holder, epoch=row.epoch, acquired_at=row.acquired_at,
                       renewed_at=row.renewed_at, expires_at=row.expires_at, process=process, stale_after=stale)


def _holder_values(process: HolderProcess | None, stale_after: timedelta | None) -> dict[str, object]:
    return {"holder_host": process.host if process else None, "holder_pid": process.pid if process else None,
            "holder_scope": process.scope if process else None, "holder_start": process.start if process else None,
            "stale_after_s": None if stale_after is None else stale_after.total_seconds()}


def _same_process(L: type[LeaseColumns], process: HolderProcess | None) -> ColumnElement[bool]:
    """The row's holder process is ``process`` (NULL-safe: a holder that recorded none matches None)."""
    v = _holder_values(process, None)
    return and_(*(getattr(L, k).is_not_distinct_from(v[k])
                  for k in ("holder_host", "holder_pid", "holder_scope", "holder_start")))


def _check_stale_after(stale_after: timedelta | None, ttl: timedelta) -> None:
    if stale_after is not None and not timedelta(0) < stale_after:
        raise StoreInputError(f"lease heartbeat bound must be positive, got {stale_after}")


def _check_args(name: str, holder: str, ttl: timedelta | None = None) -> None:
    if not name or len(name) > 64:
        raise StoreInputError(f"lease name must be 1..64 characters, got {name!r}")
    if not holder or len(holder) > 255:
        raise StoreInputError(f"lease holder must be 1..255 characters, got {holder!r}")
    if ttl is not None and ttl <= timedelta(0):
        raise StoreInputError(f"lease TTL must be positive, got {ttl}")


def check_fencing(session: Session, models: Models, token: FencingToken, now: datetime) -> None:
    """Raise LeaseLostError unless ``token`` is the lease's current, unexpired holder and epoch. Locks the lease
    row (SELECT ... FOR UPDATE; SQLite's write transaction already excludes other writers) until commit."""
    L = models.lease
    row = session.execute(select(L).where(L.name == token.lease).with_for_update()).scalar_one_or_none()
    if row is None:
        raise LeaseLostError(f"lease {token.lease!r} does not exist: {token.holder} never acquired it")
    if row.holder != token.holder or row.epoch != token.epoch:
        raise LeaseLostError(f"lease {token.lease!r} is now held by {row.holder or 'nobody'} at epoch {row.epoch}; "
                             f"{token.holder} held epoch {token.epoch}")
    if row.expires_at <= now:
        raise LeaseLostError(f"lease {token.lease!r} of {token.holder} (epoch {token.epoch}) expired at "
                             f"{row.expires_at.isoformat()}")


class SqlLease:
    def __init__(self, db: Database) -> None:
        self._db = db

    def acquire(self, holder: str, ttl: timedelta, name: str = DEFAULT_LEASE, *,
                process: HolderProcess | None = None, stale_after: timedelta | None = None) -> LeaseRecord | None:
        """Take or keep the lease; None when another holder (another name, or another process under this name)
        has it and it has not expired. ``process`` and ``stale_after`` are recorded for successors and status."""
        _check_args(name, holder, ttl)
        _check_stale_after(stale_after, ttl)
        now = self._db.now()
        L = self._db.models.lease
        mine = and_(L.holder == holder, _same_process(L, process))
        mine_and_live = and_(mine, L.expires_at > now)
        # MySQL evaluates SET assignments left to right against the already-updated row: compute epoch and
        # acquired_at from the OLD holder/expiry first, then overwrite holder and expires_at.
        stmt = (
            update(L)
            .where(L.name == name, or_(L.holder.is_(None), mine, L.expires_at <= now))
            .ordered_values(
                (L.epoch, case((mine_and_live, L.epoch), else_=L.epoch + 1)),
                (L.acquired_at, case((mine_and_live, L.acquired_at), else_=now)),
                (L.renewed_at, now),
                (L.holder, holder),
                (L.expires_at, now + ttl),
                *((getattr(L, k), v) for k, v in _holder_values(process, stale_after).items()),
            )
            .execution_options(synchronize_session=False)
        )
        try:
            with self._db.write("acquire lease") as s:
                if s.execute(stmt).rowcount == 1:  # type: ignore[attr-defined]
                    return _record(s.execute(select(L).where(L.name == name)).scalar_one())
                if s.execute(select(L.name).where(L.name == name)).first() is not None:
                    return None  # someone else holds it
                s.add(L(name=name, holder=holder, epoch=1, acquired_at=now, renewed_at=now, expires_at=now + ttl,
                        **_holder_values(process, stale_after)))
                s.flush()
                return _record(s.execute(select(L).where(L.name == name)).scalar_one())
        except StoreConflictError:
            return None  # lost the insert race: the other controller created the row first

    def take_over(self, holder: str, ttl: timedelta, seen: LeaseRecord, *, process: HolderProcess | None = None,
                  stale_after: timedelta | None = None) -> LeaseRecord | None:
        """Take a lease that has not expired from a holder the caller found dead (``seen``, as read by
        :meth:`get`), with a new epoch; None if the lease changed since ``seen`` (renewed, taken, released).
        Deciding that the holder is dead is the caller's part (see slurm_elastic/controller/lease.py)."""
        _check_args(seen.name, holder, ttl)
        _check_stale_after(stale_after, ttl)
        now = self._db.now()
        L = self._db.models.lease
        stmt = (
            update(L)
            .where(L.name == seen.name, L.epoch == seen.epoch, L.renewed_at == seen.renewed_at)
            .values(epoch=seen.epoch + 1, acquired_at=now, renewed_at=now, holder=holder, expires_at=now + ttl,
                    **_holder_values(process, stale_after))
            .execution_options(synchronize_session=False)
        )
        with self._db.write("take over lease") as s:
            if s.execute(stmt).rowcount != 1:  # type: ignore[attr-defined]
                return None
            return _record(s.execute(select(L).where(L.name == seen.name)).scalar_one())

    def renew(self, token: FencingToken, ttl: timedelta) -> LeaseRecord | None:
        """Extend a lease we still hold; None if it expired, was released or was taken over."""
        _check_args(token.lease, token.holder, ttl)
        now = self._db.now()
        L = self._db.models.lease
        stmt = (
            update(L)
            .where(L.name == token.lease, L.holder == token.holder, L.epoch == token.epoch, L.expires_at > now)
            .values(renewed_at=now, expires_at=now + ttl)
            .execution_options(synchronize_session=False)
        )
        with self._db.write("renew lease") as s:
            if s.execute(stmt).rowcount != 1:  # type: ignore[attr-defined]
                return None
            return _record(s.execute(select(L).where(L.name == token.lease)).scalar_one())

    def release(self, token: FencingToken) -> bool:
        """Give the lease up (on clean shutdown) so a standby takes over at once instead of after the TTL."""
        now = self._db.now()
        L = self._db.models.lease
        stmt = (
            update(L)
            .where(L.name == token.lease, L.holder == token.holder, L.epoch == token.epoch)
            .values(holder=None, expires_at=now, renewed_at=now, **_holder_values(None, None))
            .execution_options(synchronize_session=False)
        )
        with self._db.write("release lease") as s:
            return bool(s.execute(stmt).rowcount == 1)  # type: ignore[attr-defined]

    def get(self, name: str = DEFAULT_LEASE) -> LeaseRecord | None:
        L = self._db.models.lease
        with self._db.read("read lease") as s:
            row = s.execute(select(L).where(L.name == name)).scalar_one_or_none()
            return None if row is None else _record(row)

    def check(self, token: FencingToken) -> None:
        """LeaseLostError unless ``token`` is still current (a read; the journal re-checks under lock)."""
        now = self._db.now()
        with self._db.read("check lease") as s:
            check_fencing(s, self._db.models, token, now)
