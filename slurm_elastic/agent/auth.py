"""Request signing between the controller and the agents: a shared key, HMAC-SHA256, timestamp and nonce.

Scheme ``SE-HMAC-SHA256`` (documented in docs/agent.md). The client sends::

    X-Slurm-Elastic-Timestamp: <Unix seconds, integer>
    X-Slurm-Elastic-Nonce: <16-128 characters of [A-Za-z0-9_-], fresh per request>
    Authorization: SE-HMAC-SHA256 <hex HMAC-SHA256(key, canonical request)>

    canonical request = "SE1\\n" METHOD "\\n" raw path and query "\\n" timestamp "\\n" nonce "\\n" hex SHA-256(body)

The agent refuses (401) a missing or malformed header, a timestamp more than ``max_skew_s`` away from its clock,
a nonce already accepted within the window (replay), and a wrong signature (compared in constant time). The
nonce is recorded only after the signature checks, so forged requests cannot fill the cache. The agent signs its
answer the same way (``X-Slurm-Elastic-Signature``: HMAC over "SE1-response", the request's nonce and the body's
hash), so the controller also knows the data came from a holder of the key.

The same module decides who may read which ``/metrics`` series (:class:`MetricsAccess`): a scraper that presents
the metrics token the Prometheus way (``Authorization: Bearer <token>``, what ``authorization: {credentials_file:
...}`` in prometheus.yml sends) gets every series; one without credentials gets the series without per-job labels
(job, user, account), nothing, or everything, as configured; wrong credentials get 401.

Everything here is pure except :func:`load_key` and :func:`load_token`, which read a file and check its mode.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Protocol

from slurm_elastic.agent.errors import AuthError, KeyFileError

SCHEME = "SE-HMAC-SHA256"
HEADER_TIMESTAMP = "X-Slurm-Elastic-Timestamp"
HEADER_NONCE = "X-Slurm-Elastic-Nonce"
HEADER_SIGNATURE = "X-Slurm-Elastic-Signature"  # on responses
MIN_KEY_BYTES = 32
MIN_TOKEN_BYTES = 16
#: What ``/metrics`` serves to a scraper without credentials: the series without job/user/account labels, a 401,
#: or every series (the opt-in to per-job labels without a token).
METRICS_ANONYMOUS = ("reduced", "none", "all")
#: Labels that tie a series to a job or a person; only the full view carries them.
PER_JOB_LABELS = frozenset({"job", "jobid", "user", "account"})
DEFAULT_MAX_SKEW_S = 30.0
#: How the controller and the agents authenticate each other: this module's shared key, or MUNGE (munge_auth.py).
AUTH_KINDS = ("hmac", "munge")
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,128}")


def _read_secret(p: Path, what: str, missing_hint: str) -> bytes:
    """The stripped content of a secret file that only its owner (us or root) may access."""
    try:
        st = p.stat()
    except FileNotFoundError:
        raise KeyFileError(f"{what} {p} does not exist ({missing_hint})") from None
    except OSError as exc:
        raise KeyFileError(f"{what} {p}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"{what} {p} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise KeyFileError(f"{what} {p} has mode {mode:04o}, readable beyond its owner: chmod 600 {p}")
    if st.st_uid not in (os.geteuid(), 0):
        raise KeyFileError(f"{what} {p} is owned by uid {st.st_uid}, neither us nor root")
    try:
        return p.read_bytes().strip()
    except OSError as exc:
        raise KeyFileError(f"{what} {p}: {exc.strerror}") from None


def load_key(path: str | Path) -> bytes:
    """The shared key. Refuses a key file that group or others may access (mode must be 0600 or stricter)."""
    p = Path(path)
    key = _read_secret(p, "key file", f"create one: slurm-elastic agent --generate-key {p}")
    if len(key) < MIN_KEY_BYTES:
        raise KeyFileError(f"key file {p} holds {len(key)} bytes; at least {MIN_KEY_BYTES} are needed")
    return key


def load_token(path: str | Path) -> bytes:
    """The metrics bearer token: mode 0600 or stricter, at least 16 printable ASCII characters without spaces (it
    travels in an HTTP header; Prometheus trims the whitespace around a credentials_file the same way)."""
    p = Path(path)
    token = _read_secret(p, "metrics token file", f"create one: slurm-elastic agent --generate-key {p}")
    if len(token) < MIN_TOKEN_BYTES:
        raise KeyFileError(f"metrics token file {p} holds {len(token)} bytes; at least {MIN_TOKEN_BYTES} are needed")
    if not all(0x21 <= b <= 0x7E for b in token):
        raise KeyFileError(f"metrics token file {p} must hold printable ASCII without spaces (an HTTP header value)")
    return token


def generate_key_file(path: str | Path) -> None:
    """Writes a new random key (mode 0600). Refuses to overwrite an existing file."""
    p = Path(path)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(48) + "\n")


def _body_hash(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def canonical_request(method: str, path_qs: str, timestamp: str, nonce: str, body: bytes) -> bytes:
    return "\n".join(("SE1", method.upper(), path_qs, timestamp, nonce, _body_hash(body))).encode()


def _mac(key: bytes, msg: bytes) -> str:
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def sign_request(key: bytes, method: str, path_qs: str, body: bytes, *, now: float,
                 nonce: str | None = None) -> dict[str, str]:
    """The headers that authenticate one request."""
    ts = str(int(now))
    nonce = nonce or secrets.token_hex(16)
    sig = _mac(key, canonical_request(method, path_qs, ts, nonce, body))
    return {HEADER_TIMESTAMP: ts, HEADER_NONCE: nonce, "Authorization": f"{SCHEME} {sig}"}


def sign_response(key: bytes, nonce: str, body: bytes) -> str:
    return _mac(key, "\n".join(("SE1-response", nonce, _body_hash(body))).encode())


def verify_response(key: bytes, nonce: str, body: bytes, signature: str | None) -> bool:
    return signature is not None and hmac.compare_digest(sign_response(key, nonce, body), signature)


class Verifier(Protocol):
    """The agent's side of a scheme: ``verify`` returns the id the answer is signed with. ``blocking``: the
    calls wait on something outside (munged) and belong in a worker thread."""

    scheme: str
    blocking: bool

    def verify(self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes, now: float) -> str: ...

    def sign_response(self, request_id: str, body: bytes) -> str: ...


class ClientAuth(Protocol):
    """The controller's side of a scheme (see :class:`Verifier`)."""

    scheme: str
    blocking: bool

    def sign(self, method: str, path_qs: str, body: bytes, now: float) -> tuple[dict[str, str], str]: ...

    def check_response(self, request_id: str, body: bytes, signature: str | None) -> bool: ...


class RequestVerifier:
    """Checks signed requests and remembers accepted nonces for the replay window. ``now`` is passed in."""

    scheme = SCHEME
    blocking = False

    def __init__(self, key: bytes, max_skew_s: float = DEFAULT_MAX_SKEW_S, max_nonces: int = 100_000) -> None:
        self._key = key
        self.max_skew_s = max_skew_s
        self._max_nonces = max_nonces
        self._nonces: dict[str, float] = {}  # nonce -> time after which it may be forgotten
        self._next_prune = 0.0

    def verify(self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes, now: float) -> str:
        """Returns the request's nonce; raises :class:`AuthError` with a stable reason code."""
        auth = headers.get("Authorization")
        ts = headers.get(HEADER_TIMESTAMP)
        nonce = headers.get(HEADER_NONCE)
        if auth is None or ts is None or nonce is None:
            raise AuthError("missing_credentials", f"{SCHEME} credentials required")
        scheme, _, sig = auth.partition(" ")
        if scheme != SCHEME or not re.fullmatch(r"[0-9a-f]{64}", sig.strip()) or not ts.isdigit() \
                or not _NONCE.fullmatch(nonce):
            raise AuthError("malformed_credentials", "malformed authentication headers")
        if abs(now - int(ts)) > self.max_skew_s:
            raise AuthError("stale_timestamp",
                            f"timestamp {ts} is more than {self.max_skew_s:g} s from the agent clock")
        expected = _mac(self._key, canonical_request(method, path_qs, ts, nonce, body))
        if not hmac.compare_digest(expected, sig.strip()):
            raise AuthError("bad_signature", "signature does not match")
        self._forget_expired(now)
        if nonce in self._nonces:
            raise AuthError("replayed_nonce", "nonce already used")
        if len(self._nonces) >= self._max_nonces:
            raise AuthError("too_many_requests", "replay cache full; retry later")  # fail closed
        # A nonce can be replayed only while its timestamp passes the skew check: remember it until then.
        self._nonces[nonce] = int(ts) + self.max_skew_s
        return nonce

    def _forget_expired(self, now: float) -> None:
        if now < self._next_prune and len(self._nonces) < self._max_nonces:
            return
        self._nonces = {n: t for n, t in self._nonces.items() if t >= now}
        self._next_prune = now + 1.0

    def sign_response(self, nonce: str, body: bytes) -> str:
        return sign_response(self._key, nonce, body)


class HmacClientAuth:
    """The controller's side of ``SE-HMAC-SHA256``: signs requests, checks the answers' signatures."""

    scheme = SCHEME
    blocking = False  # pure computation: no need for a worker thread

    def __init__(self, key: bytes) -> None:
        self._key = key

    def sign(self, method: str, path_qs: str, body: bytes, now: float) -> tuple[dict[str, str], str]:
        """The request's headers and the id its answer is signed with (the nonce)."""
        headers = sign_request(self._key, method, path_qs, body, now=now)
        return headers, headers[HEADER_NONCE]

    def check_response(self, request_id: str, body: bytes, signature: str | None) -> bool:
        return verify_response(self._key, request_id, body, signature)


MetricsView = Literal["full", "reduced"]


class MetricsAccess:
    """Which view of ``/metrics`` a request gets, from its ``Authorization`` header (None when absent).

    No credentials: ``anonymous`` decides ("reduced": the series without per-job labels, "none": 401, "all":
    every series). ``Bearer <token>`` equal to the configured token: every series. Any other credentials, or
    credentials while no token is configured, are refused (401): a scraper configured with a token must notice
    that it is wrong instead of getting less data quietly. The comparison is in constant time (over SHA-256
    digests, so not even the token's length shows)."""

    def __init__(self, token: bytes | None = None, anonymous: str = "reduced") -> None:
        if anonymous not in METRICS_ANONYMOUS:
            raise ValueError(f"anonymous must be one of {', '.join(METRICS_ANONYMOUS)}, got {anonymous!r}")
        self._digest = hashlib.sha256(token).digest() if token is not None else None
        self.anonymous = anonymous

    def view(self, authorization: str | None) -> MetricsView:
        """Raises :class:`AuthError` (reasons: missing_credentials, malformed_credentials, no_token_configured,
        bad_token)."""
        if authorization is None:
            if self.anonymous == "none":
                raise AuthError("missing_credentials", "a bearer token is required")
            return "full" if self.anonymous == "all" else "reduced"
        scheme, _, credentials = authorization.strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() != "bearer" or not credentials:
            raise AuthError("malformed_credentials", "expected 'Authorization: Bearer <token>'")
        if self._digest is None:
            raise AuthError("no_token_configured", "no metrics token is configured here")
        presented = hashlib.sha256(credentials.encode("utf-8", "replace")).digest()
        if not hmac.compare_digest(presented, self._digest):
            raise AuthError("bad_token", "wrong token")
        return "full"
