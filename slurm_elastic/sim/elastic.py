"""The hook through which an elastic policy resizes running jobs in the simulator.

Every scheduling cycle the engine builds a :class:`SimClusterState` and calls ``policy(snapshot, now)``, which
returns :class:`ResizeRequest` objects. The engine, not the policy, enforces the rules of a real cluster:

* resizes are whole-node: a grow adds nodes whose GPUs are all free, a shrink releases all of the job's GPUs
  on its most recently added nodes, and the first node (the batch host) is never released; a GPU-granular grow
  (``ResizeRequest.gpus``) adds one entry of that many GPUs on a partly used node the job does not hold yet,
  and a shrink releases such an entry like any other;
* the target must lie within the job's bounds (``min_nodes..max_nodes``) and within what the performance model
  covers; a request outside them is rejected, never clamped;
* shrinks apply before the base scheduler runs, so the GPUs they free can admit queued jobs this cycle; grows
  apply after it, from whole nodes still free (like a Slurm extension job, which queues behind older jobs);
  a grow that cannot get all its nodes is rejected;
* each applied resize costs the job ``resize_cost`` seconds without progress.

The simulator never decides resizes itself: the one implementation, :mod:`slurm_elastic.sim.policy_adapter`,
asks the production policy (``slurm_elastic.policy.decide``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from slurm_elastic.batchsize import AdaptiveState


@dataclass(frozen=True)
class JobView:
    """One pending or running job as the policy sees it."""

    job_id: str
    state: Literal["PENDING", "RUNNING"]
    submit_time: float
    start_time: float | None  # first start
    requested_gpus: int
    num_nodes: int  # 0 while pending
    num_gpus: int  # 0 while pending
    nodes: tuple[int, ...]  # node indices, batch host first
    gpus_per_node: tuple[int, ...]  # GPUs the job holds on each of ``nodes``
    min_nodes: int
    max_nodes: int
    gpu_util: float  # what the agent would report now: compute/step time, 0 while (re)starting
    throughput: float  # samples/s the job would publish now (goodput API), 0 while (re)starting
    progress: float  # fraction of the job done, 0..1
    resizes: int
    last_resize_time: float | None
    restarting_until: float | None  # end of the current start/resize delay, if one is running
    # What the trace says about who runs it, where available (None otherwise); the adapter to the production
    # policy uses them for accounts (fair share, quotas) and time limits (near-end, restart-cost rules).
    user: str | None = None
    account: str | None = None
    application: str | None = None
    time_limit: float | None = None  # seconds: the limit the base scheduler trusts (see docs/simulator.md)
    adaptive: AdaptiveState | None = None  # an opted-in job's adaptive-batch state, as it would publish it


@dataclass(frozen=True)
class NodeView:
    index: int
    total_gpus: int
    free_gpus: int
    jobs: tuple[str, ...]
    power: str = ""  # power saving (sim/power.py): "" always on; a cold node "off", "booting" or "on"


@dataclass(frozen=True)
class SimClusterState:
    """The whole simulated cluster at ``now``. Jobs are in priority order (pending jobs in queue order)."""

    now: float
    gpus_per_node: int
    total_gpus: int
    free_gpus: int
    nodes: tuple[NodeView, ...]
    jobs: tuple[JobView, ...]


@dataclass(frozen=True)
class ResizeRequest:
    """Ask the engine to bring a running job to ``target_nodes`` whole nodes.

    ``time_limit_add_s``: seconds added to the job's time limit when the resize is applied (what the controller
    does with ``scontrol update TimeLimit=`` after a shrink; extend_time_limit_on_shrink); negative on a grow
    that gives some of it back.
    """

    job_id: str
    target_nodes: int
    reason: str = ""
    time_limit_add_s: float = 0.0
    #: A GPU-granular grow (gpu_granular_growth): the one added entry holds ``gpus`` GPUs (not a whole node) on
    #: ``node`` when it still has them, else on the best-fitting partly used node.
    gpus: int = 0
    node: int | None = None


@dataclass(frozen=True)
class ResizeOutcome:
    """What the engine did with one request: ``applied`` or ``rejected`` with a stable reason code."""

    time: float
    job_id: str
    from_nodes: int
    target_nodes: int
    result: Literal["applied", "rejected"]
    code: str  # applied | not_running | unknown_job | out_of_bounds | no_free_nodes | model_range | no_change
    message: str


class ElasticPolicy(Protocol):
    """``policy(snapshot, now) -> requests``. Pure: the same snapshot and time give the same requests."""

    def __call__(self, snapshot: SimClusterState, now: float) -> Sequence[ResizeRequest]: ...
