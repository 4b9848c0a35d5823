"""Errors the simulator raises on purpose, all under :class:`slurm_elastic.errors.SlurmElasticError`."""

from __future__ import annotations

from slurm_elastic.errors import SlurmElasticError


class SimulationError(SlurmElasticError):
    """Base of every simulator error."""


class TraceFormatError(SimulationError):
    """A workload file is malformed. Carries where (path and 1-based line) and what is wrong."""

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")


class TracesNotFoundError(SimulationError):
    """The shared trace directory (application measurements) cannot be found."""


class PerfModelError(SimulationError):
    """The performance model cannot answer for this job or shape (e.g. outside the measured range)."""


class WorkloadError(SimulationError):
    """The workload cannot run on the simulated cluster (e.g. a job asks for more GPUs than exist)."""


class InvariantViolation(SimulationError):
    """The simulation broke one of its invariants. Always a bug in the simulator or in a policy."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "; ".join(problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        super().__init__(f"simulation invariants violated: {shown}{more}")
