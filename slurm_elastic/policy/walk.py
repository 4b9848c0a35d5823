"""Phase 2 of a cycle: pending jobs and grow intents in priority order, over one pool of free nodes.

Equal priority puts the pending job first ("grow only if no pending job with equal or higher priority could use
those nodes"). A pending job that waits for nodes (its Slurm reason is in ``pending_block_reasons``) reserves
the free nodes it could use, up to its node count, whether or not that is enough for it: Slurm would hold them
for it too. Pending extension jobs are ours, so they never compete, and the nodes they asked for are not free.

Shrink-to-admit (when a pending job still does not fit): nodes that metric shrinks give back anyway are claimed
first, then lower-priority units that allow it (``shrink_to_admit``, not protected, not paused) give back nodes
above their min in their shrink order, best victim first (lowest priority, lowest efficiency, most recently
grown), each only while its next node would fit the pending job once freed. If all of that is not enough, the
pending job is not blocked *only* by elastic surplus, and nobody shrinks for it.

A grow intent then takes free nodes that fit its GRES per node in its partition, keeping every partition's
``free_node_reserve``, within the account/QOS quotas on extension nodes and, with ``fair_share``, within its
account's weighted part of the partition's spare nodes. It may get fewer nodes than it wanted (the message
says why), or none (the hold says why: NO_FREE_NODES, PENDING_HIGHER_PRIORITY, RESERVE_KEPT, QUOTA_REACHED,
FAIR_SHARE_LIMIT).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import takewhile
from typing import Any, Generic, TypeVar

from slurm_elastic.directives.admin_comment import submitted_partitions
from slurm_elastic.policy.allocator import VictimHeap, grow_key, victim_limit
from slurm_elastic.policy.capacity import (
    FreeGres,
    Need,
    NodePool,
    Status,
    add_gres,
    fits,
    free_gres,
    is_planned_node,
    is_resumable_node,
    need_of,
)
from slurm_elastic.policy.fairshare import account_weight, split_spare
from slurm_elastic.policy.goodput_trade import plan_moves
from slurm_elastic.policy.goodput_trade import victim_key as goodput_victim_key
from slurm_elastic.policy.gpulimits import GpuLimitTracker
from slurm_elastic.policy.model import AdmitBasis, PolicyInput, ResizeRecord, admit_request
from slurm_elastic.policy.reasons import Action, Reason
from slurm_elastic.policy.signals import restart_gain_s
from slurm_elastic.policy.topology import grow_preference
from slurm_elastic.policy.work import NO_ACCOUNT, Context, UnitWork
from slurm_elastic.slurm.model import Job, Node


def victim_key(w: UnitWork, grow_rank: Mapping[datetime, int]) -> tuple[int, int, float, int, int]:
    """Lowest priority first, then lowest measured efficiency (unknown after known), then most recently grown
    (never grown last), then unit id."""
    eff = w.efficiency
    rank = grow_rank.get(w.last_grow) if w.last_grow is not None else None
    return (
        w.priority,
        0 if eff is not None else 1,
        eff if eff is not None else 0.0,
        -rank if rank is not None else 1,
        w.unit_id,
    )


def marginal_loss(w: UnitWork) -> float:
    """The share of its speed a unit loses per node taken: its efficiency (marginal with goodput, else
    utilization; unknown counts as 1) over its current nodes."""
    eff = w.efficiency if w.efficiency is not None else 1.0
    return eff / max(1, w.current)


def _exhausted(w: UnitWork) -> bool:
    """No node left to give back to pending jobs above its admit floor (``taken`` only grows during a walk: it
    stays so)."""
    return w.current - max(w.unit.min_nodes, w.admit_floor) - w.taken <= 0 or w.taken >= len(w.removal())


def service_key(w: UnitWork) -> tuple[float, float, int, int]:
    """victim_by_service: least marginal loss first (to two decimals, so that near-equal losses fall to the
    next key), then most attained service (GPU-seconds; unknown last), then lowest priority, then unit id."""
    attained = w.unit.attained_gpu_s
    return (round(marginal_loss(w), 2), -attained if attained is not None else 0.0, w.priority, w.unit_id)


def added_time_s(w: UnitWork, now: datetime) -> float | None:
    """victim_by_remaining: the seconds losing one node adds to the unit at linear scaling (remaining time by
    its time limit / (nodes - 1)); None when its time limit or start is unknown."""
    remaining = w.unit.job.remaining_seconds(now)
    if remaining is None:
        return None
    return max(0.0, remaining) / max(1, w.current - 1)


def remaining_key(w: UnitWork, now: datetime) -> tuple[int, float, int, int]:
    """victim_by_remaining: least added time first (unknown last), then lowest priority, then unit id."""
    added = added_time_s(w, now)
    return (0 if added is not None else 1, added if added is not None else 0.0, w.priority, w.unit_id)


class _NodeInfo:
    """Free GRES and partitions of any node of the snapshot (not only free ones), computed on demand."""

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        self._nodes = {n.name: n for n in nodes}
        self._free: dict[str, FreeGres] = {}

    def free(self, name: str) -> FreeGres | None:
        hit = self._free.get(name)
        if hit is None:
            node = self._nodes.get(name)
            if node is None:
                return None
            hit = self._free[name] = free_gres(node)
        return hit

    def node(self, name: str) -> Node | None:
        return self._nodes.get(name)

    def partitions(self, name: str) -> tuple[str, ...]:
        node = self._nodes.get(name)
        return node.partitions if node is not None else ()


_T = TypeVar("_T")


class _Live(Generic[_T]):
    """A list that is scanned from the front many times (once per pending job) and whose entries, once dead
    (``dead`` true), stay dead: a scan skips them through next-pointers with path halving, so the scans of a
    walk cost the live entries they visit, not the whole list each time (victims with no surplus left, nodes
    already claimed)."""

    def __init__(self, items: Sequence[_T], dead: Callable[[_T], bool]) -> None:
        self._items = items
        self._next = list(range(len(items) + 1))  # next[i]: no live entry in [i, next[i]); next[n] == n
        self._dead = dead

    def __iter__(self) -> Iterator[_T]:
        items, nxt, dead, n = self._items, self._next, self._dead, len(self._items)
        i = 0
        while True:
            while nxt[i] != i:
                nxt[i] = nxt[nxt[i]]
                i = nxt[i]
            if i >= n:
                return
            item = items[i]
            if dead(item):
                nxt[i] = i + 1
            else:
                yield item
            i += 1


def _need_text(need: Need) -> str:
    return ",".join(f"{n}:{t}:{c}" if t else f"{n}:{c}" for (n, t), c in need) or "no GRES"


@dataclass
class Walk:
    """One walk. Build it, call :meth:`run`; results land on the UnitWork objects."""

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

    def __post_init__(self) -> None:
        snap = self.inp.snapshot
        self.ext_ids = frozenset(e.job_id for u in self.inp.units for e in u.extensions)
        self.running_ids = frozenset(j.job_id for j in snap.jobs if j.is_running)
        taken: set[str] = set()  # never free, whatever the node's state says
        for unit in self.inp.units:
            taken.update(unit.job.nodes)
            held = 0
            for ext in unit.extensions:
                if ext.is_pending:
                    taken.update(ext.nodes)  # asked for by our own pending extension job
                    held += ext.node_count
                elif ext.is_running:
                    taken.update(ext.nodes)
                    held += len(ext.nodes)
            account, qos = unit.job.account or NO_ACCOUNT, self._ext_job(unit.job).qos or NO_ACCOUNT
            self.ext_by_account[account] = self.ext_by_account.get(account, 0) + held
            self.ext_by_qos[qos] = self.ext_by_qos.get(qos, 0) + held
            gpus = held * unit.job.gpus_per_node()
            self.ext_gpus_by_account[account] = self.ext_gpus_by_account.get(account, 0) + gpus
            self.ext_gpus_by_qos[qos] = self.ext_gpus_by_qos.get(qos, 0) + gpus
        by_part: dict[str, set[str]] = {}
        for j in snap.jobs:
            if j.is_running:
                by_part.setdefault(j.partition, set()).update(j.nodes)
        self.part_held = {p: len(n) for p, n in by_part.items()}
        self.pool = NodePool(snap.nodes, frozenset(taken))
        backoff = self.ctx.cfg.power_resume_backoff_s
        failed = {n for n, at in self.inp.power.resume_failed.items()
                  if (self.ctx.now - at).total_seconds() < backoff}
        self.cold = NodePool(snap.nodes, frozenset(taken) | failed, select=is_resumable_node)
        self.planned = NodePool(snap.nodes, frozenset(taken), select=is_planned_node)
        self.info = _NodeInfo(snap.nodes)
        self.gpu = GpuLimitTracker(self.inp.gpu_limits, snap.jobs, self.inp.units, self.inp.extension_qos)
        for node in snap.nodes:
            for part in node.partitions:
                if part not in self.reserves:
                    value = self.ctx.resolver.scope(part, None, None)["free_node_reserve"].value
                    assert isinstance(value, int)
                    self.reserves[part] = value
        for w in self.works:
            # Partitions may overlap (the same nodes in "train" and "serve"): a unit frees nodes for, and may
            # give nodes back to, every partition its nodes belong to, not only the one it was submitted to.
            parts = self.unit_parts[w.unit_id] = self._unit_partitions(w)
            if w.action is Action.SHRINK:
                w.taken = w.want
                for r in w.removal()[: w.want]:
                    for part in self.info.partitions(r.node) or (w.unit.job.partition,):
                        self.freeing.setdefault(part, []).append((r.node, w))
            if w.victim_ok:
                for part in parts:
                    self.victims.setdefault(part, []).append(w)
            elif w.tail_protected and w.unit.spec.shrink and w.settings is not None and w.settings.shrink_to_admit:
                self.tail_protected.append(w)
            if w.action is Action.GROW:
                part_d = self.demand.setdefault(w.unit.job.partition, {})
                account = w.unit.job.account or NO_ACCOUNT
                part_d[account] = part_d.get(account, 0) + w.want
        for part, lst in self.victims.items():
            # the allocator picks among the lower-priority victims by rho itself: priority order lets a scan stop
            lst.sort(key=(lambda v: (v.priority, v.unit_id)) if self.ctx.cfg.allocator else self._victim_order())
            self.live_victims[part] = _Live(lst, _exhausted)
        claimed = self.claimed  # not self: no reference cycle through the walk
        for part, pairs in self.freeing.items():
            self.live_freeing[part] = _Live(pairs, lambda pair: pair[0] in claimed)

    def _victim_order(self) -> Callable[[UnitWork], tuple[Any, ...]]:
        if self.ctx.cfg.victim_by_goodput:
            return goodput_victim_key
        if self.ctx.cfg.victim_by_remaining:
            now = self.ctx.now
            return lambda v: remaining_key(v, now)
        if self.ctx.cfg.victim_by_service:
            return service_key
        grown = sorted({w.last_grow for w in self.works if w.last_grow is not None})
        rank = {t: i for i, t in enumerate(grown)}
        return lambda v: victim_key(v, rank)

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

    def _unit_partitions(self, w: UnitWork) -> tuple[str, ...]:
        names = {w.unit.job.partition}
        for r in w.removal():
            names.update(self.info.partitions(r.node))
        return tuple(sorted(names))

    def run(self) -> None:
        self._reclaim()
        ext_ids = self.ext_ids
        block = self.ctx.cfg.pending_block_reasons
        events: list[tuple[tuple[float, ...], Job | UnitWork]] = []
        for job in self.inp.snapshot.jobs:
            if job.is_pending and job.job_id not in ext_ids and (job.state_reason or "None") in block:
                events.append(((-job.priority, 0, job.job_id), job))
                self.waiting_parts.update(p for p in job.partition.split(",") if p)
        # speedup_growth: those grows go by their saving among themselves, all after the pending jobs of priority
        # >= the lowest of them, so that they share only nodes no such pending job can use (the spare nodes)
        by_gain = [w for w in self.works if w.action is Action.GROW and not w.tail_regrow
                   and (w.gain_s is not None or w.plan_value is not None)]
        floor = min((w.priority for w in by_gain), default=0)
        for w in self.works:
            if w.action is not Action.GROW:
                continue
            if w.serving:  # serving grows outrank everything: pending jobs, regrows and training grows
                events.append(((-(1 << 62) - 1, 0, w.unit_id), w))
            elif w.tail_regrow:  # a tail_protection regrow goes first, ahead of pending jobs
                events.append(((-(1 << 62), 0, w.unit_id), w))
            elif w.plan_value is not None:  # allocator: by the objective, after the pending jobs like by_gain
                events.append(((-floor, 1, *grow_key(w)), w))
            elif w.gain_s is not None:
                events.append(((-floor, 1, -w.gain_s, w.unit_id), w))
            else:
                events.append(((-w.priority, 1, w.unit_id), w))
        events.sort(key=lambda e: e[0])
        for _, item in events:
            if isinstance(item, Job):
                self._pending(item)
            elif not item.admit_basis and not item.reclaim_taken:  # a unit giving nodes back does not grow
                self._grant(item)
                if (item.serving and len(item.granted) < item.want
                        and item.final in (None, Reason.NO_FREE_NODES, Reason.RESERVE_KEPT)):
                    self._serving_reclaim(item, item.want - len(item.granted))  # short of nodes, not of quota
        if self.ctx.cfg.goodput_moves:
            plan_moves(self.works, self._move_fits)

    def _move_fits(self, name: str, donor: UnitWork, receiver: UnitWork) -> bool:
        """goodput_moves: would node ``name`` of ``donor`` fit ``receiver`` (its partition, GRES) once freed, with
        no job waiting in that partition (it would take the node first: shrink-to-admit decides those)?"""
        part = receiver.unit.job.partition
        if part in self.waiting_parts:
            return False
        return self._helps(name, donor, {part}, receiver.need)

    # --- reserve reclaim ----------------------------------------------------------------------------------------

    def _frees_node(self, name: str, holder: UnitWork, part: str) -> bool:
        """Would node ``name`` become a free node of ``part`` once ``holder`` gives it back?"""
        node = self.info.node(name)
        if node is None or part not in node.partitions or not node.is_available:
            return False
        free = dict(add_gres(self.info.free(name) or (), holder.need))
        return free.get(("gpu", None), 0) >= node.gpus()

    def _reclaim(self) -> None:
        """Partitions below their reserve, with reclaim_reserve on: shrink units there (best victim first) by
        what is missing, counting nodes that metric shrinks give back anyway. Partial progress is kept: the
        reserve is restored over cycles, within the action cap."""
        for part in sorted(self.reserves):
            reserve = self.reserves[part]
            if not reserve or not self.ctx.resolver.scope(part, None, None)["reclaim_reserve"].value:
                continue
            deficit = reserve - self.pool.free_count(part)
            for name, holder in self.freeing.get(part, ()):
                if deficit <= 0:
                    break
                if name not in self.claimed and self._frees_node(name, holder, part):
                    self.claimed.add(name)
                    deficit -= 1
            if deficit <= 0:
                continue
            candidates = sorted((w for w in self.works if w.reclaim_ok and part in self.unit_parts[w.unit_id]),
                                key=self._victim_order())
            for w in candidates:
                if deficit <= 0:
                    break
                order = w.removal()
                k = 0
                while w.current - w.unit.min_nodes - w.taken - k > 0 and deficit > 0 and w.taken + k < len(order):
                    if not self._frees_node(order[w.taken + k].node, w, part):
                        break
                    k += 1
                    deficit -= 1
                w.taken += k
                w.reclaim_taken += k

    def _serving_reclaim(self, w: UnitWork, short: int) -> None:
        """A serving grow short of ``short`` nodes: claim what metric shrinks give back in its partition, then
        shrink training units (best victim first, whatever their priority) by their nodes above min that would
        become free nodes of the partition. The serving unit takes them on a later cycle, after the grace."""
        part = w.unit.job.partition
        room = self._quota_room(w)
        if room is not None:
            short = min(short, room)  # nodes the serving unit could not take anyway are left to training
        got = 0
        for name, holder in self.freeing.get(part, ()):
            if got >= short:
                break
            if name not in self.claimed and self._frees_node(name, holder, part):
                self.claimed.add(name)
                got += 1
        freed = got
        candidates = sorted((v for v in self.works if v.reclaim_ok and not v.serving
                             and part in self.unit_parts[v.unit_id]), key=self._victim_order())
        victims: list[str] = []
        for v in candidates:
            if got >= short:
                break
            order = v.removal()
            k = 0
            while v.current - v.unit.min_nodes - v.taken - k > 0 and got < short and v.taken + k < len(order):
                if not self._frees_node(order[v.taken + k].node, v, part):
                    break
                k += 1
                got += 1
            if k:
                v.taken += k
                v.reclaim_taken += k
                v.serving_for.append(w.unit_id)
                victims.append(f"{v.unit.job.display_id} ({k})")
        w.serving_reclaim = got
        if got:
            w.inputs["serving_reclaim_nodes"] = got
            parts = []
            if freed:
                parts.append(f"{freed} node(s) other shrinks give back")
            if victims:
                parts.append(f"{got - freed} from training job(s) {', '.join(victims)} above their min")
            w.message += f"; reclaiming {' and '.join(parts)}"

    def _quota_room(self, w: UnitWork) -> int | None:
        """Extension nodes the account/QOS quotas still allow ``w`` (None: no quota applies)."""
        s, job = w.settings, w.unit.job
        assert s is not None
        ext = self._ext_job(job)
        account, qos = job.account or NO_ACCOUNT, ext.qos or NO_ACCOUNT
        gpn = job.gpus_per_node()
        room: int | None = None
        for quota, held, size in (
            (s.max_extension_nodes_per_account, self.ext_by_account.get(account, 0), 1),
            (self._qos_quota(s.max_extension_nodes_per_qos, job, ext, "max_extension_nodes_per_qos"),
             self.ext_by_qos.get(qos, 0), 1),
            (s.max_extension_gpus_per_account, self.ext_gpus_by_account.get(account, 0), gpn),
            (self._qos_quota(s.max_extension_gpus_per_qos, job, ext, "max_extension_gpus_per_qos"),
             self.ext_gpus_by_qos.get(qos, 0), gpn),
        ):
            if quota < 0 or size <= 0:
                continue
            left = max(0, (quota - held) // size)
            room = left if room is None else min(room, left)
        return room

    # --- pending jobs -------------------------------------------------------------------------------------------

    def _pending(self, job: Job) -> None:
        if (not len(self.pool) and not len(self.cold) and not len(self.planned) and not self.victims
                and not self.tail_protected):
            return
        parts = tuple(p for p in job.partition.split(",") if p)
        need = need_of(job.gres_per_node)
        count = max(1, job.node_count)
        got = self.pool.take(parts, need, count, status=Status.RESERVED, holder=job.job_id)
        for name in got:
            for part in self.pool.partitions_of[name]:
                self.first_reserver.setdefault(part, job)
        if len(got) < count and len(self.planned):
            # Idle nodes Slurm's backfill set aside for a waiting job (IDLE+PLANNED): no grow may take them, and
            # they count toward this job's fit, so a shrink-to-admit frees only what is still missing.
            got += self.planned.take(parts, need, count - len(got), status=Status.RESERVED, holder=job.job_id)
        if len(got) < count and len(self.cold):  # Slurm would resume powered-down nodes for it as well
            resumed = self.cold.take(parts, need, count - len(got), status=Status.RESERVED, holder=job.job_id)
            for name in resumed:
                for part in self.cold.partitions_of[name]:
                    self.first_reserver.setdefault(part, job)
            got += resumed
        if len(got) >= count or not (self.victims or self.tail_protected):
            return
        if self._backing_off(job):
            return
        if self.tail_protected:
            self._note_spared(job, parts)
        if self.victims:
            self._admit(job, parts, need, count - len(got))

    def _backing_off(self, job: Job) -> bool:
        """Shrunk for ``job`` before and it still waits: Slurm chose otherwise. No further shrink for it until
        something changed (a job that held nodes of its partitions ended, or its request changed), and at
        most admit_backoff_s after the last one."""
        last = self.admit_at.get(job.job_id)
        if last is None or (self.ctx.now - last.at).total_seconds() >= self.ctx.cfg.admit_backoff_s:
            return False
        basis = last.admit_basis
        if basis is None:  # a journal entry from before bases were recorded: back off on time alone
            return True
        return basis.request == admit_request(job) and basis.holders <= self.running_ids

    def _admit_basis(self, job: Job, parts: set[str]) -> AdmitBasis:
        if self.holders_by_part is None:  # one pass over the running jobs per walk, not one per admit
            self.holders_by_part = {}
            for j in self.inp.snapshot.jobs:
                if j.is_running and j.job_id not in self.ext_ids:
                    for part in {p for n in j.nodes for p in self.info.partitions(n)}:
                        self.holders_by_part.setdefault(part, set()).add(j.job_id)
        key = frozenset(parts)
        holders = self.holders_memo.get(key)
        if holders is None:  # the same set for every job of these partitions: built once per walk
            holders = self.holders_memo[key] = frozenset().union(*(self.holders_by_part.get(p, ()) for p in parts))
        return AdmitBasis(job.job_id, admit_request(job), holders)

    def _helps(self, name: str, holder: UnitWork, parts: set[str], need: Need) -> bool:
        """Would node ``name`` fit the pending job once ``holder`` gives it back?"""
        free = self.info.free(name)
        if free is None or parts.isdisjoint(self.info.partitions(name)):
            return False
        return fits(add_gres(free, holder.need), need)

    def _admit(self, job: Job, parts: tuple[str, ...], need: Need, deficit: int) -> None:
        """Shrink lower-priority units just enough for ``job`` to fit, or change nothing if they can not."""
        memo = (parts, need)
        failed_at = self.failed_admits.get(memo)
        if failed_at is not None and deficit >= failed_at:
            return  # surplus only shrinks during a walk and later jobs have lower priority: still no fit
        part_set = set(parts)
        cfg = self.ctx.cfg
        by_service = cfg.victim_by_service or cfg.victim_by_remaining or cfg.victim_by_goodput  # not priority order
        claims: list[str] = []
        for part in parts:
            live_freeing = self.live_freeing.get(part)
            for name, holder in live_freeing if live_freeing is not None else ():
                if len(claims) >= deficit:
                    break
                if name not in self.claimed and name not in claims and self._helps(name, holder, part_set, need):
                    claims.append(name)
        still = deficit - len(claims)
        tentative: list[tuple[UnitWork, int]] = []
        seen: set[int] = set()  # a unit on nodes of several of the job's partitions is asked once
        if cfg.allocator and still > 0:
            tentative, still = self._fair_victims(job, part_set, parts, need, still)
        for part in parts if not cfg.allocator else ():
            live_victims = self.live_victims.get(part)
            for w in live_victims if live_victims is not None else ():
                if still <= 0 or (w.priority >= job.priority and not by_service):
                    break  # priority order: no lower-priority victim is left
                if w.unit_id in seen or w.priority >= job.priority:
                    continue
                seen.add(w.unit_id)
                surplus = w.current - max(w.unit.min_nodes, w.admit_floor) - w.taken
                order = w.removal()
                k = 0
                while k < surplus and still > 0 and w.taken + k < len(order):
                    if not self._helps(order[w.taken + k].node, w, part_set, need):
                        break
                    k += 1
                    still -= 1
                if k:
                    tentative.append((w, k))
        if still > 0:
            self.failed_admits[memo] = min(deficit, failed_at if failed_at is not None else deficit)
            return
        self.claimed.update(claims)
        if not tentative:
            return  # the nodes that metric shrinks give back anyway are enough
        basis = self._admit_basis(job, part_set)
        for w, k in tentative:
            if cfg.allocator and w.fairness is not None:
                w.inputs["rho_after_shrink"] = round(w.fairness.rho_at(w.current - w.taken - k), 3)
            elif cfg.victim_by_goodput:
                v = w.node_value
                w.inputs["victim_loss_s"] = None if v is None or v.loss_s is None else round(v.loss_s, 1)
            elif cfg.victim_by_remaining:
                added = added_time_s(w, self.ctx.now)
                w.inputs["victim_added_s"] = round(added, 1) if added is not None else None
            elif by_service:
                w.inputs["victim_marginal_loss"] = round(marginal_loss(w), 3)
            w.taken += k
            w.admit_taken += k
            w.admit_basis.append(basis)
            w.admit_priority = max(w.admit_priority, job.priority)

    def _fair_victims(self, job: Job, part_set: set[str], parts: tuple[str, ...], need: Need,
                      still: int) -> tuple[list[tuple[UnitWork, int]], int]:
        """allocator: the lower-priority victims' nodes, one at a time from the unit whose rho after the shrink
        would be lowest, none past max(fairness_max_rho, the waiting job's own rho) (policy/allocator.py).
        Returns the picks and how many nodes are still missing (all of ``still`` when they are not enough)."""
        max_rho = victim_limit(job, self.ctx.now, self.ctx.cfg.fairness_max_rho)

        def helps(w: UnitWork, k: int) -> bool:
            return self._helps(w.removal()[w.taken + k].node, w, part_set, need)

        if len(parts) == 1:  # the common case: one heap per partition, kept across the walk
            heap = self.fair_heaps.get(parts[0])
            if heap is None:
                heap = self.fair_heaps[parts[0]] = VictimHeap(self.victims.get(parts[0], ()))
        else:  # a job of several partitions: a heap of their lower-priority victims, for this job alone
            heap = VictimHeap(w for part in parts for w in takewhile(
                lambda v: v.priority < job.priority, self.live_victims.get(part, ())))
        found = heap.take(job.priority, still, max_rho, helps)
        return (found, 0) if found is not None else ([], still)

    def _note_spared(self, job: Job, parts: tuple[str, ...]) -> None:
        """tail_protection: the lower-priority units with surplus that were spared for ``job`` because they ran
        shrunk too long (their hold says TAIL_PROTECTED)."""
        left: list[UnitWork] = []
        for w in self.tail_protected:
            if (w.priority < job.priority and w.current - w.unit.min_nodes - w.taken > 0
                    and not set(parts).isdisjoint(self.unit_parts[w.unit_id])):
                w.spared_for = (job.job_id, job.priority)
            else:
                left.append(w)
        self.tail_protected = left

    # --- grow intents ---------------------------------------------------------------------------------------------

    def _refuse(self, w: UnitWork, reason: Reason, why: str) -> None:
        w.final = reason
        w.message += f", but {why}"

    def _grow_partition(self, w: UnitWork, power_resume: bool) -> str:
        """Where the grow's extension job goes: the leader's partition when a free node of it fits, else another
        partition the job was submitted to (``-p train,cold``, kept in its admin_comment) whose free node fits,
        else one with a powered-down node that fits (power_resume); else the leader's (its refusal names it)."""
        job = w.unit.job
        others = [p for p in submitted_partitions(job.admin_comment) if p != job.partition]
        if not others:
            return job.partition
        parts = (job.partition, *others)
        for pool in (self.pool, self.cold) if power_resume else (self.pool,):
            for part in parts:
                if pool.count_fit(part, w.need) > 0:
                    return part
        return job.partition

    def _grant(self, w: UnitWork) -> None:
        job, pool = w.unit.job, self.pool
        s = w.settings
        assert s is not None
        part = self._grow_partition(w, s.power_resume)
        if part != job.partition:
            w.grow_partition = part
            w.inputs["grow_partition"] = part
        fitting = pool.count_fit(part, w.need)
        cold_fit = self.cold.count_fit(part, w.need) if s.power_resume else 0
        if fitting == 0 and cold_fit == 0:
            if pool.count_fit(part, w.need, Status.RESERVED) > 0 or (
                    s.power_resume and self.cold.count_fit(part, w.need, Status.RESERVED) > 0):
                holder = self.first_reserver.get(part)
                who = f" (e.g. job {holder.job_id}, priority {holder.priority})" if holder is not None else ""
                self._refuse(w, Reason.PENDING_HIGHER_PRIORITY,
                             f"the free nodes that fit are held for pending jobs of priority >= {job.priority}{who}")
            elif pool.count_fit(part, w.need, Status.GRANTED) > 0:
                self._refuse(w, Reason.NO_FREE_NODES, f"the free nodes of partition {part} that fit "
                             f"({_need_text(w.need)}) went to higher-priority grows")
            else:
                self._refuse(w, Reason.NO_FREE_NODES,
                             f"no free node of partition {part} fits {_need_text(w.need)} per node")
            return
        want = w.want
        limits: list[str] = []
        ext = self._ext_job(job)  # what Slurm checks the extension job against
        account, qos = job.account or NO_ACCOUNT, ext.qos or NO_ACCOUNT
        gpn = job.gpus_per_node()
        for key, label, quota, held, size in (
            ("nodes_per_account", f"account {account}", s.max_extension_nodes_per_account,
             self.ext_by_account.get(account, 0), 1),
            ("nodes_per_qos", f"QOS {qos}", self._qos_quota(s.max_extension_nodes_per_qos, job, ext,
                                                           "max_extension_nodes_per_qos"),
             self.ext_by_qos.get(qos, 0), 1),
            ("gpus_per_account", f"account {account}", s.max_extension_gpus_per_account,
             self.ext_gpus_by_account.get(account, 0), gpn),
            ("gpus_per_qos", f"QOS {qos}", self._qos_quota(s.max_extension_gpus_per_qos, job, ext,
                                                          "max_extension_gpus_per_qos"),
             self.ext_gpus_by_qos.get(qos, 0), gpn),
        ):
            if quota < 0 or size <= 0:
                continue
            gpus = key.startswith("gpus")
            left = (quota - held) // size  # whole nodes the quota leaves
            w.inputs[f"{key.removeprefix('nodes_per_').replace('_per_', '_')}_quota_left"] = quota - held
            if left <= 0:
                per_node = f" ({size} per node)" if gpus and held < quota else ""
                self._refuse(w, Reason.QUOTA_REACHED, f"{label} holds {held} extension {'GPUs' if gpus else 'nodes'}"
                             f"{per_node} >= max_extension_{key} {quota}")
                return
            if left < want:
                want = left
                limits.append(f"{label} {'GPU ' if gpus else ''}quota")
        cap_pct = s.growth_cap_percent
        if cap_pct < 100:
            total = len(self.inp.snapshot.nodes)
            room = total * cap_pct // 100 - self.part_held.get(part, 0)
            w.inputs["growth_cap_nodes_left"] = room
            if room <= 0:
                self._refuse(w, Reason.QUOTA_REACHED, f"partition {part}'s jobs hold "
                             f"{self.part_held.get(part, 0)} of the cluster's {total} nodes >= growth_cap_percent "
                             f"{cap_pct}%")
                return
            if room < want:
                want = room
                limits.append(f"growth_cap_percent {cap_pct}%")
        if self.gpu.active and gpn > 0:
            allowed, why = self.gpu.cap(ext, gpn, want, w.inputs)
            if allowed <= 0:
                self._refuse(w, Reason.QUOTA_REACHED, f"{why}: Slurm would leave an extension job pending")
                return
            if allowed < want:
                want = allowed
                limits.append(why)
        if s.fair_share:
            if part not in self.fair:
                spare = max(0, pool.free_count(part) - self.reserves.get(part, 0))
                if s.power_resume:
                    spare += self.cold.free_count(part)
                self.fair[part] = split_spare(spare, self.demand.get(part, {}), self.inp.account_shares)
            left = self.fair[part].get(account, 0)
            w.inputs["fair_share_nodes_left"] = left
            w.inputs["account_weight"] = round(account_weight(self.inp.account_shares, account), 6)
            w.inputs["account_weight.source"] = "account_shares" if account in self.inp.account_shares else "default"
            if left <= 0:
                self._refuse(w, Reason.FAIR_SHARE_LIMIT,
                             f"account {account} has used its fair share of partition {part}'s spare nodes")
                return
            if left < want:
                want = left
                limits.append(f"account {account} fair share")
        reserve = self.reserves if any(self.reserves.values()) else None
        prefer = grow_preference(w.unit, self.inp.snapshot.leaf_switch)  # its own leaf switch first (topology)
        got = pool.take([part], w.need, want, status=Status.GRANTED, reserve=reserve, prefer=prefer) if fitting else []
        if not got and cold_fit:
            # Powered-on free nodes first; only a grow that got none of them resumes nodes, so that one extension
            # job never keeps powered-on nodes waiting for a boot.
            got = w.resumed = self._resume(w, part, want)
            if not got:
                return
        elif not got:
            self._refuse(w, Reason.RESERVE_KEPT, f"growing would leave fewer than free_node_reserve "
                         f"{self.reserves.get(part, 0)} free nodes in partition {part}")
            return
        if not w.resumed and len(got) < want:
            limits.append("free_node_reserve" if len(got) < min(want, fitting) else "free nodes")
        if w.resumed:
            w.message += f"; +{len(got)} powered-down node(s) for Slurm to resume: {','.join(got)}"
        elif len(got) < w.want:
            w.message += f"; +{len(got)} of {w.want} wanted, limited by {' and '.join(limits)}: {','.join(got)}"
        else:
            w.message += f"; +{len(got)} node(s): {','.join(got)}"
        w.granted = got
        self.ext_by_account[account] = self.ext_by_account.get(account, 0) + len(got)
        self.ext_by_qos[qos] = self.ext_by_qos.get(qos, 0) + len(got)
        self.ext_gpus_by_account[account] = self.ext_gpus_by_account.get(account, 0) + len(got) * gpn
        self.ext_gpus_by_qos[qos] = self.ext_gpus_by_qos.get(qos, 0) + len(got) * gpn
        self.part_held[part] = self.part_held.get(part, 0) + len(got)
        self.gpu.commit(ext, len(got) * gpn)
        if s.fair_share:
            self.fair[part][account] -= len(got)

    def _resume(self, w: UnitWork, part: str, want: int) -> list[str]:
        """power_resume: take up to ``want`` powered-down nodes of ``part`` when the expected gain over the
        remaining time pays for their resume (the slowest of them: they boot together) plus a restart; refuse
        with POWER_RESUME_COST otherwise. The resume time is the nodes' measured one, else power_resume_s,
        bounded by Slurm's ResumeTimeout."""
        s = w.settings
        assert s is not None
        names = self.cold.peek(part, w.need, want)
        power = self.inp.power
        estimates: list[float] = []
        measured = True
        for name in names:
            value = power.resume_s.get(name)
            if value is None:
                measured = False
                value = float(s.power_resume_s)
            estimates.append(value)
        resume = max(estimates, default=0.0)
        bounded = power.resume_timeout_s is not None and resume > power.resume_timeout_s
        if bounded and power.resume_timeout_s is not None:
            resume = power.resume_timeout_s
        util = self.ctx.utilization.get(w.unit_id)
        restart = util.restart_s if util is not None and util.restart_s is not None else float(s.restart_cost_s)
        remaining = w.unit.job.remaining_seconds(self.ctx.now)
        eff = w.efficiency if w.efficiency is not None else 1.0
        cost = resume + restart
        gain = restart_gain_s(remaining, cost, eff, len(names), w.current)
        source = "ResumeTimeout" if bounded else ("measured" if measured else s.source("power_resume_s"))
        w.inputs.update({
            "resume_nodes": ",".join(names),
            "resume_s": round(resume, 1),
            "resume_s.source": source,
            "resume_restart_cost_s": round(restart, 1),
            "resume_gain_s": None if gain == float("inf") else round(gain, 1),
        })
        if gain <= cost:
            self._refuse(w, Reason.POWER_RESUME_COST, f"no powered-on free node fits, and resuming {','.join(names)} "
                                f"(~{resume:.0f}s, {source}) plus a {restart:.0f}s restart costs {cost:.0f}s "
                                f">= the expected gain {gain:.0f}s over the remaining {remaining or 0:.0f}s")
            return []
        return self.cold.take([part], w.need, len(names), status=Status.GRANTED)
