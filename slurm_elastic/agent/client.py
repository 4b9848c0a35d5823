"""The controller's client for the node agents: signed ``GET /v1/node``, validated into a :class:`NodeReport`.

One ``_request`` turns every failure into a typed :class:`AgentClientError` (unreachable, timeout, 401 or
unsigned answer, other HTTP status, bad payload). :meth:`AgentClient.fetch_many` asks many agents at once and
never raises for one agent's failure: each result is a report or that agent's error.

    async with AgentClient(key, timeout_s=5) as client:
        results = await client.fetch_many({"n1": "http://n1:9817", "n2": "http://n2:9817"})
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

import aiohttp
from yarl import URL

from slurm_elastic.agent.auth import HEADER_SIGNATURE, ClientAuth, HmacClientAuth, load_key
from slurm_elastic.agent.errors import (
    AgentAuthError,
    AgentClientError,
    AgentHttpError,
    AgentPayloadError,
    AgentRequestError,
    AgentTimeoutError,
    AgentUnreachableError,
    KeyFileError,
    PayloadError,
)
from slurm_elastic.agent.munge import Munge, MungeError
from slurm_elastic.agent.munge_auth import MungeClientAuth, resolve_uid
from slurm_elastic.agent.payload import NODE_PATH, NodeReport, parse_payload_bytes
from slurm_elastic.errors import ConfigError
from slurm_elastic.mig import wire
from slurm_elastic.mig.model import NodeLayout
from slurm_elastic.mig.wire import ApplyAnswer, NodeMigReport

MAX_RESPONSE_BYTES = 32 * 1024 * 1024


class AgentClient:
    def __init__(self, auth: bytes | ClientAuth, *, timeout_s: float = 5.0, concurrency: int = 64,
                 session: aiohttp.ClientSession | None = None, clock: Callable[[], float] = time.time) -> None:
        """``auth``: the shared key (``SE-HMAC-SHA256``) or a scheme's client side (``MungeClientAuth``)."""
        self._auth: ClientAuth = HmacClientAuth(auth) if isinstance(auth, bytes) else auth
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

    async def _request(self, base_url: str, path: str, *, method: str = "GET", body: bytes = b"",
                       timeout_s: float | None = None, answer_errors: bool = False) -> bytes:
        """The signed answer's body. With ``answer_errors``, a signed JSON error answer (4xx/5xx other than 401)
        is raised as :class:`AgentRequestError` carrying its ``error`` code and message."""
        url = base_url.rstrip("/") + path
        # Sign the path the agent will see, prefix included (an agent behind a path-routing proxy).
        sign_args = (method, URL(url).raw_path_qs, body, self._clock())
        try:
            if self._auth.blocking:
                headers, request_id = await asyncio.to_thread(self._auth.sign, *sign_args)
            else:
                headers, request_id = self._auth.sign(*sign_args)
        except MungeError as exc:
            raise AgentAuthError(base_url, f"cannot make our credentials: {exc}") from None
        if body:
            headers["Content-Type"] = "application/json"
        limit = timeout_s or self.timeout_s
        timeout = aiohttp.ClientTimeout(total=limit)
        try:
            async with self._get_session().request(method, url, data=body or None, headers=headers,
                                                   timeout=timeout, allow_redirects=False) as resp:
                answer = await resp.content.read(MAX_RESPONSE_BYTES + 1)
                if len(answer) > MAX_RESPONSE_BYTES:
                    raise AgentPayloadError(base_url, f"answer larger than {MAX_RESPONSE_BYTES} bytes")
                if resp.status == 401:
                    raise AgentAuthError(base_url, f"refused our credentials: {answer[:200].decode(errors='replace')}")
                check_args = (request_id, answer, resp.headers.get(HEADER_SIGNATURE))
                signed = (await asyncio.to_thread(self._auth.check_response, *check_args) if self._auth.blocking
                          else self._auth.check_response(*check_args))
                if resp.status != 200 and answer_errors and signed:
                    raise _request_error(base_url, resp.status, answer)
                if resp.status != 200:
                    raise AgentHttpError(base_url, resp.status, answer[:200].decode(errors="replace"))
                if not signed:
                    raise AgentAuthError(base_url, f"answer is not signed ({self._auth.scheme})")
                return answer
        except AgentClientError:
            raise
        except TimeoutError:
            raise AgentTimeoutError(base_url, f"no answer within {limit:g} s") from None
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

    async def mig_report(self, base_url: str) -> NodeMigReport:
        """``GET /v1/mig``: the node's MIG layout and the profiles NVML offers."""
        body = await self._request(base_url, wire.MIG_PATH, answer_errors=True)
        try:
            return wire.report_from_obj(wire.loads(body))
        except wire.MigWireError as exc:
            raise AgentPayloadError(base_url, f"invalid MIG report: {exc}") from None

    async def mig_apply(self, base_url: str, layout: NodeLayout, *, timeout_s: float | None = None) -> ApplyAnswer:
        """``POST /v1/mig/apply``: idempotent, only what is missing is changed. Raises AgentRequestError with
        ``error`` = ``invalid_layout`` (400), ``apply_failed`` (409/500) or ``mig_apply_disabled`` (403)."""
        body = await self._request(base_url, wire.APPLY_PATH, method="POST",
                                   body=wire.dumps(wire.apply_request_obj(layout)), timeout_s=timeout_s,
                                   answer_errors=True)
        try:
            return wire.answer_from_obj(wire.loads(body))
        except wire.MigWireError as exc:
            raise AgentPayloadError(base_url, f"invalid MIG apply answer: {exc}") from None

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


def client_auth(kind: str, *, key_file: Path, munge_socket: str, munge_agent_user: str,
                munge_ttl_s: int, source: str) -> ClientAuth:
    """The controller's credentials for ``[agents] auth``: the key file's key, or MUNGE (checked at start-up by
    making one credential, so a munged that does not answer stops the controller here, not each cycle)."""
    if kind == "munge":
        try:
            munge = Munge(munge_socket)
            munge.encode(b"slurm-elastic controller start-up", 1)
        except MungeError as exc:
            raise ConfigError(f"{source}: agents.auth = \"munge\": {exc}") from None
        return MungeClientAuth(munge, resolve_uid(munge_agent_user, f"{source}: agents.munge_agent_user"),
                               ttl_s=munge_ttl_s)
    if kind != "hmac":
        raise ConfigError(f"{source}: agents.auth must be 'hmac' or 'munge', got {kind!r}")
    try:
        return HmacClientAuth(load_key(key_file))
    except KeyFileError as exc:  # the default key file as well: name the key that would point elsewhere
        raise ConfigError(f"{source}: agents.key_file: {exc}") from None


def _request_error(url: str, status: int, body: bytes) -> AgentRequestError:
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        obj = None
    if not isinstance(obj, dict):
        return AgentRequestError(url, status, "unknown", body[:200].decode(errors="replace"))
    changes = obj.get("changes")
    return AgentRequestError(url, status, str(obj.get("error", "unknown")), str(obj.get("message", "")),
                             tuple(str(c) for c in changes) if isinstance(changes, list) else ())
