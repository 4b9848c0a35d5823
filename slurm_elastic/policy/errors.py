"""Errors of the policy package. Bad configuration raises :class:`slurm_elastic.errors.ConfigError`."""

from __future__ import annotations

from slurm_elastic.errors import SlurmElasticError


class PolicyInputError(SlurmElasticError):
    """A PolicyInput that can not be decided on (duplicate units, an extension job claimed twice, ...).

    Always a bug in the caller (controller or simulator adapter), never a property of the cluster.
    """
