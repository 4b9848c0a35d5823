"""Restarting Slurm's daemons with the site's own commands (``ssh n4 systemctl stop slurmd``, ...).

Beside :mod:`slurm_elastic.slurm.runner`, which runs Slurm's client commands: these are not Slurm commands but
the site's, so they get no retries and no Slurm error classification. Each is an argument list in which only
``{node}`` is replaced, run with a timeout and never through a shell. The runner is
:mod:`slurm_elastic.slurm.runner`'s interface, so the tests' recorder and replayer can stand in for it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol

from slurm_elastic.slurm.errors import SlurmError
from slurm_elastic.slurm.runner import CommandResult, CommandRunner


class DaemonCommandError(SlurmError):
    """A daemon command failed, timed out or could not be started; the message names the command."""


class DaemonCommands(Protocol):
    """The site's commands (``[mig.commands]`` in mig.toml)."""

    @property
    def slurmd_stop(self) -> Sequence[str]: ...
    @property
    def slurmd_start(self) -> Sequence[str]: ...
    @property
    def slurmctld_restart(self) -> Sequence[str]: ...
    @property
    def timeout_s(self) -> float: ...


def daemon_runner(argv: Sequence[str], *, timeout: float, input_text: str | None,
                  env: Mapping[str, str] | None) -> CommandResult:
    """The production runner of daemon commands: a child process; no exit in time or no start is an error."""
    try:
        cp = subprocess.run(list(argv), input=input_text, capture_output=True, text=True,  # noqa: S603
                            errors="replace", timeout=timeout, env=dict(env) if env is not None else None,
                            check=False)
    except subprocess.TimeoutExpired as exc:
        raise DaemonCommandError(f"{' '.join(argv)}: no exit within {timeout:g} s") from exc
    except OSError as exc:
        raise DaemonCommandError(f"{' '.join(argv)}: {exc.strerror or exc}") from exc
    return CommandResult(tuple(argv), cp.returncode, cp.stdout or "", cp.stderr or "")


class SlurmDaemons:
    """Stops and starts a node's slurmd and restarts slurmctld with the configured commands."""

    def __init__(self, commands: DaemonCommands, env: Mapping[str, str] | None = None,
                 runner: CommandRunner = daemon_runner) -> None:
        self.commands = commands
        self.env = dict(os.environ if env is None else env)
        self.runner = runner

    def _run(self, template: Sequence[str], node: str = "") -> None:
        argv = [part.replace("{node}", node) for part in template]
        cp = self.runner(argv, timeout=self.commands.timeout_s, input_text=None, env=self.env)
        if cp.returncode != 0:
            out = (cp.stderr.strip() or cp.stdout.strip())[-500:]
            raise DaemonCommandError(f"{' '.join(argv)} exited {cp.returncode}: {out}")

    def stop_slurmd(self, node: str) -> None:
        self._run(self.commands.slurmd_stop, node)

    def start_slurmd(self, node: str) -> None:
        self._run(self.commands.slurmd_start, node)

    def restart_slurmctld(self) -> None:
        self._run(self.commands.slurmctld_restart)
