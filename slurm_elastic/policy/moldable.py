"""Moldable start: a waiting elastic job that cannot start at its request starts now on fewer whole nodes.

One rule, two callers. :func:`plan_molds` is the rule: in priority order, a candidate whose request is above the
free whole nodes of its pool, and whose ``#ELASTIC`` min fits them, is molded to the free whole nodes (at most
its request); its time limit grows by request / size (as a shrink's does, policy/shrink.py) and the nodes are
gone for the candidates after it. The simulator (sim/engine.py) calls it after its base scheduler; the
controller calls :func:`decide_molds`, which picks the candidates and counts the free nodes from a Slurm
snapshot, and the actuator reshapes the job with ``scontrol update NumNodes=<size>-<request>`` (Slurm starts a
reshaped waiting job on fewer nodes: docs/slurm-facts.md). The unit keeps its request as its max, so the policy
grows it back like any other unit.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Protocol, cast

from slurm_elastic.directives.spec import ElasticSpec
from slurm_elastic.policy.capacity import NodePool, Status, is_free_node, is_planned_node, need_of
from slurm_elastic.policy.config import PolicyConfig, SettingsResolver
from slurm_elastic.policy.model import Scalar
from slurm_elastic.policy.reasons import Reason
from slurm_elastic.policy.shrink import time_limit_extension_s
from slurm_elastic.slurm.model import ClusterSnapshot, Job, Node

#: Slurm's "start it now" state reasons are counted, never "None" (not looked at by the scheduler yet).
_UNSCHEDULED = "None"


@dataclass(frozen=True)
class MoldCandidate:
    """A waiting elastic job, as the rule sees it.

    ``request_nodes``: the node count at which it fits as asked (the base scheduler's case, never molded);
    ``cap_nodes``: the most whole nodes a molded start takes (the controller: the request; the simulator, whose
    jobs ask for GPUs: the whole nodes in its GPU count). ``time_limit_s`` is its time limit (None: none).
    """

    job_id: int
    display_id: str
    pool: str
    request_nodes: int
    cap_nodes: int
    min_nodes: int
    request_gpus: int
    gpus_per_node: int
    time_limit_s: float | None = None
    max_extension_s: int | None = None  # None: the time limit scales without a cap (the simulator)


@dataclass(frozen=True)
class Mold:
    """Start ``candidate`` now on ``nodes`` whole nodes (fewer than it asked for, at least its min)."""

    candidate: MoldCandidate
    nodes: int
    free_nodes: int
    #: the time limit's factor (request GPUs / molded GPUs) and, for a limit in whole minutes, the seconds added
    time_limit_factor: float
    time_limit_add_s: int
    message: str
    inputs: Mapping[str, Scalar] = field(default_factory=dict, hash=False)
    reason: Reason = Reason.MOLDABLE_START


class FreeNodes(Protocol):
    """Whole free nodes as the caller counts them; ``take`` marks nodes gone for the candidates after."""

    def free(self, c: MoldCandidate) -> int: ...
    def take(self, c: MoldCandidate, nodes: int) -> None: ...


#: Seconds until a candidate's request would fit as asked, or None when that is not known.
WaitEstimate = Callable[[MoldCandidate], "float | None"]


def slower_than_waiting(c: MoldCandidate, nodes: int, wait_s: float) -> bool:
    """``mold_only_if_faster``: would starting now on ``nodes`` finish later than waiting ``wait_s`` for the
    request? Its run at the request is its time limit; molded, it takes request / size as long (linear scaling,
    as the time limit's extension assumes), before any grow back."""
    if c.time_limit_s is None or nodes <= 0 or c.gpus_per_node <= 0:
        return False
    molded = c.time_limit_s * c.request_gpus / (nodes * c.gpus_per_node)
    return molded > wait_s + c.time_limit_s


def plan_molds(candidates: Sequence[MoldCandidate], free: FreeNodes,
               wait_s: WaitEstimate | None = None) -> list[Mold]:
    """The rule: the molds, in the order of ``candidates`` (priority order). With ``wait_s``
    (``mold_only_if_faster``), a candidate is molded only when starting now smaller finishes no later than
    waiting for its request would (:func:`slower_than_waiting`); one whose wait is unknown is molded as before."""
    molds: list[Mold] = []
    for c in candidates:
        if c.request_nodes <= 1:
            continue  # one node or less: nothing to start smaller
        available = free.free(c)
        if available < 1 or available < c.min_nodes:
            continue
        nodes = min(available, c.cap_nodes)
        if nodes >= c.request_nodes or nodes < c.min_nodes:
            continue  # fits as asked: the scheduler's call, not ours
        if wait_s is not None:
            wait = wait_s(c)
            if wait is not None and slower_than_waiting(c, nodes, wait):
                continue  # its request frees up soon enough: a rigid start finishes first
        factor = c.request_gpus / (nodes * c.gpus_per_node)
        add_s = 0
        if c.time_limit_s is not None:
            cap = (1 << 62) if c.max_extension_s is None else c.max_extension_s
            add_s = time_limit_extension_s(c.time_limit_s, c.request_gpus, nodes * c.gpus_per_node, cap)
        free.take(c, nodes)
        molds.append(Mold(c, nodes, available, factor, add_s, _message(c, nodes, available, add_s),
                          MappingProxyType(_inputs(c, nodes, available, factor, add_s))))
    return molds


def _message(c: MoldCandidate, nodes: int, available: int, add_s: int) -> str:
    pool = f" in {c.pool}" if c.pool else ""
    msg = (f"starts now on {nodes} of its {c.request_nodes} requested node(s): {available} whole node(s) free"
           f"{pool}, min {c.min_nodes}; keeps {c.request_nodes} as its max and grows back")
    if add_s > 0 and c.time_limit_s is not None:
        msg += (f"; time limit +{add_s // 60}min: {c.time_limit_s:.0f}s x ({c.request_gpus}/"
                f"{nodes * c.gpus_per_node} GPUs - 1)")
    return msg


def _inputs(c: MoldCandidate, nodes: int, available: int, factor: float, add_s: int) -> dict[str, Scalar]:
    return {"request_nodes": c.request_nodes, "molded_nodes": nodes, "min_nodes": c.min_nodes,
            "free_whole_nodes": available, "time_limit_s": c.time_limit_s, "time_limit_factor": round(factor, 4),
            "time_limit_add_s": add_s, "max_time_limit_extension_s": c.max_extension_s}


# --- the controller's caller ---------------------------------------------------------------------------------


@dataclass
class _SnapshotFree:
    """Free whole nodes of the job's partition that fit its GRES per node (policy/capacity.py's NodePool)."""

    pool: NodePool
    jobs: Mapping[int, Job]

    def free(self, c: MoldCandidate) -> int:
        return self.pool.count_fit(c.pool, need_of(self.jobs[c.job_id].gres_per_node))

    def take(self, c: MoldCandidate, nodes: int) -> None:
        self.pool.take([c.pool], need_of(self.jobs[c.job_id].gres_per_node), nodes, status=Status.GRANTED)


def mold_scope(snapshot: ClusterSnapshot, cfg: PolicyConfig) -> list[Job]:
    """The waiting jobs the rule may look at, before their directives are read (that is I/O, the caller's):
    pending on Resources or Priority (``pending_block_reasons``), no het component, more than one node, and
    ``moldable_start`` on for its partition, account and QOS. The caller drops its own extension jobs."""
    resolver = SettingsResolver(cfg)
    blocking = cfg.pending_block_reasons - {_UNSCHEDULED}
    return [job for job in snapshot.jobs
            if job.is_pending and job.het_job_id is None and job.node_count > 1
            and (job.state_reason or _UNSCHEDULED) in blocking
            and resolver.scope(job.partition, job.account, job.qos)["moldable_start"].value]


def start_floors(snapshot: ClusterSnapshot, cfg: PolicyConfig,
                 floor_of: Callable[[Job], tuple[int, int] | None]) -> dict[int, int]:
    """``PolicyInput.pending_min_nodes``: the fewest whole nodes each waiting job of :func:`mold_scope` may
    start on, so that the round plan (policy/plan.py) lets it in at a share. ``floor_of(job)`` is the job's
    ``(min_nodes, cap_nodes)`` (None: not molded, it enters at its request): the controller's from its
    ``#ELASTIC`` directives and its request, the simulator's from the trace job's min and the whole nodes in its
    GPU count. The floor is its min, at least 1, at most its cap; a job with no whole node to its cap is left out.
    The one function both the controller and the simulator call (tests/unit/test_policy_input_paths_facts.py)."""
    floors: dict[int, int] = {}
    for job in mold_scope(snapshot, cfg):
        got = floor_of(job)
        if got is not None and got[1] >= 1:
            floors[job.job_id] = min(max(1, got[0]), got[1])
    return floors


def decide_molds(snapshot: ClusterSnapshot, pending: Sequence[tuple[Job, ElasticSpec]], cfg: PolicyConfig, *,
                 taken_nodes: Collection[str] = (), skip: Collection[int] = ()) -> list[Mold]:
    """The controller's molds: ``pending`` are waiting jobs with their elastic spec (those of
    :func:`mold_scope` count); ``taken_nodes`` the free nodes this cycle's grows (or waiting extension jobs)
    already take; ``skip`` jobs not to mold (molded before, or being admitted by a shrink). A job whose spec
    forbids growth (``--no-grow``) is left alone: it would stay small. Priority order, then submit time."""
    resolver = SettingsResolver(cfg)
    allowed = {job.job_id for job in mold_scope(snapshot, cfg)}
    jobs: dict[int, Job] = {}
    candidates: list[tuple[tuple[int, float, int], MoldCandidate]] = []
    for job, spec in pending:
        if job.job_id not in allowed or job.job_id in skip or not spec.grow or job.node_count <= spec.min_nodes:
            continue
        scope = resolver.scope(job.partition, job.account, job.qos)
        extend = bool(scope["extend_time_limit_on_shrink"].value)
        cap = cast(int, scope["max_time_limit_extension_s"].value)
        gpn = max(1, job.gpus_per_node())
        jobs[job.job_id] = job
        c = MoldCandidate(
            job.job_id, job.display_id, job.partition, job.node_count, job.node_count, spec.min_nodes,
            job.node_count * gpn, gpn,
            time_limit_s=None if job.time_limit_min is None or not extend else job.time_limit_min * 60.0,
            max_extension_s=cap)
        submitted = job.submit_time.timestamp() if job.submit_time is not None else 0.0
        candidates.append(((-job.priority, submitted, job.job_id), c))
    if not candidates:
        return []
    pool = NodePool(snapshot.nodes, exclude=frozenset(taken_nodes), select=_free_or_planned)
    ordered = [c for _, c in sorted(candidates, key=lambda kc: kc[0])]
    free = _SnapshotFree(pool, jobs)
    gated = {c.job_id for c in ordered if resolver.scope(jobs[c.job_id].partition, jobs[c.job_id].account,
                                                          jobs[c.job_id].qos)["mold_only_if_faster"].value}
    return plan_molds(ordered, free, _snapshot_wait(snapshot, free, gated) if gated else None)


def _snapshot_wait(snapshot: ClusterSnapshot, free: _SnapshotFree, gated: Collection[int]) -> WaitEstimate:
    """mold_only_if_faster for the controller: seconds until a candidate's request would fit in its partition,
    from the running jobs there ending at their expected end (Slurm's EndTime, else start + time limit), each
    giving back its nodes; None for a candidate the key is off for, or whose request never fits that way."""
    now = snapshot.taken_at
    by_part: dict[str, list[tuple[float, int]]] = {}
    for job in snapshot.jobs:
        if not job.is_running or not job.nodes:
            continue
        end = job.end_time
        if end is None and job.start_time is not None and job.time_limit_min is not None:
            end = job.start_time + timedelta(minutes=job.time_limit_min)
        if end is None:
            continue
        for part in {p for n in job.nodes for p in _partitions(snapshot, n)}:
            held = sum(1 for n in job.nodes if part in _partitions(snapshot, n))
            by_part.setdefault(part, []).append((max(0.0, (end - now).total_seconds()), held))
    for ends in by_part.values():
        ends.sort()

    def wait(c: MoldCandidate) -> float | None:
        if c.job_id not in gated:
            return None
        have = free.free(c)
        for left, nodes in by_part.get(c.pool, ()):
            if have >= c.request_nodes:
                break
            have += nodes
            if have >= c.request_nodes:
                return left
        return 0.0 if have >= c.request_nodes else None

    return wait


def _partitions(snapshot: ClusterSnapshot, name: str) -> tuple[str, ...]:
    node = snapshot.node(name)
    return node.partitions if node is not None else ()


def _free_or_planned(node: Node) -> bool:
    """A free node, or an idle one Slurm's backfill has PLANNED for a waiting job. Reshaped, the job is planned
    again, on those nodes or not: Slurm decides, as it does for any start."""
    return is_free_node(node) or is_planned_node(node)


# --- the simulator's caller ------------------------------------------------------------------------------------


@dataclass
class CountedFree:
    """One pool of whole free nodes, as a count (the simulator: free GPUs // GPUs per node)."""

    count: Callable[[], int]
    taken: int = 0

    def free(self, c: MoldCandidate) -> int:
        return self.count() - self.taken

    def take(self, c: MoldCandidate, nodes: int) -> None:
        self.taken += nodes
