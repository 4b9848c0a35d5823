"""The controller's local API server: one JSON request line in, one JSON answer line out, over a UNIX socket.

The caller is who the kernel says it is (SO_PEERCRED), never what the request claims, so a user cannot bypass
authorization with a client of their own. The socket is world-connectable (0666) on purpose: everyone may ask,
the service decides per caller. The state DB stays 0600 for root/SlurmUser.

Runs in a daemon thread of the controller (socketserver threads, one per connection; short requests)."""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm_elastic.api.authz import Caller, PermissionDeniedError, UnknownOperationError
from slurm_elastic.api.identity import caller_for_uid
from slurm_elastic.api.service import NotFoundError, RequestError, Service
from slurm_elastic.errors import ConfigError, SlurmElasticError
from slurm_elastic.store.errors import StoreUnavailableError

log = logging.getLogger(__name__)
MAX_REQUEST = 1 << 20
_UCRED = struct.Struct("3i")  # pid, uid, gid


def peer_uid(sock: socket.socket) -> int:
    _pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(uid)


def error_kind(e: Exception) -> str:
    if isinstance(e, PermissionDeniedError):
        return "permission"
    if isinstance(e, (RequestError, UnknownOperationError, ConfigError)):
        return "request"
    if isinstance(e, NotFoundError):
        return "not_found"
    return "error"


def answer(service: Service, caller: Caller, raw: bytes) -> dict[str, Any]:
    """The answer to one request line (never raises for a bad request)."""
    try:
        req = json.loads(raw)
        if not isinstance(req, dict) or not isinstance(req.get("op"), str) or not isinstance(req.get("args", {}),
                                                                                              dict):
            raise RequestError('a request is {"op": NAME, "args": {...}}')
        result = service.handle(caller, req["op"], req.get("args", {}))
        return {"ok": True, "result": result}
    except json.JSONDecodeError:
        return {"ok": False, "kind": "request", "error": "request is not JSON"}
    except StoreUnavailableError as e:
        if caller.is_admin(service.settings.access):
            return {"ok": False, "kind": "unavailable", "error": str(e)}
        log.warning("API: %s (uid %d) got no answer: %s", caller.user, caller.uid, e)  # the details, for admins
        return {"ok": False, "kind": "unavailable",
                "error": f"the controller cannot use its state DB right now ({e.reason}, while trying to "
                         f"{e.operation}); nothing for {caller.user} to fix: it retries by itself, and its "
                         "administrators find the details in its log"}
    except SlurmElasticError as e:
        return {"ok": False, "kind": error_kind(e), "error": str(e)}


class _Handler(socketserver.StreamRequestHandler):
    server: ApiServer
    timeout = 30  # a client that connects and says nothing must not hold a thread forever

    def handle(self) -> None:
        caller = self.server.identify(peer_uid(self.request))
        raw = self.rfile.readline(MAX_REQUEST)
        try:
            reply = answer(self.server.service, caller, raw)
        except Exception as e:  # a bug must cost one request, never the controller
            log.exception("API request from %s failed", caller.user)
            reply = {"ok": False, "kind": "error", "error": f"internal error: {type(e).__name__}: {e}"}
        op = "?"
        try:
            op = str(json.loads(raw).get("op"))
        except (ValueError, AttributeError):
            pass
        if not reply["ok"] and reply["kind"] == "permission":
            log.warning("API: %s (uid %d) refused %s: %s", caller.user, caller.uid, op, reply["error"])
        elif op in {"policy.set", "policy.rollback", "pause", "resume"} and reply["ok"]:
            log.info("API: %s (uid %d) %s: %s", caller.user, caller.uid, op, json.dumps(reply["result"])[:300])
        self.wfile.write(json.dumps(reply, default=str).encode() + b"\n")


class ApiServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, service: Service,
                 identify: Callable[[int], Caller] = caller_for_uid) -> None:
        self.service = service
        self.identify = identify
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() or path.is_symlink():
                path.unlink()
        except OSError as e:
            raise ConfigError(f"api.socket {path}: {e.strerror}") from e
        super().__init__(str(path), _Handler)
        os.chmod(path, 0o666)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="api", daemon=True)
        t.start()
        log.info("API listening on %s", self.path)
        return t

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        try:
            self.path.unlink()
        except OSError:
            pass
