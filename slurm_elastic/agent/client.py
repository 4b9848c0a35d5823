"""The controller's client for the node agents: signed ``GET /v1/node``, validated into a :class:`NodeReport`.

One ``_request`` turns every failure into a typed :class:`AgentClientError` (unreachable, timeout, 401 or
unsigned answer, other HTTP status, bad payload). :meth:`AgentClient.fetch_many` asks many agents at once and
never raises for one agent's failure: each result is a report or that agent's error.

    async with AgentClient(key, timeout_s=5) as client:
        results = await client.fetch_many({"n1": "http://n1:9817", "n2": "http://n2:9817"})
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from types import TracebackType

import aiohttp
from yarl import URL

from slurm_elastic.agent.auth import HEADER_NONCE, HEADER_SIGNATURE, sign_request, verify_response
from slurm_elastic.agent.errors import (
    AgentAuthError,
    AgentClientError,
    AgentHttpError,
    AgentPayloadError,
    AgentTimeoutError,
    AgentUnreachableError,
    PayloadError,
)
from slurm_elastic.agent.payload import NODE_PATH, NodeReport, parse_payload_bytes

MAX_RESPONSE_BYTES = 32 * 1024 * 1024


class AgentClient:
    def __init__(self, key: bytes, *, timeout_s: float = 5.0, concurrency: int = 64,
                 session: aiohttp.ClientSession | None = None, clock: Callable[[], float] = time.time) -> None:
        self._key = key
        self.timeout_s = timeout_s
        self._semaphore = asyncio.Semaphore(concurrency)
        self._session = session
        self._own_session = session is None
        self._clock = clock

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def _request(self, base_url: str, path: str) -> bytes:
        url = base_url.rstrip("/") + path
        # Sign the path the agent will see, prefix included (an agent behind a path-routing proxy).
        headers = sign_request(self._key, "GET", URL(url).raw_path_qs, b"", now=self._clock())
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with self._get_session().get(url, headers=headers, timeout=timeout,
                                               allow_redirects=False) as resp:
                body = await resp.content.read(MAX_RESPONSE_BYTES + 1)
                if len(body) > MAX_RESPONSE_BYTES:
                    raise AgentPayloadError(base_url, f"answer larger than {MAX_RESPONSE_BYTES} bytes")
                if resp.status == 401:
                    raise AgentAuthError(base_url, f"refused our credentials: {body[:200].decode(errors='replace')}")
                if resp.status != 200:
                    raise AgentHttpError(base_url, resp.status, body[:200].decode(errors="replace"))
                if not verify_response(self._key, headers[HEADER_NONCE], body, resp.headers.get(HEADER_SIGNATURE)):
                    raise AgentAuthError(base_url, "answer is not signed with the shared key")
                return body
        except AgentClientError:
            raise
        except TimeoutError:
            raise AgentTimeoutError(base_url, f"no answer within {self.timeout_s:g} s") from None
        except aiohttp.ClientConnectionError as exc:
            raise AgentUnreachableError(base_url, str(exc) or type(exc).__name__) from None
        except aiohttp.ClientError as exc:
            raise AgentHttpError(base_url, 0, f"{type(exc).__name__}: {exc}") from None

    async def fetch(self, base_url: str) -> NodeReport:
        """One agent's report. Raises a subclass of :class:`AgentClientError`."""
        async with self._semaphore:
            body = await self._request(base_url, NODE_PATH)
        try:
            return parse_payload_bytes(body)
        except PayloadError as exc:
            raise AgentPayloadError(base_url, f"invalid payload: {exc}") from None

    async def _fetch_safe(self, base_url: str) -> NodeReport | AgentClientError:
        try:
            return await self.fetch(base_url)
        except AgentClientError as exc:
            return exc
        except Exception as exc:  # never let one agent break the fan-out; the error names the agent
            return AgentClientError(base_url, f"unexpected {type(exc).__name__}: {exc}")

    async def fetch_many(self, agents: Mapping[str, str]) -> dict[str, NodeReport | AgentClientError]:
        """``{name: base_url}`` -> ``{name: report or error}``, fetched concurrently (bounded)."""
        names = list(agents)
        results = await asyncio.gather(*(self._fetch_safe(agents[n]) for n in names))
        return dict(zip(names, results, strict=True))
