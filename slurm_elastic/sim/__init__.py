"""Trace-driven simulator of a GPU cluster under a Slurm-like scheduler, with a hook for elastic resizing.

Modules: :mod:`.engine` (discrete events), :mod:`.scheduler` (FIFO, greedy and EASY backfill), :mod:`.cluster`
(GPU bookkeeping and placement), :mod:`.perfmodel` (how fast a job runs on a shape), :mod:`.loaders` (trace
formats), :mod:`.metrics`, :mod:`.invariants`, :mod:`.plots`, :mod:`.elastic` (the policy hook),
:mod:`.policy_adapter` (the hook's bridge to the production policy) and :mod:`.run` (baseline vs elastic).
Design notes: ``docs/simulator.md``.
"""

from __future__ import annotations

from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.elastic import (
    ElasticPolicy,
    JobView,
    NodeView,
    ResizeOutcome,
    ResizeRequest,
    SimClusterState,
)
from slurm_elastic.sim.engine import JobRecord, SimResult, Simulation, UsageInterval

__all__ = [
    "ElasticPolicy",
    "JobRecord",
    "JobView",
    "NodeView",
    "ResizeOutcome",
    "ResizeRequest",
    "SimClusterState",
    "SimConfig",
    "SimResult",
    "Simulation",
    "UsageInterval",
]
