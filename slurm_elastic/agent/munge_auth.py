"""Authentication between the controller and the agents with the site's MUNGE key (scheme ``SE-MUNGE``).

The controller sends one fresh credential per request, made by its munged as its service user::

    Authorization: SE-MUNGE <credential>
    credential payload = "SE-MUNGE1\\n" METHOD "\\n" raw path and query "\\n" hex SHA-256(body)

The agent has its munged decode the credential and refuses (401): a missing or malformed header, a credential
munged does not vouch for (``bad_credential``: wrong key, corrupted), one past its TTL (``expired_credential``)
or from the future (``rewound_credential``), one already decoded (``replayed_credential``: by munged, which
refuses a second decode on its host, and by the agent's own cache of accepted credentials, kept for each
credential's TTL), one made by another uid than the controller's service user (``wrong_user``), one with a TTL
above the agent's limit (``ttl_too_long``), and one made for another request (``request_mismatch``: the payload
binds method, path and body, so a credential cannot be lifted onto another request). The TTL is checked
against the agent's clock too, so it holds whatever munged's replay cache remembers. A credential is cached only
after every check passed, so forged requests cannot fill the cache.

The agent answers with a credential of its own in ``X-Slurm-Elastic-Signature`` (payload ``"SE-MUNGE1-response\\n"``
hex SHA-256(request credential) ``"\\n"`` hex SHA-256(body)); the controller checks it decodes, comes from the
agents' service user and binds this very request and body. Everything here is pure but the calls into
:class:`~slurm_elastic.agent.munge.Munge`, which the caller passes in (tests pass recorded decodes).
"""

from __future__ import annotations

import hashlib
import pwd
import re
import threading
from collections.abc import Mapping
from typing import Protocol

from slurm_elastic.agent.errors import AuthError
from slurm_elastic.agent.munge import (
    STATUS_EXPIRED,
    STATUS_REPLAYED,
    STATUS_REWOUND,
    STATUS_SUCCESS,
    Decoded,
    MungeError,
)
from slurm_elastic.errors import ConfigError

SCHEME = "SE-MUNGE"
DEFAULT_TTL_S = 60
DEFAULT_MAX_TTL_S = 300  # munged's own default TTL
_CREDENTIAL = re.compile(r"MUNGE:[A-Za-z0-9+/=]{16,8192}:")
_STATUS_REASON = {STATUS_EXPIRED: "expired_credential", STATUS_REWOUND: "rewound_credential",
                  STATUS_REPLAYED: "replayed_credential"}


class MungeCodec(Protocol):
    """What the authentication needs of :class:`~slurm_elastic.agent.munge.Munge`."""

    def encode(self, payload: bytes, ttl_s: int) -> str: ...

    def decode(self, credential: str) -> Decoded: ...


def resolve_uid(user: str | int, what: str) -> int:
    """A user name or numeric uid -> uid; a name this host does not know is a :class:`ConfigError`."""
    if isinstance(user, int) or user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ConfigError(f"{what}: no user {user!r} on this host (give a user name or a numeric uid)") from None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def request_payload(method: str, path_qs: str, body: bytes) -> bytes:
    return "\n".join(("SE-MUNGE1", method.upper(), path_qs, _sha(body))).encode()


def response_payload(request_id: str, body: bytes) -> bytes:
    return "\n".join(("SE-MUNGE1-response", request_id, _sha(body))).encode()


def request_id(credential: str) -> str:
    """What identifies a request (and its answer): the hash of its credential."""
    return _sha(credential.encode("ascii", "replace"))


class MungeRequestVerifier:
    """The agent's check of ``SE-MUNGE`` requests, with the cache of accepted credentials. ``now`` is passed in."""

    scheme = SCHEME
    blocking = True  # a round trip to munged: run it in a worker thread, not on the event loop

    def __init__(self, munge: MungeCodec, controller_uid: int, *, max_ttl_s: int = DEFAULT_MAX_TTL_S,
                 max_skew_s: float = 30.0, response_ttl_s: int = DEFAULT_TTL_S, max_entries: int = 100_000) -> None:
        self._munge = munge
        self.controller_uid = controller_uid
        self.max_ttl_s = max_ttl_s
        self.max_skew_s = max_skew_s
        self.response_ttl_s = response_ttl_s
        self._max_entries = max_entries
        self._seen: dict[str, float] = {}  # request id -> time after which the credential is expired anyway
        self._next_prune = 0.0
        # verify runs on worker threads: checking and recording a credential must be one step, or two copies of
        # one request arriving together could both pass.
        self._lock = threading.Lock()

    def verify(self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes, now: float) -> str:
        """The request's id; raises :class:`AuthError` with a stable reason code."""
        auth = headers.get("Authorization")
        if auth is None:
            raise AuthError("missing_credentials", f"{SCHEME} credentials required")
        scheme, _, credential = auth.partition(" ")
        credential = credential.strip()
        if scheme != SCHEME or not _CREDENTIAL.fullmatch(credential):
            raise AuthError("malformed_credentials", "malformed authentication header")
        try:
            decoded = self._munge.decode(credential)
        except MungeError as exc:
            raise AuthError("bad_credential", str(exc)) from None
        if decoded.status != STATUS_SUCCESS:
            raise AuthError(_STATUS_REASON.get(decoded.status, "bad_credential"),
                            f"munged refused the credential (status {decoded.status})")
        if decoded.uid != self.controller_uid:
            raise AuthError("wrong_user", f"credential of uid {decoded.uid}, not the controller's")
        if decoded.ttl > self.max_ttl_s:
            raise AuthError("ttl_too_long", f"credential TTL {decoded.ttl} s above the limit of {self.max_ttl_s} s")
        if now > decoded.encode_time + decoded.ttl + self.max_skew_s:
            raise AuthError("expired_credential", "credential older than its TTL")
        if decoded.encode_time > now + self.max_skew_s:
            raise AuthError("rewound_credential", "credential made in the future of the agent's clock")
        if decoded.payload != request_payload(method, path_qs, body):
            raise AuthError("request_mismatch", "the credential was made for another request")
        rid = request_id(credential)
        with self._lock:
            self._forget_expired(now)
            if rid in self._seen:
                raise AuthError("replayed_credential", "credential already used")
            if len(self._seen) >= self._max_entries:
                raise AuthError("too_many_requests", "replay cache full; retry later")  # fail closed
            self._seen[rid] = decoded.encode_time + decoded.ttl + self.max_skew_s
        return rid

    def _forget_expired(self, now: float) -> None:
        if now < self._next_prune and len(self._seen) < self._max_entries:
            return
        self._seen = {r: t for r, t in self._seen.items() if t >= now}
        self._next_prune = now + 1.0

    def sign_response(self, request_id: str, body: bytes) -> str:
        return self._munge.encode(response_payload(request_id, body), self.response_ttl_s)


class MungeClientAuth:
    """The controller's side of ``SE-MUNGE``: a credential per request, the answers' credentials checked."""

    scheme = SCHEME
    blocking = True

    def __init__(self, munge: MungeCodec, agent_uid: int, *, ttl_s: int = DEFAULT_TTL_S) -> None:
        self._munge = munge
        self.agent_uid = agent_uid
        self.ttl_s = ttl_s

    def sign(self, method: str, path_qs: str, body: bytes, now: float) -> tuple[dict[str, str], str]:
        """Raises :class:`MungeError` when munged cannot make the credential."""
        credential = self._munge.encode(request_payload(method, path_qs, body), self.ttl_s)
        return {"Authorization": f"{SCHEME} {credential}"}, request_id(credential)

    def check_response(self, request_id: str, body: bytes, signature: str | None) -> bool:
        if signature is None or not _CREDENTIAL.fullmatch(signature):
            return False
        try:
            decoded = self._munge.decode(signature)
        except MungeError:
            return False
        return decoded.status == STATUS_SUCCESS and decoded.uid == self.agent_uid \
            and decoded.payload == response_payload(request_id, body)
