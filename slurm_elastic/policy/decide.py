"""``decide``: one decision per elastic unit, from the snapshot, metrics, history, config and the time.

The cycle has five phases, each pure:

1. **Evaluate** every unit on its own (:func:`_evaluate`): protections (not running, startup, cooldown),
   bounds, the metrics gate (no, stale or too few metrics: hold, never shrink), the hysteresis band, goodput,
   and the per-direction checks (no-grow/no-shrink, min/max, pending extension, near end, restart cost).
   The result is a hold, or an *intent* to shrink or grow by some nodes. Paused units keep their intent
   only in the message.
2. **Walk** the pending jobs and the grow intents in priority order (equal priority: the pending job first).
   A pending job that waits for nodes reserves the free nodes it could use (partition and GRES per node), up
   to its node count; when it still does not fit and shrink-to-admit is on, units of lower priority give back
   nodes above their min (victims: lowest priority, lowest efficiency, most recently grown). A grow intent
   takes free nodes that fit it, keeping each partition's reserve, within its account's fair share and the
   account/QOS quotas. Nodes already reserved or granted are gone for everyone after.
3. **Build** decisions: shrink plans (extension jobs newest first, then leader nodes, never the batch host)
   and grow plans (one extension job spanning the granted nodes).
4. **Cap** the actions: the first ``max_actions_per_cycle`` by priority (then unit id) go ahead, the rest
   hold with ACTION_CAP. A capped grow's nodes simply stay free for the next cycle.
5. **Hold** what the shell's state forbids (policy/holds.py): an action of a unit whose earlier action is not
   finished (ACTION_IN_PROGRESS), a grow of a unit whose extension jobs keep dying on their own (GROW_BACKOFF).

Everything is ordered explicitly (priority, then ids, natural node names), so the same input gives the same
output whatever the order of units, jobs and nodes in it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from types import MappingProxyType

from slurm_elastic.policy.allocator import assess
from slurm_elastic.policy.capacity import is_free_node
from slurm_elastic.policy.config import PolicyConfig, SettingsResolver
from slurm_elastic.policy.errors import PolicyInputError
from slurm_elastic.policy.evaluate import evaluate, tail_text
from slurm_elastic.policy.gpugrain import grow_by_gpus
from slurm_elastic.policy.holds import hold_blocked
from slurm_elastic.policy.model import Decision, GrowPlan, PolicyInput, ResizeRecord, ShrinkPlan
from slurm_elastic.policy.reasons import Action, Basis, Reason
from slurm_elastic.policy.shrink import plan_shrink, time_limit_extension_s, time_limit_giveback_s
from slurm_elastic.policy.walk import Walk
from slurm_elastic.policy.work import Context, UnitWork


def decide(inp: PolicyInput, cfg: PolicyConfig, now: datetime) -> list[Decision]:
    """One decision per unit in ``inp.units``, sorted by unit id. Pure and deterministic.

    Raises PolicyInputError for an inconsistent input (a caller bug), never for a cluster state.
    """
    _validate(inp)
    cfg = cfg.at(now)
    last_resize: dict[int, datetime] = {}
    last_grow: dict[int, datetime] = {}
    admit_at: dict[int, ResizeRecord] = {}  # pending job -> the latest shrink-to-admit for it
    last_admit_victim: dict[int, datetime] = {}
    for rec in inp.history:
        _latest(last_resize, rec.unit_id, rec.at)
        if rec.action is Action.GROW:
            _latest(last_grow, rec.unit_id, rec.at)
        if rec.for_job is not None and rec.reason == Reason.SHRINK_TO_ADMIT:
            seen = admit_at.get(rec.for_job)
            if seen is None or rec.at > seen.at:
                admit_at[rec.for_job] = rec
        if rec.reason == Reason.SHRINK_TO_ADMIT and rec.action is Action.SHRINK:
            _latest(last_admit_victim, rec.unit_id, rec.at)
    for unit in inp.units:
        for ext in unit.extensions:
            when = ext.start_time or ext.submit_time
            if when is not None:
                _latest(last_resize, unit.unit_id, when)
                _latest(last_grow, unit.unit_id, when)

    leaves = inp.snapshot.leaf_switch
    ctx = Context(cfg, now, SettingsResolver(cfg), inp.utilization, last_resize, last_grow, cfg.paused_jobs,
                  last_admit_victim, inp.serving, leaves,
                  {n.name: n.partitions for n in inp.snapshot.nodes if is_free_node(n)} if leaves else {})
    works = [evaluate(unit, ctx) for unit in sorted(inp.units, key=lambda u: u.unit_id)]
    if cfg.allocator:
        assess(works, ctx)
    Walk(inp, ctx, works, admit_at).run()
    decisions = [_build(w, ctx) for w in works]
    decisions = grow_by_gpus(decisions, works, inp, ctx)  # gpu_granular_growth: refused grows by GPUs
    held = hold_blocked(_cap(decisions, cfg.max_actions_per_cycle), inp, now)
    return sorted(held, key=lambda d: d.unit_id)


def _latest(table: dict[int, datetime], key: int, when: datetime) -> None:
    old = table.get(key)
    if old is None or when > old:
        table[key] = when


def _validate(inp: PolicyInput) -> None:
    seen: set[int] = set()
    ext_seen: set[int] = set()
    for unit in inp.units:
        if unit.unit_id in seen:
            raise PolicyInputError(f"unit {unit.unit_id} appears twice in the policy input")
        seen.add(unit.unit_id)
        for ext in unit.extensions:
            if ext.job_id in ext_seen or ext.job_id in seen:
                raise PolicyInputError(f"extension job {ext.job_id} is claimed twice (unit {unit.unit_id})")
            ext_seen.add(ext.job_id)
            if ext.is_running and not ext.nodes:
                raise PolicyInputError(f"running extension job {ext.job_id} of unit {unit.unit_id} has no nodes")
    clash = seen & ext_seen
    if clash:
        raise PolicyInputError(f"job {min(clash)} is both a unit and an extension job")


# --- phase 3 and 4: decisions and the cap ------------------------------------------------------------------------


def _build(w: UnitWork, ctx: Context) -> Decision:
    unit, job, s = w.unit, w.unit.job, w.settings

    def make(
        action: Action, target: int, reason: Reason, message: str, basis: Basis, *,
        grow: GrowPlan | None = None, shrink: ShrinkPlan | None = None,
    ) -> Decision:
        return Decision(
            unit_id=unit.unit_id, display_id=job.display_id, action=action, current_nodes=w.current,
            target_nodes=target, reason=reason, message=message, basis=basis, priority=job.priority,
            inputs=MappingProxyType(dict(w.inputs)), profile=ctx.cfg.active_profile,
            grow=grow, shrink=shrink,
            grace_s=s.grace_s if s is not None and action is Action.SHRINK else 0,
            signal=s.signal if s is not None and action is Action.SHRINK else None,
        )

    if w.taken > 0:  # a shrink: metric-driven, to admit a pending job, or both
        admits = tuple(b.job_id for b in w.admit_basis)
        plan = plan_shrink(unit, w.removal(), w.taken, admits)
        if w.admit_basis:
            plan = replace(plan, admit_basis=tuple(w.admit_basis))
        add_s, extend = _time_limit_extension(w, ctx)
        if add_s:
            plan = replace(plan, time_limit_add_s=add_s)
        if w.move_to is not None:  # goodput_moves: only a unit with nothing else to give back is a donor
            v = w.node_value
            basis = Basis.UTILIZATION if v is None or v.source == "utilization model" else Basis.THROUGHPUT
            return make(Action.SHRINK, w.current - w.taken, Reason.GOODPUT_MOVE, w.message + extend, basis,
                        shrink=plan)
        if w.serving_for and not w.admit_taken:
            ids = ", ".join(str(u) for u in w.serving_for)
            w.inputs["serving_for"] = ids
            msg = (f"gives back {w.reclaim_taken} node(s) above min {unit.min_nodes} to serving unit(s) {ids} "
                   f"whose SLO is at risk")
            if w.action is Action.SHRINK:
                msg += f"; also {w.reason}: {w.message}"
            return make(Action.SHRINK, w.current - w.taken, Reason.SERVING_RECLAIM, msg + extend, Basis.SERVING,
                        shrink=plan)
        if w.reclaim_taken and not w.admit_taken:
            assert s is not None
            msg = (f"gives back {w.reclaim_taken} node(s) above min {unit.min_nodes} so that partition "
                   f"{job.partition} keeps free_node_reserve {s.free_node_reserve} ({s.source('free_node_reserve')})")
            if w.action is Action.SHRINK:
                msg += f"; also {w.reason}: {w.message}"
            return make(Action.SHRINK, w.current - w.taken, Reason.RESERVE_RECLAIM, msg + extend, Basis.RESERVE,
                        shrink=plan)
        if not w.admit_taken:
            return make(Action.SHRINK, w.current - w.taken, w.reason, w.message + extend, w.basis, shrink=plan)
        ids = ", ".join(str(j) for j in admits)
        w.inputs["admits"] = ids
        msg = (f"gives back {w.admit_taken} node(s) above min {unit.min_nodes} so that pending job(s) {ids} "
               f"(priority {w.admit_priority} > {job.priority}) can start")
        if "victim_marginal_loss" in w.inputs:
            attained = w.unit.attained_gpu_s
            msg += (f"; victim by least marginal loss ({w.inputs['victim_marginal_loss']} of its speed per node)"
                    + ("" if attained is None else f", then most attained service ({attained / 3600:.1f} GPU-h)"))
        if w.action is Action.SHRINK:
            msg += f"; also {w.reason}: {w.message}"
        return make(Action.SHRINK, w.current - w.taken, Reason.SHRINK_TO_ADMIT, msg + extend, Basis.QUEUE,
                    shrink=plan)
    if w.action is Action.GROW and w.granted:
        remaining = job.remaining_seconds(ctx.now)
        sub_s, give_back = _time_limit_giveback(w, ctx, w.current + len(w.granted))
        grow = GrowPlan(
            nodes=tuple(w.granted), partition=w.grow_partition or job.partition, gres_per_node=job.gres_per_node,
            tres_per_node=job.tres_per_node, user=job.user, account=job.account, qos=job.qos,
            time_limit_s=None if remaining is None else max(0, int(remaining) - sub_s),
            time_limit_sub_s=sub_s, resume_nodes=tuple(w.resumed),
        )
        return make(Action.GROW, w.current + len(w.granted), w.reason, w.message + give_back, w.basis, grow=grow)
    if w.action is Action.GROW:  # refused by the walk
        return make(Action.HOLD, w.current, w.final or Reason.NO_FREE_NODES, w.message, w.basis)
    if w.spared_for is not None and w.action is Action.HOLD and w.paused_by is None:
        pending, prio = w.spared_for
        w.inputs["spared_for"] = pending
        w.inputs["would"] = str(w.reason)
        return make(Action.HOLD, w.current, Reason.TAIL_PROTECTED,
                    f"not shrunk to admit pending job {pending} (priority {prio} > {job.priority}): {tail_text(w)} "
                    f"(tail_protection); otherwise {w.reason}: {w.message}", Basis.QUEUE)
    return make(Action.HOLD, w.current, w.reason, w.message, w.basis)


def _time_limit_extension(w: UnitWork, ctx: Context) -> tuple[int, str]:
    """extend_time_limit_on_shrink: seconds to add to the shrinking unit's time limit, and the message suffix.

    Records the numbers in the unit's inputs. (0, '') when off, or for a job without a limit.
    """
    s = w.settings
    if s is None or not s.extend_time_limit_on_shrink:
        return 0, ""
    remaining = w.unit.job.remaining_seconds(ctx.now)
    if remaining is None:
        return 0, ""
    after = w.current - w.taken
    add = time_limit_extension_s(remaining, w.current, after, s.max_time_limit_extension_s)
    w.inputs["remaining_s"] = round(remaining, 1)
    w.inputs["time_limit_add_s"] = add
    w.inputs["max_time_limit_extension_s"] = s.max_time_limit_extension_s
    w.inputs["max_time_limit_extension_s.source"] = s.source("max_time_limit_extension_s")
    if add <= 0:
        return 0, ""
    uncapped = time_limit_extension_s(remaining, w.current, after, _NO_CAP)
    capped = " (capped by max_time_limit_extension_s)" if add < uncapped else ""
    return add, f"; time limit +{add // 60}min: {remaining:.0f}s left x ({w.current}/{after} - 1){capped}"


_NO_CAP = 1 << 62


def _time_limit_giveback(w: UnitWork, ctx: Context, after: int) -> tuple[int, str]:
    """extend_time_limit_on_shrink, on a grow: seconds to take back off the unit's time limit (out of what its
    shrinks added), and the message suffix. (0, '') when off, nothing was added, or the job has no limit."""
    s, added = w.settings, w.unit.time_limit_added_s
    if s is None or not s.extend_time_limit_on_shrink or added <= 0:
        return 0, ""
    remaining = w.unit.job.remaining_seconds(ctx.now)
    sub = time_limit_giveback_s(remaining, w.current, after, added)
    w.inputs["time_limit_added_s"] = added
    w.inputs["time_limit_sub_s"] = sub
    if sub <= 0 or remaining is None:
        return 0, ""
    w.inputs["remaining_s"] = round(remaining, 1)
    return sub, (f"; time limit -{sub // 60}min: {remaining:.0f}s left x (1 - {w.current}/{after}), out of "
                 f"+{added // 60}min added by shrinks")


def _cap(decisions: list[Decision], cap: int) -> list[Decision]:
    # serving actions (a serving unit's resize, or training giving nodes back to one) go first
    actions = sorted((d for d in decisions if d.is_action),
                     key=lambda d: (d.basis is not Basis.SERVING, -d.priority, d.unit_id))
    if len(actions) <= cap:
        return decisions
    capped = {d.unit_id for d in actions[cap:]}
    out: list[Decision] = []
    for d in decisions:
        if d.unit_id not in capped:
            out.append(d)
            continue
        inputs = dict(d.inputs)
        inputs["would"] = str(d.reason)
        out.append(Decision(
            unit_id=d.unit_id, display_id=d.display_id, action=Action.HOLD, current_nodes=d.current_nodes,
            target_nodes=d.current_nodes, reason=Reason.ACTION_CAP,
            message=(f"would {d.action} {d.current_nodes} -> {d.target_nodes} ({d.reason}: {d.message}); "
                     f"max_actions_per_cycle {cap} reached"),
            basis=d.basis, priority=d.priority, inputs=MappingProxyType(inputs), profile=d.profile,
        ))
    return out
