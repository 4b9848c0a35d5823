"""What a simulation run leaves behind: per-job records, GPU usage intervals and the run's result."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.elastic import ResizeOutcome
from slurm_elastic.sim.power import PowerReport


@dataclass(frozen=True)
class UsageInterval:
    """A job held ``gpus`` GPUs over [start, end); ``busy_gpus`` of them computed.

    ``busy_gpus`` = gpus x the model's utilization, or 0 while the job (re)starts.
    """

    job: int
    start: float
    end: float
    gpus: int
    busy_gpus: float


@dataclass(frozen=True)
class JobRecord:
    """What happened to one job."""

    job_id: str
    submit_time: float
    requested_gpus: int
    start_time: float
    end_time: float
    resizes: int
    min_nodes: int
    max_nodes: int
    max_gpus: int  # the model's limit
    gpus_seen: tuple[int, ...]  # every GPU count the job ran at, in order
    nodes_seen: tuple[int, ...]  # node counts after each resize (first entry: at start)
    molded: bool = False  # started on fewer whole nodes than it asked for (SimConfig.moldable_start)

    @property
    def jct(self) -> float:
        return self.end_time - self.submit_time

    @property
    def wait(self) -> float:
        return self.start_time - self.submit_time


@dataclass(frozen=True)
class SimResult:
    config: SimConfig
    jobs: tuple[JobRecord, ...]
    usage: tuple[UsageInterval, ...]
    queue_length: tuple[tuple[float, int], ...]  # (time, pending jobs) at each change
    resizes: tuple[ResizeOutcome, ...]
    unfinished: tuple[str, ...]  # job ids that never completed (must be empty)
    power: PowerReport | None = None  # powered node-seconds and resumes, with SimConfig.power
    #: (time, free GPUs on partly used nodes, those no waiting job could use) at each change (policy/fragmentation)
    stranded: tuple[tuple[float, int, int], ...] = ()
