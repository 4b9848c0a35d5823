"""The walk's pending jobs (policy/walk.py): each reserves the free nodes it could use, and when it still does not
fit, shrink-to-admit takes nodes of lower-priority units for it (the allocator by rho, policy/allocator.py)."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import takewhile

from slurm_elastic.policy.allocator import VictimHeap, victim_limit
from slurm_elastic.policy.capacity import (
    Need,
    Status,
    add_gres,
    fits,
    need_of,
)
from slurm_elastic.policy.model import AdmitBasis, admit_request
from slurm_elastic.policy.plan import Entity, Waiting, plan_partition, restart_penalty, shares
from slurm_elastic.policy.reasons import Action
from slurm_elastic.policy.walk_keys import added_time_s, marginal_loss
from slurm_elastic.policy.walk_state import WalkState
from slurm_elastic.policy.work import UnitWork
from slurm_elastic.slurm.model import Job


class PendingSteps(WalkState):
    """The pending-job steps of a walk."""

    def _pending(self, job: Job) -> None:
        if (not len(self.pool) and not len(self.cold) and not len(self.planned) and not self.victims
                and not self.tail_protected):
            return
        parts = tuple(p for p in job.partition.split(",") if p)
        need = need_of(job.gres_per_node)
        count = max(1, job.node_count)
        count = self.shares.get(job.job_id, count)  # the allocator's round plan: a moldable job at its share
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
            self._admit(job, parts, need, count - len(got), got)

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

    def _counts(self, name: str, holder: UnitWork, parts: set[str], need: Need, counted: set[str]) -> bool:
        """Would node ``name`` give the pending job one more place once ``holder`` gives it back? A node counts
        once for the job (``counted``: what it has so far): two units sharing it (GPUs per node) free one place,
        not two."""
        if name in counted or not self._helps(name, holder, parts, need):
            return False
        counted.add(name)
        return True

    def _admit(self, job: Job, parts: tuple[str, ...], need: Need, deficit: int, got: list[str]) -> None:
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
        counted = {*got, *claims}
        if cfg.allocator and still > 0:
            tentative, still = self._fair_victims(job, part_set, parts, need, still, counted=counted)
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
                    if not self._counts(order[w.taken + k].node, w, part_set, need, counted):
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
                if job.job_id in self.shares:  # the round plan's share of the job it admits (explain)
                    w.inputs["admit_share"] = self.shares[job.job_id]
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
                      still: int, *, counted: set[str]) -> tuple[list[tuple[UnitWork, int]], int]:
        """allocator: the lower-priority victims' nodes, one at a time from the unit whose rho after the shrink
        would be lowest, none past max(fairness_max_rho, the waiting job's own rho) (policy/allocator.py).
        Returns the picks and how many nodes are still missing (all of ``still`` when they are not enough)."""
        max_rho = victim_limit(job, self.ctx.now, self.ctx.cfg.fairness_max_rho)

        def helps(w: UnitWork, k: int) -> bool:
            return self._counts(w.removal()[w.taken + k].node, w, part_set, need, counted)

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

    # --- the allocator's round plan -------------------------------------------------------------------------------

    def _plan(self, waiting: list[Job]) -> None:
        """allocator: per partition, the round plan (policy/plan.py) over its victims, grow intents and waiting
        jobs (priority order). A moldable waiting job then asks for its share only; a victim gives back only down
        to its planned size (its admit floor). Jobs of several partitions keep their request. A partition with
        neither a victim nor a moldable waiting job is not planned: the plan could change nothing there."""
        power = self.ctx.cfg.fairness_power
        mins = self.inp.pending_min_nodes
        by_part: dict[str, list[Job]] = {}
        for j in waiting:
            if "," not in j.partition:
                by_part.setdefault(j.partition, []).append(j)
        if not by_part:
            return
        members: dict[str, list[UnitWork]] = {}
        for w in self.works:
            if w.fairness is not None and (w.victim_ok or (w.action is Action.GROW and w.want > 0)):
                for part in self.unit_parts[w.unit_id]:
                    if part in by_part:  # (a unit on nodes of several partitions is in each one's plan)
                        members.setdefault(part, []).append(w)
        for part in sorted(by_part):
            jobs = by_part[part]
            top = max(j.priority for j in jobs)  # victims only give to higher priority
            victims = [w for w in members.get(part, ()) if w.victim_ok and w.priority < top]
            if not victims and not any(j.job_id in mins for j in jobs):
                continue
            units: list[Entity] = []
            planned: list[UnitWork] = []
            for w in members.get(part, ()):
                assert w.fairness is not None
                held = w.current - w.taken
                if w.victim_ok and w.priority < top:
                    lo, hi = min(held, max(w.unit.min_nodes, w.admit_floor)), held
                elif w.action is Action.GROW and w.want > 0:
                    lo, hi = held, held + w.want
                else:
                    continue
                if lo >= hi:
                    continue  # nothing to give and nothing to take: the plan can only leave it as it is
                units.append(Entity((0, w.unit_id), lo, hi, w.fairness.normalized_speed, held=held,
                                    restart=restart_penalty(w.fairness, held, power)))
                planned.append(w)
            free = self.pool.free_count(part) + len(self.freeing.get(part, ())) - self.reserves.get(part, 0)
            plan = plan_partition(units, (_waiting(j, mins) for j in jobs), max(0, free), power)
            self.shares.update(shares(plan))
            for w, e in zip(planned, units, strict=True):
                w.inputs["plan_nodes"] = e.size
                if w.victim_ok and w.priority < top:
                    w.admit_floor = max(w.admit_floor, e.size)


def _waiting(job: Job, mins: Mapping[int, int]) -> Waiting:
    request = max(1, job.node_count)
    return Waiting(job.job_id, min(max(1, mins.get(job.job_id, request)), request), request)
