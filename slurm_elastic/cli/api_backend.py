"""How the operating verbs reach the controller: the local API socket by default (every user; the controller
knows who calls), or the state DB directly with ``--url`` (root/SlurmUser, who can open the 0600 DB file).
Both run the same :class:`~slurm_elastic.api.service.Service`, so the answers and the authorization are the same.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from slurm_elastic.api.client import request, socket_path
from slurm_elastic.errors import SlurmElasticError

F = TypeVar("F", bound=Callable[..., Any])


def backend_options(f: F) -> F:
    f = click.option("--socket", "socket_", envvar="SLURM_ELASTIC_SOCKET", metavar="PATH",
                     help="the controller's API socket (env SLURM_ELASTIC_SOCKET; default "
                          "/run/slurm-elastic/controller.sock)")(f)
    f = click.option("--url", envvar="SLURM_ELASTIC_DB_URL", metavar="URL",
                     help="read/write the state DB directly instead of asking the controller (root/SlurmUser; "
                          "env SLURM_ELASTIC_DB_URL)")(f)
    return f


def call(url: str | None, socket_: str | None, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """The operation's result; every failure becomes a one-line ClickException (exit 1)."""
    try:
        if url:
            return _direct(url, op, args or {})
        return request(socket_path(socket_), op, args or {})
    except SlurmElasticError as e:  # ApiError included
        message = str(e)
        if url:  # a DB that is not theirs to open: say so, rather than "make the directory writable"
            from slurm_elastic.cli.db_access import explain_denied

            message = explain_denied(url, e) or message
        raise click.ClickException(one_line(message)) from e


def one_line(message: str) -> str:
    """Errors are one line on stderr: multi-line messages (a policy's problem list) are joined."""
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


def _direct(url: str, op: str, args: dict[str, Any]) -> dict[str, Any]:
    from slurm_elastic.api.identity import caller_for_uid
    from slurm_elastic.api.service import Service, ServiceSettings
    from slurm_elastic.store import SqlStore

    store = SqlStore.open(url, create=False)
    try:
        return Service(store, ServiceSettings(via="direct")).handle(caller_for_uid(os.getuid()), op, args)
    finally:
        store.close()
