"""Working state of one decide() call: per-unit scratch values and the shared context. Never returned."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from slurm_elastic.policy.capacity import Need
from slurm_elastic.policy.config import PolicyConfig, SettingsResolver, UnitSettings
from slurm_elastic.policy.model import AdmitBasis, ElasticUnit, JobUtilization, Scalar, ServingLoad
from slurm_elastic.policy.reasons import Action, Basis, Reason
from slurm_elastic.policy.shrink import Removable, removal_order

if TYPE_CHECKING:
    from slurm_elastic.policy.fairness import Fairness

NO_ACCOUNT = "(none)"


@dataclass(frozen=True)
class NodeValue:
    """What a unit's last node is worth: how many times slower it runs without it, and the seconds that costs."""

    slowdown: float
    source: str  # "goodput model", "throughput" or "utilization model"
    loss_s: float | None  # None without a time limit
    restart_s: float


@dataclass
class UnitWork:
    """Mutable working state of one unit during one decide() call."""

    unit: ElasticUnit
    settings: UnitSettings | None
    current: int
    need: Need
    inputs: dict[str, Scalar]
    action: Action = Action.HOLD
    reason: Reason = Reason.IN_BAND
    basis: Basis = Basis.NONE
    message: str = ""
    want: int = 0  # nodes to add (grow) or remove (shrink)
    paused_by: str | None = None
    victim_ok: bool = False  # may shrink to admit a pending job
    admit_floor: int = 0  # fewest nodes it keeps when shrunk to admit (admit_keep_percent, at least its min)
    reclaim_ok: bool = False  # may shrink to restore its partition's reserve
    efficiency: float | None = None
    last_grow: datetime | None = None
    taken: int = 0  # nodes committed to removal
    admit_taken: int = 0
    admit_basis: list[AdmitBasis] = field(default_factory=list)  # one per pending job it gives nodes to
    admit_priority: int = 0
    reclaim_taken: int = 0
    order: list[Removable] | None = None
    granted: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)  # the powered-down ones among granted (power_resume)
    final: Reason | None = None  # hold reason set by the walk
    tail_protected: bool = False  # tail_protection: shrunk too long, no longer a victim
    tail_regrow: bool = False  # its grow intent is a SHRUNK_TOO_LONG regrow (walked first)
    molded_regrow: bool = False  # its grow intent is a MOLDED_REGROW (policy/regrow.py)
    spared_for: tuple[int, int] | None = None  # (pending job, priority) it would have been shrunk for
    serving: bool = False  # a serving unit: its grows go first and may reclaim training surplus
    serving_for: list[int] = field(default_factory=list)  # serving units it gives nodes back to
    serving_reclaim: int = 0  # nodes reclaimed from training for this serving unit's grow
    gain_s: float | None = None  # speedup_growth: net seconds its grow saves (ranks grows among themselves)
    node_value: NodeValue | None = None  # victim_by_goodput / goodput_moves: what its last node is worth
    grow_partition: str | None = None  # the partition a grow's extension job goes to (None: the leader's)
    move_to: int | None = None  # goodput_moves: the unit it gives a node to
    moved_from: int | None = None  # goodput_moves: the unit that gives it a node
    fairness: Fairness | None = None  # allocator: finish-time fairness (policy/fairness.py)
    fair_protected: bool = False  # allocator: rho > 1, never a victim, first for spare nodes
    plan_value: float | None = None  # allocator: its grow's gain in the fairness objective (ranks grows)

    @property
    def unit_id(self) -> int:
        return self.unit.unit_id

    @property
    def priority(self) -> int:
        return self.unit.job.priority

    def hold(self, reason: Reason, message: str, basis: Basis = Basis.NONE) -> UnitWork:
        self.action, self.reason, self.message, self.basis, self.want = Action.HOLD, reason, message, basis, 0
        return self

    def intend(self, action: Action, reason: Reason, message: str, basis: Basis, want: int) -> UnitWork:
        self.action, self.reason, self.message, self.basis, self.want = action, reason, message, basis, want
        return self

    def removal(self) -> list[Removable]:
        if self.order is None:
            self.order = removal_order(self.unit)
        return self.order


@dataclass
class Context:
    """What every phase reads: config, time, resolver and the history indexes."""

    cfg: PolicyConfig
    now: datetime
    resolver: SettingsResolver
    utilization: Mapping[int, JobUtilization]
    last_resize: dict[int, datetime]
    last_grow: dict[int, datetime]
    paused_jobs: frozenset[int]
    last_admit_victim: dict[int, datetime] = field(default_factory=dict)  # unit -> its last shrink-to-admit
    serving: Mapping[int, ServingLoad] = field(default_factory=dict)
    leaf_switch: Mapping[str, str] = field(default_factory=dict)  # node -> leaf switch (topology/tree); {}: none
    #: free node -> its partitions, for the cross-switch charge of a grow (policy/topology.py); {} without a topology
    free_nodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
