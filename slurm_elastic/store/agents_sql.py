"""Node agents as the controller last saw them: for `slurm-elastic agents` and staleness in `status`."""

from __future__ import annotations

from sqlalchemy import select

from slurm_elastic.store.database import Database
from slurm_elastic.store.errors import StoreInputError
from slurm_elastic.store.models import AgentColumns
from slurm_elastic.store.records import AgentRecord

MAX_ERROR = 4000
#: The note an agent carries (in last_error) while Slurm's power saving has its node off or booting: it was not
#: asked, so it is neither stale nor unreachable (``agents``, ``status``); the next successful scrape clears it.
POWERED_DOWN = "node powered down by Slurm"


def is_powered_down(error: str | None) -> bool:
    return bool(error) and str(error).startswith(POWERED_DOWN)


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
        if not node or len(node) > 255:
            raise StoreInputError(f"agent node name must be 1..255 characters, got {node!r}")
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

    def list_agents(self) -> list[AgentRecord]:
        A = self._db.models.agent
        with self._db.read("list agents") as s:
            return [agent_record(r) for r in s.execute(select(A).order_by(A.node)).scalars()]
