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

The steps live in rooms of their own: the state (walk_state.py), pending jobs and shrink-to-admit
(walk_pending.py), grow intents (walk_grant.py), victim orders and small containers (walk_keys.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slurm_elastic.policy.allocator import grow_key
from slurm_elastic.policy.capacity import NodePool, add_gres, is_planned_node, is_resumable_node
from slurm_elastic.policy.goodput_trade import plan_moves
from slurm_elastic.policy.goodput_trade import victim_key as goodput_victim_key
from slurm_elastic.policy.gpulimits import GpuLimitTracker
from slurm_elastic.policy.reasons import Action, Reason
from slurm_elastic.policy.walk_grant import GrantSteps
from slurm_elastic.policy.walk_keys import _exhausted, _Live, _NodeInfo, remaining_key, service_key, victim_key
from slurm_elastic.policy.walk_pending import PendingSteps
from slurm_elastic.policy.work import NO_ACCOUNT, UnitWork
from slurm_elastic.slurm.model import Job


@dataclass
class Walk(PendingSteps, GrantSteps):
    """One walk. Build it, call :meth:`run`; results land on the UnitWork objects."""

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
        if self.ctx.cfg.allocator:  # (only waiting jobs so far: sorted once here, the later sort merges the grows)
            events.sort(key=lambda e: e[0])
            self._plan([item for _, item in events if isinstance(item, Job)])
        # speedup_growth: those grows go by their saving among themselves, all after the pending jobs of priority
        # >= the lowest of them, so that they share only nodes no such pending job can use (the spare nodes)
        by_gain = [w for w in self.works if w.action is Action.GROW and not w.tail_regrow and not w.molded_regrow
                   and (w.gain_s is not None or w.plan_value is not None)]
        # MOLDED_REGROW (policy/regrow.py): a molded unit takes free nodes at its priority like the waiting job it
        # was (after the waiting jobs of equal priority), and every other training grow waits for the regrows
        regrows = [w.priority for w in self.works if w.action is Action.GROW and w.molded_regrow]
        cap = min(regrows, default=1 << 62)
        floor = min(min((w.priority for w in by_gain), default=0), cap)
        for w in self.works:
            if w.action is not Action.GROW:
                continue
            if w.serving:  # serving grows outrank everything: pending jobs, regrows and training grows
                events.append(((-(1 << 62) - 1, 0, w.unit_id), w))
            elif w.tail_regrow:  # a tail_protection regrow goes first, ahead of pending jobs
                events.append(((-(1 << 62), 0, w.unit_id), w))
            elif w.molded_regrow:
                events.append(((-w.priority, 1, w.unit_id), w))
            elif w.plan_value is not None:  # allocator: by the objective, after the pending jobs like by_gain
                events.append(((-floor, 2, *grow_key(w)), w))
            elif w.gain_s is not None:
                events.append(((-floor, 2, -w.gain_s, w.unit_id), w))
            else:
                events.append(((-min(w.priority, cap), 2, -w.priority, w.unit_id), w))
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
