"""Workload loaders, one module per trace format. Each rejects a malformed row with its file and line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from slurm_elastic.sim.loaders.itp import load_itp
from slurm_elastic.sim.loaders.philly import load_philly
from slurm_elastic.sim.loaders.pollux import load_pollux
from slurm_elastic.sim.loaders.sacct import load_sacct
from slurm_elastic.sim.workload import Workload

TraceFormat = Literal["pollux", "philly", "itp", "sacct"]
FORMATS: tuple[TraceFormat, ...] = ("pollux", "philly", "itp", "sacct")

_LOADERS: dict[str, Callable[[str], Workload]] = {
    "pollux": load_pollux,
    "philly": load_philly,
    "itp": load_itp,
    "sacct": load_sacct,
}


def load_workload(workload: str, fmt: TraceFormat) -> Workload:
    """Load ``workload`` (a path, optionally ``PATH#SELECTOR``) in the given format."""
    return _LOADERS[fmt](workload)


__all__ = ["FORMATS", "TraceFormat", "load_itp", "load_philly", "load_pollux", "load_sacct", "load_workload"]
