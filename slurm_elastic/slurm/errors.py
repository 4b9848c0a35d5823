"""Typed errors of the Slurm adapter. Each one carries the command and Slurm's own message."""

from __future__ import annotations

from collections.abc import Sequence

from slurm_elastic.errors import SlurmElasticError


class SlurmError(SlurmElasticError):
    """Base of every error raised by :mod:`slurm_elastic.slurm`."""


class SlurmParseError(SlurmError):
    """Slurm's output could not be understood (malformed JSON, wrong types, unknown format)."""


class SlurmCommandError(SlurmError):
    """A Slurm command failed. ``message`` is Slurm's own text (stderr, else stdout)."""

    def __init__(self, argv: Sequence[str], returncode: int, message: str) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.message = message.strip()
        super().__init__(f"{' '.join(self.argv[:3])}... exited {returncode}: {self.message}")


class SlurmTransientError(SlurmCommandError):
    """A failure worth retrying: slurmctld not responding, "DB index is being set", socket timeouts."""


class SlurmTimeoutError(SlurmTransientError):
    """The command did not finish within its timeout (it was killed)."""


class SlurmJobNotFoundError(SlurmCommandError):
    """Slurm does not know the job id (or it has already been purged)."""


class SlurmInvalidNodeError(SlurmCommandError):
    """Slurm refused a node name or node list ("Invalid node name specified"): for a job update the job exists,
    the list is wrong (not a subset of its nodes: an expand, or an unknown node)."""


class SlurmPermissionError(SlurmCommandError):
    """Slurm refused the request for lack of privileges (access denied / not owner)."""
