"""The MIG workflow's agent port over the network: :class:`HttpAgent` calls the node agent's signed ``/v1/mig``
endpoints (:class:`~slurm_elastic.mig.ports.AgentPort`), :func:`load_agent_auth` reads the credentials
``[agents] auth`` names. Beside the agent client; the workflow's other adapters are in
:mod:`slurm_elastic.mig.adapters`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from slurm_elastic.agent.auth import ClientAuth
from slurm_elastic.agent.client import AgentClient, client_auth
from slurm_elastic.agent.errors import AgentClientError, AgentRequestError
from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.mig.config import AgentAccess
from slurm_elastic.mig.errors import WorkflowError
from slurm_elastic.mig.model import NodeLayout
from slurm_elastic.mig.wire import NodeMigReport


class HttpAgent:
    """:class:`~slurm_elastic.mig.ports.AgentPort` over the agents' signed HTTP endpoints."""

    def __init__(self, access: AgentAccess, key: bytes | ClientAuth,
                 address_of: Callable[[str], str | None] | None = None) -> None:
        self.access = access
        self._key = key
        self._address_of = address_of  # a node's NodeAddr, for a url_template with {address}

    def _url(self, node: str) -> str:
        address = self._address_of(node) if self._address_of is not None and self.access.needs_address else None
        return self.access.url_for(node, address)

    def report(self, node: str) -> NodeMigReport:
        async def go() -> NodeMigReport:
            async with AgentClient(self._key, timeout_s=self.access.timeout_s) as client:
                return await client.mig_report(self._url(node))

        try:
            return asyncio.run(go())
        except AgentClientError as exc:
            raise WorkflowError(f"agent of {node}: {exc}") from exc

    def apply(self, node: str, layout: NodeLayout) -> tuple[tuple[str, ...], NodeMigReport]:
        async def go() -> tuple[tuple[str, ...], NodeMigReport]:
            async with AgentClient(self._key, timeout_s=self.access.timeout_s) as client:
                answer = await client.mig_apply(self._url(node), layout,
                                                timeout_s=self.access.apply_timeout_s)
                return answer.changes, answer.report

        try:
            return asyncio.run(go())
        except AgentRequestError as exc:
            done = f" (changes made: {'; '.join(exc.changes)})" if exc.changes else ""
            raise WorkflowError(f"agent of {node} refused or failed the apply: {exc.error}: {exc.detail}{done}") \
                from exc
        except AgentClientError as exc:
            raise WorkflowError(f"agent of {node}: {exc}") from exc


def load_agent_auth(access: AgentAccess, source: str) -> ClientAuth:
    """The credentials ``[agents] auth`` names (the key file's key, or MUNGE)."""
    try:
        return client_auth(access.auth, key_file=access.key_file, munge_socket=access.munge_socket,
                           munge_agent_user=access.munge_agent_user, munge_ttl_s=access.munge_ttl_s, source=source)
    except SlurmElasticError as exc:
        raise WorkflowError(str(exc)) from exc
