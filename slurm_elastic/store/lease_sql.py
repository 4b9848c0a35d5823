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

Writes that must only happen under the lease (journal intents) pass a :class:`FencingToken`;
:func:`check_fencing` verifies it inside the same transaction, with the lease row locked, so a controller that
was paused past its lease (GC, SIGSTOP, network partition) cannot journal after its successor took over.

Times come from the controllers' clocks: keep the hosts NTP-synchronized and the TTL well above any skew.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import and_, case, or_, select, update
from sqlalchemy.orm import Session

from slurm_elastic.store.database import Database
from slurm_elastic.store.errors import LeaseLostError, StoreConflictError, StoreInputError
from slurm_elastic.store.models import LeaseColumns, Models
from slurm_elastic.store.records import FencingToken, LeaseRecord

DEFAULT_LEASE = "controller"


def _record(row: LeaseColumns) -> LeaseRecord:
    return LeaseRecord(name=row.name, holder=row.holder, epoch=row.epoch, acquired_at=row.acquired_at,
                       renewed_at=row.renewed_at, expires_at=row.expires_at)


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

    def acquire(self, holder: str, ttl: timedelta, name: str = DEFAULT_LEASE) -> LeaseRecord | None:
        """Take or keep the lease; None when another holder has it and it has not expired."""
        _check_args(name, holder, ttl)
        now = self._db.now()
        L = self._db.models.lease
        mine_and_live = and_(L.holder == holder, L.expires_at > now)
        # MySQL evaluates SET assignments left to right against the already-updated row: compute epoch and
        # acquired_at from the OLD holder/expiry first, then overwrite holder and expires_at.
        stmt = (
            update(L)
            .where(L.name == name, or_(L.holder.is_(None), L.holder == holder, L.expires_at <= now))
            .ordered_values(
                (L.epoch, case((mine_and_live, L.epoch), else_=L.epoch + 1)),
                (L.acquired_at, case((mine_and_live, L.acquired_at), else_=now)),
                (L.renewed_at, now),
                (L.holder, holder),
                (L.expires_at, now + ttl),
            )
            .execution_options(synchronize_session=False)
        )
        try:
            with self._db.write("acquire lease") as s:
                if s.execute(stmt).rowcount == 1:  # type: ignore[attr-defined]
                    return _record(s.execute(select(L).where(L.name == name)).scalar_one())
                if s.execute(select(L.name).where(L.name == name)).first() is not None:
                    return None  # someone else holds it
                s.add(L(name=name, holder=holder, epoch=1, acquired_at=now, renewed_at=now, expires_at=now + ttl))
                s.flush()
                return _record(s.execute(select(L).where(L.name == name)).scalar_one())
        except StoreConflictError:
            return None  # lost the insert race: the other controller created the row first

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
            .values(holder=None, expires_at=now, renewed_at=now)
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
