"""The interface every job performance model offers to the engine."""

from __future__ import annotations

from typing import Protocol

# GPUs per node of one job's allocation, in allocation order (first entry: the batch host), zeros dropped.
Shape = tuple[int, ...]


class JobPerf(Protocol):
    """How one job advances.

    Progress is counted in model units and split into epochs; the job is done when it reaches
    ``epoch_end(num_epochs - 1)``. Within an epoch a job on a fixed shape advances at a constant rate, so the
    engine can compute exactly when it crosses each boundary.
    """

    @property
    def num_epochs(self) -> int: ...

    def epoch_end(self, epoch: int) -> float:
        """Cumulative progress at which ``epoch`` (0-based) is complete."""
        ...

    def rate(self, shape: Shape, epoch: int) -> float:
        """Progress units per second during ``epoch`` on ``shape`` (excluding restart delays)."""
        ...

    def utilization(self, shape: Shape, epoch: int = 0) -> float:
        """Share of each step the GPUs compute (compute / step time incl. sync): what the agent reports. Only a
        model whose batch size adapts (:mod:`.adaptive`) depends on ``epoch``."""
        ...

    def throughput(self, shape: Shape, epoch: int = 0) -> float:
        """Training samples per second on ``shape`` (excluding restart delays): what a job publishes for the
        goodput rule. Models without a batch size give it in relative units; only ratios matter."""
        ...

    @property
    def max_gpus(self) -> int:
        """The largest number of GPUs the model can answer for."""
        ...
