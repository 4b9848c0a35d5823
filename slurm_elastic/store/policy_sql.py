"""Versioned policy text. The store keeps TOML text as given: validating it is the policy module's job, and
callers validate BEFORE storing. A rollback is a new version carrying an old version's text, so history only
grows and "who changed what when" stays answerable."""

from __future__ import annotations

from sqlalchemy import func, select

from slurm_elastic.store.database import Database
from slurm_elastic.store.errors import PolicyVersionNotFoundError, StoreConflictError, StoreInputError
from slurm_elastic.store.models import PolicyVersionColumns
from slurm_elastic.store.records import PolicyVersionRecord

RETRIES = 5  # racing writers compute the same next version; the primary key lets one through, others retry


def policy_record(row: PolicyVersionColumns) -> PolicyVersionRecord:
    return PolicyVersionRecord(version=row.version, toml_text=row.toml_text, author=row.author,
                               created_at=row.created_at, comment=row.comment, rollback_of=row.rollback_of)


class SqlPolicies:
    def __init__(self, db: Database) -> None:
        self._db = db

    def add_policy(self, toml_text: str, *, author: str, comment: str = "",
                   rollback_of: int | None = None) -> PolicyVersionRecord:
        """Store a new version (the previous maximum + 1)."""
        if not author or len(author) > 255:
            raise StoreInputError(f"policy author must be 1..255 characters, got {author!r}")
        P = self._db.models.policy_version
        for attempt in range(RETRIES):
            now = self._db.now()
            try:
                with self._db.write("store policy version") as s:
                    latest = s.execute(select(func.max(P.version))).scalar()
                    row = P(version=int(latest or 0) + 1, toml_text=toml_text, author=author, created_at=now,
                            comment=comment, rollback_of=rollback_of)
                    s.add(row)
                    s.flush()
                    return policy_record(row)
            except StoreConflictError:
                if attempt == RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def rollback_policy(self, version: int, *, author: str, comment: str | None = None) -> PolicyVersionRecord:
        old = self.get_policy(version)
        return self.add_policy(old.toml_text, author=author, comment=comment or f"rollback to version {version}",
                               rollback_of=version)

    def current_policy(self) -> PolicyVersionRecord | None:
        P = self._db.models.policy_version
        with self._db.read("read current policy") as s:
            row = s.execute(select(P).order_by(P.version.desc()).limit(1)).scalar_one_or_none()
            return None if row is None else policy_record(row)

    def get_policy(self, version: int) -> PolicyVersionRecord:
        with self._db.read("read policy version") as s:
            row = s.get(self._db.models.policy_version, version)
            if row is None:
                raise PolicyVersionNotFoundError(f"no policy version {version}")
            return policy_record(row)

    def policy_history(self, limit: int | None = None) -> list[PolicyVersionRecord]:
        """Newest first."""
        P = self._db.models.policy_version
        stmt = select(P).order_by(P.version.desc())
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._db.read("list policy versions") as s:
            return [policy_record(r) for r in s.execute(stmt).scalars()]
