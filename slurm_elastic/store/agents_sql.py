"""Node agents as the controller last saw them: for `slurm-elastic agents` and staleness in `status`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table, bindparam, insert, select, update

from slurm_elastic.store.database import Database
from slurm_elastic.store.errors import StoreInputError
from slurm_elastic.store.models import AgentColumns
from slurm_elastic.store.records import AgentRecord, AgentScrape

MAX_ERROR = 4000
#: The note an agent carries (in last_error) while Slurm's power saving has its node off or booting: it was not
#: asked, so it is neither stale nor unreachable (``agents``, ``status``); the next successful scrape clears it.
POWERED_DOWN = "node powered down by Slurm"


def is_powered_down(error: str | None) -> bool:
    return bool(error) and str(error).startswith(POWERED_DOWN)


_CHUNK = 500  # node names per IN (...) read


def _check_node(node: str) -> None:
    if not node or len(node) > 255:
        raise StoreInputError(f"agent node name must be 1..255 characters, got {node!r}")


def agent_record(row: AgentColumns) -> AgentRecord:
    return AgentRecord(node=row.node, url=row.url, last_seen=row.last_seen, last_attempt=row.last_attempt,
                       version=row.version, gpu_count=row.gpu_count, last_error=row.last_error,
                       last_error_at=row.last_error_at)


class SqlAgents:
    def __init__(self, db: Database) -> None:
        self._db = db

    def agent_seen(self, node: str, *, url: str, version: str | None, gpu_count: int | None) -> AgentRecord:
        """A successful scrape: clears the last error."""
        return self._upsert(node, url, "record agent scrape", ok=True, version=version, gpu_count=gpu_count)

    def agent_failed(self, node: str, *, url: str, error: str) -> AgentRecord:
        """A failed scrape: keeps last_seen (so staleness grows) and records why."""
        return self._upsert(node, url, "record agent error", ok=False, error=error)

    def agent_powered_down(self, node: str, *, url: str, state: str) -> AgentRecord:
        """Slurm's power saving switched the node off (or is booting it): the agent was not asked."""
        return self._upsert(node, url, "record agent powered down", ok=False, error=f"{POWERED_DOWN} ({state})")

    def _upsert(self, node: str, url: str, op: str, *, ok: bool, version: str | None = None,
                gpu_count: int | None = None, error: str = "") -> AgentRecord:
        _check_node(node)
        now = self._db.now()
        A = self._db.models.agent
        with self._db.write(op) as s:
            row = s.get(A, node, with_for_update=True)
            if row is None:
                row = A(node=node, url=url, last_seen=None, last_attempt=None, version=None, gpu_count=None,
                        last_error=None, last_error_at=None)
                s.add(row)
            row.url = url
            row.last_attempt = now
            if ok:
                row.last_seen, row.version, row.gpu_count, row.last_error = now, version, gpu_count, None
            else:
                row.last_error, row.last_error_at = error[:MAX_ERROR], now
            s.flush()
            return agent_record(row)

    def record_scrapes(self, scrapes: Sequence[AgentScrape]) -> None:
        """A cycle's scrapes in ONE transaction (a cycle scrapes every node: one transaction each was 10,000 at
        10,000 nodes); each as :meth:`agent_seen` or :meth:`agent_failed` would record it, in order."""
        for sc in scrapes:
            _check_node(sc.node)
        if not scrapes:
            return
        now = self._db.now()
        table: Table = self._db.models.agent.__table__  # type: ignore[attr-defined]
        with self._db.write("record agent scrapes") as s:
            names = sorted({sc.node for sc in scrapes})
            stored: dict[str, dict[str, Any]] = {}
            for i in range(0, len(names), _CHUNK):
                for found in s.execute(select(table).where(table.c.node.in_(names[i:i + _CHUNK]))).mappings():
                    stored[found["node"]] = dict(found)
            new: dict[str, dict[str, Any]] = {}
            for sc in scrapes:
                row = stored.get(sc.node) or new.setdefault(sc.node, dict(
                    node=sc.node, last_seen=None, version=None, gpu_count=None, last_error=None, last_error_at=None))
                row.update(url=sc.url, last_attempt=now)
                if sc.error is None:
                    row.update(last_seen=now, version=sc.version, gpu_count=sc.gpu_count, last_error=None)
                else:
                    row.update(last_error=sc.error[:MAX_ERROR], last_error_at=now)
            if new:
                s.execute(insert(table), list(new.values()))
            if stored:
                rows = [{**{k: v for k, v in row.items() if k != "node"}, "row_node": node}
                        for node, row in stored.items()]
                s.execute(update(table).where(table.c.node == bindparam("row_node")), rows)

    def list_agents(self) -> list[AgentRecord]:
        A = self._db.models.agent
        with self._db.read("list agents") as s:
            return [agent_record(r) for r in s.execute(select(A).order_by(A.node)).scalars()]
