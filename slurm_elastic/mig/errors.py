"""Errors raised by the MIG core. All subclass :class:`slurm_elastic.errors.SlurmElasticError`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from slurm_elastic.errors import ConfigError, SlurmElasticError


class MigRejectReason(StrEnum):
    """Stable codes for why a layout is rejected. Messages may be reworded; codes may not."""

    BAD_COUNT = "BAD_COUNT"
    MIG_DISABLED_WITH_INSTANCES = "MIG_DISABLED_WITH_INSTANCES"
    UNKNOWN_PROFILE = "UNKNOWN_PROFILE"
    COMPUTE_SLICES = "COMPUTE_SLICES"
    MAX_INSTANCES = "MAX_INSTANCES"
    MEMORY_SLICES = "MEMORY_SLICES"
    NO_PLACEMENT = "NO_PLACEMENT"
    BAD_PLACEMENT = "BAD_PLACEMENT"
    OVERLAP = "OVERLAP"


@dataclass(frozen=True)
class LayoutProblem:
    code: MigRejectReason
    message: str
    profile: str | None = None


class MigError(SlurmElasticError):
    """Base of the MIG errors."""


class CatalogError(ConfigError):
    """The MIG profile catalog file is malformed (unknown field, missing version, inconsistent numbers)."""


class UnknownGpuError(MigError):
    """A GPU model, NVML name or PCI device id that the catalog does not know."""


class LayoutError(MigError):
    """A requested MIG layout cannot be built on the GPU. ``problems`` carries every reason, with codes."""

    def __init__(self, problems: Sequence[LayoutProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(p.message for p in self.problems))


class PartedConfigError(ConfigError):
    """A mig-parted configuration file that cannot be read (bad YAML, unknown field, missing version)."""


class MigDeviceError(MigError):
    """A MIG operation on a device failed (what NVML would answer with an error code)."""


class GresRenderError(MigError):
    """The GRES lines for a node cannot be written (bad device-file template, missing instance ids)."""


class WorkflowError(MigError):
    """A workflow step could not be done; the message becomes the step's journal message."""


class InjectedFault(WorkflowError):
    """Raised by the test-only fault hook (``SLURM_ELASTIC_MIG_FAULT=fail:<step>``)."""


class WorkflowBusyError(WorkflowError):
    """Another workflow on the node is still open."""
