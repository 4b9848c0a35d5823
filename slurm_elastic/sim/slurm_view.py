"""How the simulator's cluster looks to the production policy: the Slurm jobs and nodes the adapter shows
(sim/policy_adapter.py; its module docstring gives the modelling rules), and how trace jobs become elastic units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from slurm_elastic.errors import ConfigError
from slurm_elastic.sim.elastic import JobView
from slurm_elastic.slurm.model import GresCount, Job, Node

EPOCH = datetime(2024, 1, 1, tzinfo=UTC)  # a Monday, 00:00 UTC
PARTITION = "sim"
USER = "sim"
MAX_AGE_MIN = 7 * 24 * 60  # Slurm's default PriorityMaxAge (7-0)
_CPUS_PER_GPU = 8


@dataclass(frozen=True)
class AdapterSettings:
    """How trace jobs become elastic units (the simulator's stand-in for users' ``#ELASTIC`` directives).

    With ``n = gpus / G`` the nodes' worth of GPUs a job asked for:

    * ``--min-nodes`` is ``max(1, floor(min_fraction * n))``: 0 lets every job shrink to its batch host,
      1 keeps at least the whole nodes it asked for;
    * ``--max-nodes`` is ``ceil(max_factor * n)``, at least the nodes it started on, at most the cluster.

    Both stay within the engine's bounds (``SimConfig.min_nodes/max_nodes`` or the trace's). ``time_limits``:
    whether the policy sees the jobs' time limits (see the module docstring).
    """

    min_fraction: float = 0.0
    max_factor: float = 2.0
    time_limits: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_fraction <= 1.0:
            raise ConfigError(f"min_fraction must be within 0..1, not {self.min_fraction}")
        if not self.max_factor >= 1.0:
            raise ConfigError(f"max_factor must be >= 1, not {self.max_factor}")


def job_bounds(settings: AdapterSettings, requested_gpus: int, start_nodes: int, gpus_per_node: int, *,
               engine: tuple[int, int]) -> tuple[int, int]:
    """(min_nodes, max_nodes) of a job's elastic unit; always within the engine's bounds, min <= max."""
    asked = requested_gpus / gpus_per_node
    lo = max(1, math.floor(settings.min_fraction * asked + 1e-9))
    hi = max(math.ceil(settings.max_factor * asked - 1e-9), start_nodes)
    engine_min, engine_max = engine
    hi = max(min(hi, engine_max), engine_min)
    lo = min(max(lo, engine_min), hi)
    return lo, hi


def at(seconds: float) -> datetime:
    """Simulated seconds as a UTC datetime."""
    return EPOCH + timedelta(seconds=seconds)


def age_priority(waited_s: float) -> int:
    """Multifactor priority with only the age factor: 1 + whole minutes waited, capped at PriorityMaxAge."""
    return 1 + min(MAX_AGE_MIN, max(0, int(waited_s // 60)))


def node_name(index: int) -> str:
    return f"n{index}"


def account_of(view: JobView) -> str | None:
    if view.account:
        return view.account
    if view.application:
        return f"app-{view.application}"
    return None


#: A cold node's power state (sim/power.py) as the state flags Slurm shows (the test cluster's CLOUD nodes).
POWER_FLAGS = {"": (), "on": ("CLOUD",), "off": ("CLOUD", "POWERED_DOWN"), "booting": ("CLOUD", "POWERING_UP")}


def build_node(index: int, gpus: int, used: int, power: str = "") -> Node:
    state = "IDLE" if used == 0 else "ALLOCATED" if used >= gpus else "MIXED"
    return Node(
        name=node_name(index), state=state, state_flags=POWER_FLAGS[power], partitions=(PARTITION,),
        cpus=gpus * _CPUS_PER_GPU, alloc_cpus=used * _CPUS_PER_GPU, gres=(GresCount("gpu", None, gpus),),
        gres_used=(GresCount("gpu", None, used),),
    )


def build_job(view: JobView, job_id: int, priority: int, gpus_per_node: int, *, nodes: tuple[str, ...] = (),
              reason: str | None = None, time_limit: bool = True) -> Job:
    """The Slurm job of a trace job: pending (``nodes`` empty) or the leader of a running unit.

    ``time_limit=False`` shows the job as UNLIMITED."""
    running = view.state == "RUNNING"
    if running:
        count, per_node = len(nodes), gpus_per_node  # extension nodes are whole nodes
    else:
        count = max(1, math.ceil(view.requested_gpus / gpus_per_node))
        per_node = math.ceil(view.requested_gpus / count)
    limit = None if view.time_limit is None or not time_limit else max(1, math.ceil(view.time_limit / 60))
    return Job(
        job_id=job_id, name=view.job_id, user=view.user or USER, account=account_of(view), partition=PARTITION,
        qos=None, priority=priority, state=view.state, state_reason=None if running else reason, nodes=nodes,
        batch_host=nodes[0] if nodes else None, node_count=count, tres_per_node=f"gres:gpu:{per_node}",
        gres_per_node=(GresCount("gpu", None, per_node),), time_limit_min=limit, submit_time=at(view.submit_time),
        start_time=at(view.start_time) if running and view.start_time is not None else None, end_time=None,
        comment="", admin_comment="",
    )
