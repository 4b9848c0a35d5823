"""The walk's state (policy/walk.py): the node pools, reserves, victims, quotas held and what was claimed, built
once per cycle; the steps of the walk (walk_pending.py, walk_grant.py, walk.py) read and change it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from slurm_elastic.policy.allocator import VictimHeap
from slurm_elastic.policy.capacity import (
    Need,
    NodePool,
)
from slurm_elastic.policy.gpulimits import GpuLimitTracker
from slurm_elastic.policy.model import PolicyInput, ResizeRecord
from slurm_elastic.policy.walk_keys import _Live, _NodeInfo
from slurm_elastic.policy.work import Context, UnitWork
from slurm_elastic.slurm.model import Job


@dataclass
class WalkState:
    """One walk's state (see policy/walk.py)."""

    inp: PolicyInput
    ctx: Context
    works: list[UnitWork]
    admit_at: Mapping[int, ResizeRecord]  # pending job -> the latest shrink-to-admit for it
    pool: NodePool = field(init=False)
    cold: NodePool = field(init=False)  # powered-down nodes Slurm would resume (power_resume), used after pool
    planned: NodePool = field(init=False)  # idle nodes Slurm planned for a waiting job: waiting jobs' only
    info: _NodeInfo = field(init=False)
    reserves: dict[str, int] = field(default_factory=dict)
    victims: dict[str, list[UnitWork]] = field(default_factory=dict)  # partition -> best victim first
    freeing: dict[str, list[tuple[str, UnitWork]]] = field(default_factory=dict)  # given back by metric shrinks
    claimed: set[str] = field(default_factory=set)
    failed_admits: dict[tuple[tuple[str, ...], Need], int] = field(default_factory=dict)
    ext_by_account: dict[str, int] = field(default_factory=dict)
    ext_by_qos: dict[str, int] = field(default_factory=dict)
    ext_gpus_by_account: dict[str, int] = field(default_factory=dict)
    ext_gpus_by_qos: dict[str, int] = field(default_factory=dict)
    part_held: dict[str, int] = field(default_factory=dict)  # partition -> nodes its running jobs hold
    unit_parts: dict[int, tuple[str, ...]] = field(default_factory=dict)  # unit -> partitions of its nodes
    demand: dict[str, dict[str, int]] = field(default_factory=dict)  # partition -> account -> nodes wanted
    fair: dict[str, dict[str, int]] = field(default_factory=dict)  # partition -> account -> nodes left
    first_reserver: dict[str, Job] = field(default_factory=dict)
    gpu: GpuLimitTracker = field(init=False)  # Slurm's GPU limits (GrpTRES...) as quotas: policy/gpulimits.py
    ext_ids: frozenset[int] = field(init=False)  # the units' extension jobs
    running_ids: frozenset[int] = field(init=False)
    tail_protected: list[UnitWork] = field(default_factory=list)  # would be victims but for tail_protection
    holders_by_part: dict[str, set[int]] | None = None  # partition -> running jobs on its nodes (on first admit)
    holders_memo: dict[frozenset[str], frozenset[int]] = field(default_factory=dict)  # partitions -> holders
    live_victims: dict[str, _Live[UnitWork]] = field(default_factory=dict)  # victims with surplus left
    live_freeing: dict[str, _Live[tuple[str, UnitWork]]] = field(default_factory=dict)  # not claimed yet
    waiting_parts: set[str] = field(default_factory=set)  # partitions with a pending job waiting for nodes
    fair_heaps: dict[str, VictimHeap] = field(default_factory=dict)  # allocator: partition -> its victims by rho
    shares: dict[int, int] = field(default_factory=dict)  # allocator: waiting job -> its share (policy/plan.py)


    def _ext_job(self, leader: Job) -> Job:
        """The leader as its extension jobs look to Slurm's limits: same user and account, the extension QOS."""
        q = self.inp.extension_qos
        return leader if not q or q == leader.qos else replace(leader, qos=q)

    def _qos_quota(self, resolved: int, leader: Job, ext: Job, key: str) -> int:
        """A per-QOS quota of the QOS the extension runs in (the unit's own value otherwise)."""
        if ext.qos == leader.qos:
            return resolved
        value = self.ctx.resolver.scope(leader.partition, leader.account, ext.qos)[key].value
        assert isinstance(value, int)
        return value
