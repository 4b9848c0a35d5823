"""Running Slurm commands: argument lists only, always a timeout, typed errors, retries for transient ones."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from slurm_elastic.slurm.errors import (
    SlurmCommandError,
    SlurmInvalidNodeError,
    SlurmJobNotFoundError,
    SlurmPermissionError,
    SlurmTimeoutError,
    SlurmTransientError,
)

log = logging.getLogger(__name__)

# Substrings of Slurm messages that mean "try again later", not "this request is wrong".
TRANSIENT_PATTERNS = (
    "unable to contact slurm controller",
    "socket timed out",
    "job update not available right now",
    "db index is being set",
    "resource temporarily unavailable",
    "zero bytes were transmitted",
    "connection refused",
    "slurmctld not responding",
    "communication connection failure",
    "unable to connect to database",
    "protocol authentication error",
)
NOT_FOUND_PATTERNS = ("invalid job id", "job id not found", "does not exist")
# "Invalid node name specified for job N": the job exists, its node list is wrong (measured on 22.05 to 26.05).
INVALID_NODE_PATTERNS = ("invalid node name",)
PERMISSION_PATTERNS = ("access/permission denied", "permission denied", "only root", "user not authorized")


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def message(self) -> str:
        """Slurm's own message: stderr when it said something, else stdout."""
        return (self.stderr.strip() or self.stdout.strip())


class CommandRunner(Protocol):
    def __call__(
        self, argv: Sequence[str], *, timeout: float, input_text: str | None, env: Mapping[str, str] | None
    ) -> CommandResult: ...


def subprocess_runner(
    argv: Sequence[str], *, timeout: float, input_text: str | None, env: Mapping[str, str] | None
) -> CommandResult:
    """The production runner: a real child process, never through a shell."""
    try:
        cp = subprocess.run(  # noqa: S603 - argument list, no shell
            list(argv),
            input=input_text,
            capture_output=True,
            text=True,
            # Any user can put bytes that are not UTF-8 into a job name or comment, and squeue --json passes them
            # through verbatim: decoding strictly made every snapshot raise (docs/reliability.md, bug 1).
            errors="replace",
            timeout=timeout,
            env=dict(env) if env is not None else None,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise SlurmTimeoutError(argv, -9, f"timed out after {timeout:.0f}s") from e
    except FileNotFoundError as e:
        raise SlurmCommandError(argv, 127, f"command not found: {argv[0]}") from e
    return CommandResult(tuple(argv), cp.returncode, cp.stdout or "", cp.stderr or "")


def classify(result: CommandResult) -> SlurmCommandError:
    """Turn a failed command into the most specific typed error."""
    msg = result.message
    low = msg.lower()
    if any(p in low for p in TRANSIENT_PATTERNS):
        return SlurmTransientError(result.argv, result.returncode, msg)
    if any(p in low for p in INVALID_NODE_PATTERNS):
        return SlurmInvalidNodeError(result.argv, result.returncode, msg)
    if any(p in low for p in NOT_FOUND_PATTERNS):
        return SlurmJobNotFoundError(result.argv, result.returncode, msg)
    if any(p in low for p in PERMISSION_PATTERNS):
        return SlurmPermissionError(result.argv, result.returncode, msg)
    return SlurmCommandError(result.argv, result.returncode, msg or f"exit status {result.returncode}")


@dataclass
class RetryPolicy:
    attempts: int = 4
    first_delay: float = 0.5
    factor: float = 2.0
    max_delay: float = 8.0


class SlurmCommands:
    """Runs Slurm client commands with the cluster's environment, a timeout, and retries on transient errors."""

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        runner: CommandRunner = subprocess_runner,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.env = dict(env) if env is not None else dict(os.environ)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._runner = runner
        self._sleep = sleep

    def run(
        self,
        argv: Sequence[str],
        *,
        input_text: str | None = None,
        timeout: float | None = None,
        retry_transient: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run once, or until a non-transient outcome; raise the typed error of the last failure."""
        attempts = self.retry.attempts if retry_transient else 1
        delay = self.retry.first_delay
        last: SlurmCommandError | None = None
        for attempt in range(1, attempts + 1):
            try:
                result = self._runner(
                    argv, timeout=timeout or self.timeout, input_text=input_text, env=env or self.env
                )
            except SlurmTransientError as e:
                last = e
            else:
                if result.returncode == 0:
                    return result
                err = classify(result)
                if not isinstance(err, SlurmTransientError):
                    raise err
                last = err
            if attempt < attempts:
                log.warning("transient Slurm error (attempt %d/%d), retrying in %.1fs: %s",
                            attempt, attempts, delay, last.message)
                self._sleep(delay)
                delay = min(delay * self.retry.factor, self.retry.max_delay)
        assert last is not None
        raise last
