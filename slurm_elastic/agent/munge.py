"""A small binding to libmunge (Debian's ``libmunge2``, the MUNGE project's own C library), through ctypes.

Why not the ``munge``/``unmunge`` binaries: a fork and exec per credential costs ~1.7 ms here against ~0.12 ms
for the library call (both talk to the same munged over its socket), and the controller makes one credential
per agent request. The only PyPI binding (``pymunge``) has seen no release since 2018.

Only what the agents' authentication needs: :meth:`Munge.encode` (payload, TTL) and :meth:`Munge.decode`, which
returns a :class:`Decoded` for the statuses where MUNGE still vouches for the credential's content (success,
expired, rewound, replayed) and raises :class:`MungeError` for the others (invalid, wrong key, munged down).
Each call opens its own context, so one :class:`Munge` may be used from several threads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

from slurm_elastic.errors import SlurmElasticError

DEFAULT_SOCKET = "/run/munge/munge.socket.2"
LIBRARY = "libmunge.so.2"

# munge.h: munge_opt_t and munge_err_t (stable since MUNGE 0.5).
_OPT_TTL = 4
_OPT_ENCODE_TIME = 6
_OPT_SOCKET = 8
STATUS_SUCCESS = 0
STATUS_EXPIRED = 15
STATUS_REWOUND = 16
STATUS_REPLAYED = 17
#: Statuses after which munge_decode still returns the credential's uid, gid and payload.
_VOUCHED = (STATUS_SUCCESS, STATUS_EXPIRED, STATUS_REWOUND, STATUS_REPLAYED)


class MungeError(SlurmElasticError):
    """libmunge is missing, munged is unreachable, or a credential is not valid at all. ``status`` is munge's
    error code (0 when the library could not be used)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Decoded:
    """What munged says about a credential. ``status`` is 0 or one of EXPIRED, REWOUND, REPLAYED."""

    status: int
    uid: int
    gid: int
    payload: bytes
    encode_time: int
    ttl: int


class Munge:
    """libmunge calls against the munged that listens on ``socket``."""

    def __init__(self, socket: str = DEFAULT_SOCKET, library: str = LIBRARY) -> None:
        self.socket = socket
        try:
            lib = ctypes.CDLL(library)
        except OSError as exc:
            raise MungeError(0, f"cannot load {library} ({exc}); install MUNGE's library (Debian: libmunge2)") \
                from None
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        lib.munge_ctx_create.restype = ctypes.c_void_p
        lib.munge_ctx_create.argtypes = []
        lib.munge_ctx_destroy.restype = None
        lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
        lib.munge_ctx_strerror.restype = ctypes.c_char_p
        lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
        lib.munge_strerror.restype = ctypes.c_char_p
        lib.munge_strerror.argtypes = [ctypes.c_int]
        lib.munge_ctx_get.restype = ctypes.c_int
        lib.munge_ctx_get.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        lib.munge_ctx_set.restype = ctypes.c_int  # variadic: arguments are passed typed, call by call
        lib.munge_encode.restype = ctypes.c_int
        lib.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        lib.munge_decode.restype = ctypes.c_int
        lib.munge_decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                     ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint),
                                     ctypes.POINTER(ctypes.c_uint)]
        libc.free.restype = None
        libc.free.argtypes = [ctypes.c_void_p]
        self._lib, self._free = lib, libc.free
        self._socket_arg = ctypes.c_char_p(socket.encode())  # kept alive: the context copies it, but be safe

    def _context(self) -> int:
        ctx = self._lib.munge_ctx_create()
        if not ctx:
            raise MungeError(0, "munge_ctx_create failed (out of memory)")
        rc = self._lib.munge_ctx_set(ctypes.c_void_p(ctx), ctypes.c_int(_OPT_SOCKET), self._socket_arg)
        if rc != STATUS_SUCCESS:
            self._lib.munge_ctx_destroy(ctx)
            raise MungeError(rc, f"munge socket {self.socket}: {self._lib.munge_strerror(rc).decode()}")
        return int(ctx)

    def _error(self, ctx: int, rc: int, what: str) -> MungeError:
        text = self._lib.munge_ctx_strerror(ctx) or self._lib.munge_strerror(rc)
        return MungeError(rc, f"{what}: {text.decode(errors='replace')} (munge status {rc}, socket {self.socket})")

    def encode(self, payload: bytes, ttl_s: int) -> str:
        """A credential for ``payload`` valid for ``ttl_s`` seconds, made as our uid/gid."""
        ctx = self._context()
        try:
            rc = self._lib.munge_ctx_set(ctypes.c_void_p(ctx), ctypes.c_int(_OPT_TTL), ctypes.c_int(ttl_s))
            if rc != STATUS_SUCCESS:
                raise self._error(ctx, rc, "munge ttl")
            cred = ctypes.c_char_p()
            rc = self._lib.munge_encode(ctypes.byref(cred), ctx, payload, len(payload))
            if rc != STATUS_SUCCESS:
                raise self._error(ctx, rc, "munge encode")
            try:
                return (cred.value or b"").decode("ascii")
            finally:
                self._free(ctypes.cast(cred, ctypes.c_void_p))
        finally:
            self._lib.munge_ctx_destroy(ctx)

    def decode(self, credential: str) -> Decoded:
        """munged's verdict on ``credential``; raises :class:`MungeError` unless it vouches for the content."""
        ctx = self._context()
        try:
            buf, length = ctypes.c_void_p(), ctypes.c_int()
            uid, gid = ctypes.c_uint(), ctypes.c_uint()
            rc = self._lib.munge_decode(credential.encode("ascii", "replace"), ctx, ctypes.byref(buf),
                                        ctypes.byref(length), ctypes.byref(uid), ctypes.byref(gid))
            try:
                payload = ctypes.string_at(buf, length.value) if buf.value else b""
            finally:
                if buf.value:
                    self._free(buf)
            if rc not in _VOUCHED:
                raise self._error(ctx, rc, "munge decode")
            encoded, ttl = ctypes.c_long(), ctypes.c_int()
            self._lib.munge_ctx_get(ctx, _OPT_ENCODE_TIME, ctypes.byref(encoded))
            self._lib.munge_ctx_get(ctx, _OPT_TTL, ctypes.byref(ttl))
            return Decoded(rc, uid.value, gid.value, payload, encoded.value, ttl.value)
        finally:
            self._lib.munge_ctx_destroy(ctx)
