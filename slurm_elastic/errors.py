"""One exception hierarchy for the whole package.

Reasons are data, errors are exceptions: every failure is raised where it happens as a subclass of
:class:`SlurmElasticError`, carrying what an operator needs to act on it.
"""

from __future__ import annotations


class SlurmElasticError(Exception):
    """Base of every error slurm-elastic raises on purpose."""


class ConfigError(SlurmElasticError):
    """Invalid configuration. The only kind of error that stops a daemon at start-up."""
