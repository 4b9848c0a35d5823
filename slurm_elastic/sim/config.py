"""Simulation settings: one frozen object, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_elastic.errors import ConfigError
from slurm_elastic.sim.cluster import PlacementRule
from slurm_elastic.sim.power import PowerSaving
from slurm_elastic.sim.scheduler import SCHEDULERS, SchedulerKind


@dataclass(frozen=True)
class SimConfig:
    """Everything that shapes a run besides the workload and the policy.

    ``start_delay`` is the time a job makes no progress after it starts (the artifact charges 30 s on every
    allocation: checkpoint restore, rendezvous, warm-up). ``resize_cost`` is the same for an elastic resize
    (default 60 s: torchrun restarts the worker group on every membership change). ``walltime_factor``
    turns the modelled runtime into the time limit backfill trusts when the trace has no limit of its own
    (1.0 = users ask for exactly what they use).
    """

    num_nodes: int
    gpus_per_node: int
    scheduler: SchedulerKind = "backfill"
    placement: PlacementRule = "spread"
    interval: float = 60.0
    start_delay: float = 30.0
    resize_cost: float = 60.0
    walltime_factor: float = 1.0
    min_nodes: int = 1  # elastic bounds for jobs whose trace gives none
    max_nodes: int | None = None  # None: the whole cluster
    # Moldable start (elastic runs only): a pending job that the base scheduler does not start and whose min is
    # below its request starts now on the most whole nodes that are free (at least its min), as Slurm does for
    # a job whose node count was reshaped to ``min-max`` while it waited (docs/slurm-facts.md); its time limit
    # grows by request / size, as a shrink's does.
    moldable_start: bool = False
    # Slurm power saving (sim/power.py): the last nodes are off while idle and boot when a job lands on them.
    power: PowerSaving | None = None

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise ConfigError(
                f"cluster must have >= 1 node and >= 1 GPU per node, not {self.num_nodes}x{self.gpus_per_node}"
            )
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(f"scheduler must be one of {', '.join(SCHEDULERS)}, not {self.scheduler!r}")
        if self.placement not in ("spread", "pack"):
            raise ConfigError(f"placement must be spread or pack, not {self.placement!r}")
        if not self.interval > 0:
            raise ConfigError(f"interval must be > 0 seconds, not {self.interval}")
        for name in ("start_delay", "resize_cost"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 seconds")
        if not self.walltime_factor > 0:
            raise ConfigError(f"walltime_factor must be > 0, not {self.walltime_factor}")
        if self.min_nodes < 1 or (self.max_nodes is not None and self.max_nodes < self.min_nodes):
            raise ConfigError(f"need 1 <= min_nodes <= max_nodes, not {self.min_nodes}..{self.max_nodes}")

    @property
    def total_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node
