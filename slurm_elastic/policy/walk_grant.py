"""The walk's grow intents (policy/walk.py): free nodes that fit, within the reserves, the account/QOS quotas and
Slurm's GPU limits, the growth cap and the fair share; powered-down nodes when a resume pays."""

from __future__ import annotations

from slurm_elastic.directives.admin_comment import submitted_partitions
from slurm_elastic.policy.capacity import (
    Status,
)
from slurm_elastic.policy.fairshare import account_weight, split_spare
from slurm_elastic.policy.reasons import Reason
from slurm_elastic.policy.signals import restart_gain_s
from slurm_elastic.policy.topology import grow_preference
from slurm_elastic.policy.walk_keys import _need_text
from slurm_elastic.policy.walk_state import WalkState
from slurm_elastic.policy.work import NO_ACCOUNT, UnitWork


class GrantSteps(WalkState):
    """The grow steps of a walk, and the quota room the serving reclaim asks for."""

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
