"""The CLI's side of the local API: standard library only, one typed error for every failure."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from slurm_elastic.errors import SlurmElasticError

DEFAULT_SOCKET = Path("/run/slurm-elastic/controller.sock")


class ApiError(SlurmElasticError):
    """The controller refused or failed a request; ``kind`` is permission, request, not_found, unavailable, error
    or down."""

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


def socket_path(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get("SLURM_ELASTIC_SOCKET") or DEFAULT_SOCKET)


def request(path: Path, op: str, args: dict[str, Any] | None = None, *, timeout_s: float = 30.0) -> dict[str, Any]:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(str(path))
            s.sendall(json.dumps({"op": op, "args": args or {}}).encode() + b"\n")
            chunks = []
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                if chunk.endswith(b"\n"):
                    break
    except (FileNotFoundError, ConnectionRefusedError) as e:
        raise ApiError(f"controller not reachable at {path} ({e.strerror}): is slurm-elastic-controller running?",
                       "down") from e
    except OSError as e:
        raise ApiError(f"controller API {path}: {e.strerror or e}", "down") from e
    try:
        reply = json.loads(b"".join(chunks))
    except ValueError as e:
        raise ApiError(f"controller API {path}: unreadable answer") from e
    if not isinstance(reply, dict):
        raise ApiError(f"controller API {path}: unreadable answer")
    if not reply.get("ok"):
        raise ApiError(str(reply.get("error", "unknown error")), str(reply.get("kind", "error")))
    result = reply.get("result")
    return result if isinstance(result, dict) else {}
