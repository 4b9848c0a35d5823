"""Phase 1 of a cycle: each unit on its own, from protections to a hold or an intent to grow or shrink.

Order of the checks (the first that applies decides): not running; invalid settings; startup protection;
cooldown; above max (shrink) / below min (grow), which need no metrics; the metrics gate (no metrics, stale,
window not filled, too few samples: always a hold); goodput (when on and the job publishes throughput);
the hysteresis band; then, per direction, --no-shrink/--no-grow, min/max, a pending extension job, near-end
and restart cost. A paused unit goes through all of it and then holds with PAUSED, its intent in the message.
"""

from __future__ import annotations

from slurm_elastic.batchsize import goodput_at
from slurm_elastic.policy.capacity import need_of
from slurm_elastic.policy.config import UnitSettings
from slurm_elastic.policy.goodput_trade import node_value
from slurm_elastic.policy.model import ElasticUnit, JobUtilization, Scalar
from slurm_elastic.policy.reasons import Action, Basis, Reason
from slurm_elastic.policy.regrow import regrow_message, regrow_target
from slurm_elastic.policy.serving import serving_call
from slurm_elastic.policy.signals import restart_gain_s, scaling, utilization_gate
from slurm_elastic.policy.speedup import efficiency_of, grow_gain, model_speedup, speedup_from_efficiency
from slurm_elastic.policy.topology import CROSS_SWITCH_SYNC_PENALTY, charge_cross_switch, crosses_switch, unit_nodes
from slurm_elastic.policy.wording import ago, pct, vs
from slurm_elastic.policy.work import Context, UnitWork


def _pct(value: float, threshold: float | None = None) -> str:
    return pct(value, threshold)  # 39.6% against 40%, never "40% < 40%"


def evaluate(unit: ElasticUnit, ctx: Context) -> UnitWork:
    job = unit.job
    current = unit.current_nodes
    inputs: dict[str, Scalar] = {
        "current_nodes": current,
        "min_nodes": unit.min_nodes,
        "max_nodes": unit.max_nodes,
        "priority": job.priority,
    }
    if not job.is_running or not job.nodes:
        w = UnitWork(unit, None, current, (), inputs)
        what = f"job is {job.state}" if not job.is_running else "job is RUNNING but Slurm reported no nodes"
        return w.hold(Reason.NOT_RUNNING, what)
    s = ctx.resolver.unit(unit)
    w = UnitWork(unit, s, current, need_of(job.gres_per_node), inputs)
    inputs["step"] = s.step
    band = s.band_problem()
    if band is not None:
        return w.hold(Reason.INVALID_SETTINGS, band)
    if unit.unit_id in ctx.paused_jobs:
        w.paused_by = "paused_jobs"
    elif s.paused:
        w.paused_by = str(s.provenance["paused"])
    w.last_grow = ctx.last_grow.get(unit.unit_id)
    if unit.attained_gpu_s is not None:
        inputs["attained_gpu_s"] = round(unit.attained_gpu_s, 1)
    _tail(w, s, ctx)
    _intent(w, s, ctx)
    protected = w.reason in (Reason.STARTUP, Reason.COOLDOWN) or w.tail_protected or unit.spec.serving
    w.reclaim_ok = not protected and w.paused_by is None and unit.spec.shrink and current > unit.min_nodes
    w.admit_floor = admit_floor(unit, s.admit_keep_percent)
    if s.admit_keep_percent:
        inputs["admit_floor"] = w.admit_floor
    w.victim_ok = (w.reclaim_ok and s.shrink_to_admit and current > w.admit_floor
                   and not _recent_victim(unit.unit_id, s, ctx))
    if (ctx.cfg.victim_by_goodput or ctx.cfg.goodput_moves) and w.reclaim_ok:
        w.node_value = node_value(w, s, ctx)
    if w.paused_by is not None:
        would = f"would {w.action} by {w.want}" if w.action is not Action.HOLD else "would hold"
        inputs["would"] = str(w.reason)
        w.hold(Reason.PAUSED, f"paused ({w.paused_by}); {would}: {w.reason}: {w.message}", w.basis)
    return w


def shrunk_share(unit: ElasticUnit, ctx: Context) -> tuple[float, float] | None:
    """(share of its life the unit ran below its requested size, its life in seconds), or None if unknown."""
    if unit.shrunk_s is None or unit.job.start_time is None:
        return None
    life = (ctx.now - unit.job.start_time).total_seconds()
    if life <= 0:
        return None
    return min(1.0, max(0.0, unit.shrunk_s / life)), life


def _tail(w: UnitWork, s: UnitSettings, ctx: Context) -> None:
    """tail_protection: a unit shrunk for more than max_shrunk_share of its life is protected from shrinks for
    others (shrink-to-admit, reserve reclaim) and grows back to its request first (bounded slowdown)."""
    if not s.tail_protection:
        return
    found = shrunk_share(w.unit, ctx)
    if found is None:
        return
    share, life = found
    w.inputs["shrunk_share"] = round(share, 3)
    w.inputs["shrunk_s"] = round(w.unit.shrunk_s or 0.0, 1)
    w.inputs["life_s"] = round(life, 1)
    w.inputs["max_shrunk_share"] = s.max_shrunk_share
    w.inputs["max_shrunk_share.source"] = s.source("max_shrunk_share")
    if w.unit.requested_nodes is not None:
        w.inputs["requested_nodes"] = w.unit.requested_nodes
    w.inputs["tail_min_shrunk_s"] = s.tail_min_shrunk_s
    w.tail_protected = share * 100 > s.max_shrunk_share and (w.unit.shrunk_s or 0.0) >= s.tail_min_shrunk_s


def tail_text(w: UnitWork) -> str:
    return (f"shrunk {w.inputs['shrunk_s']:.0f}s of its {w.inputs['life_s']:.0f}s life "
            f"({pct(float(w.inputs['shrunk_share'] or 0) * 100, float(w.inputs['max_shrunk_share'] or 0))} > "
            f"max_shrunk_share {w.inputs['max_shrunk_share']}%)")


def admit_floor(unit: ElasticUnit, keep_percent: int) -> int:
    """Fewest nodes ``unit`` keeps when shrunk to admit pending jobs: ``keep_percent`` of its requested size
    (the size it started with; else what it was submitted with), rounded up, and never below its min."""
    requested = unit.requested_nodes if unit.requested_nodes is not None else unit.submitted_nodes
    if not keep_percent or requested is None:
        return unit.min_nodes
    return max(unit.min_nodes, -(-requested * keep_percent // 100))


def _recent_victim(unit_id: int, s: UnitSettings, ctx: Context) -> bool:
    """Shrunk to admit a pending job less than ``admit_victim_interval_s`` ago: not a victim again yet (a long
    job must not be everybody's victim for its whole life)."""
    last = ctx.last_admit_victim.get(unit_id)
    return last is not None and (ctx.now - last).total_seconds() < s.admit_victim_interval_s


def _intent(w: UnitWork, s: UnitSettings, ctx: Context) -> None:
    unit, job, now, current = w.unit, w.unit.job, ctx.now, w.current
    spec = unit.spec
    if job.start_time is None:
        w.hold(Reason.STARTUP, "start time unknown")
        return
    age = (now - job.start_time).total_seconds()
    if age < s.startup_protection_s:
        w.inputs["running_s"] = round(age, 1)
        w.hold(Reason.STARTUP,
               f"started {ago(age, s.startup_protection_s)} ago < startup_protection_s {s.startup_protection_s}s")
        return
    if spec.serving:
        _serving(w, s, ctx)
        return
    last = ctx.last_resize.get(unit.unit_id)
    if last is not None:
        since = (now - last).total_seconds()
        if since < s.cooldown_s:
            w.inputs["since_resize_s"] = round(since, 1)
            w.inputs["cooldown_s.source"] = s.source("cooldown_s")
            w.hold(Reason.COOLDOWN,
                   f"last resize {ago(since, s.cooldown_s)} ago < cooldown_s {s.cooldown_s}s "
                   f"({s.source('cooldown_s')})")
            return
    if current > unit.max_nodes:
        if not spec.shrink:
            w.hold(Reason.SHRINK_DISABLED, f"{current} nodes > max {unit.max_nodes}, but --no-shrink", Basis.BOUNDS)
        else:
            w.intend(Action.SHRINK, Reason.ABOVE_MAX, f"{current} nodes > max {unit.max_nodes}", Basis.BOUNDS,
                     current - unit.max_nodes)
        return
    util = ctx.utilization.get(unit.unit_id)
    regrow = regrow_target(unit)
    if regrow is not None:  # a molded unit below its request: no metrics needed (policy/regrow.py)
        w.inputs["molded_request"] = unit.molded_request
        w.inputs["running_s"] = round(age, 1)
        _grow_checks(w, s, ctx, util=util, reason=Reason.MOLDED_REGROW, msg=regrow_message(unit, regrow),
                     basis=Basis.BOUNDS, want=regrow - current, efficiency=1.0)
        w.molded_regrow = w.action is Action.GROW
        return
    if current < unit.min_nodes:
        _grow_checks(w, s, ctx, util=util, reason=Reason.BELOW_MIN, msg=f"{current} nodes < min {unit.min_nodes}",
                     basis=Basis.BOUNDS, want=unit.min_nodes - current, efficiency=1.0)
        return

    gate = utilization_gate(util, s, now)
    if util is not None:
        w.inputs["gpus_allocated"] = util.gpus_allocated
        w.inputs["gpus_in_use"] = util.gpus_in_use
        w.inputs["samples"] = util.samples
        w.inputs["window_covered_s"] = round(util.window_s, 1)
        if util.last_sample_at is not None:
            w.inputs["metric_age_s"] = round((now - util.last_sample_at).total_seconds(), 1)
    if gate.reason is not None or gate.mean is None:
        w.hold(gate.reason or Reason.NO_METRICS, gate.message)
        return
    assert util is not None
    mean = gate.mean
    w.inputs.update({
        "mean_util": round(mean, 2),
        "max_util": None if util.max_util is None else round(util.max_util, 2),
        "scale_up_above": s.scale_up_above,
        "scale_up_above.source": s.source("scale_up_above"),
        "scale_down_below": s.scale_down_below,
        "scale_down_below.source": s.source("scale_down_below"),
    })
    w.efficiency = mean / 100.0
    over = f"over {util.window_s:.0f}s ({util.samples} samples)"

    efficiency = 1.0
    if s.goodput:
        sc = scaling(util.throughput, current, s, now)
        thr = s.goodput_min_marginal_efficiency
        if sc.usable:
            w.inputs["throughput"] = round(sc.current or 0.0, 4)
            w.inputs["marginal_efficiency_last"] = None if sc.last_step is None else round(sc.last_step, 3)
            w.inputs["marginal_efficiency_next"] = None if sc.next_step is None else round(sc.next_step, 3)
            w.inputs["goodput_min_marginal_efficiency"] = thr
            if sc.last_step is not None:
                w.efficiency = sc.last_step
            if mean >= s.scale_down_below and sc.last_step is not None and sc.last_step < thr:
                if current > unit.min_nodes and spec.shrink:
                    floor = max(unit.min_nodes, sc.prev_nodes or unit.min_nodes, current - s.step)
                    w.intend(Action.SHRINK, Reason.LOW_MARGINAL_EFFICIENCY,
                             f"growing from {sc.prev_nodes} to {current} nodes gave marginal efficiency "
                             f"{vs(sc.last_step, thr, 2)} < {thr:.2f}; shrink back", Basis.THROUGHPUT, current - floor)
                    return
            if mean > s.scale_up_above and sc.next_step is not None:
                kind = "measured" if sc.next_measured else "predicted"
                if sc.next_step < thr:
                    w.hold(Reason.LOW_MARGINAL_EFFICIENCY,
                           f"mean util {_pct(mean, s.scale_up_above)} > {s.scale_up_above}% but {kind} marginal "
                           f"efficiency of the next step {vs(sc.next_step, thr, 2)} < {thr:.2f}", Basis.THROUGHPUT)
                    return
                efficiency = sc.next_step
                _grow_checks(w, s, ctx, util=util, reason=Reason.OVERUTILIZED,
                             msg=f"mean util {_pct(mean, s.scale_up_above)} > {s.scale_up_above}% {over}, {kind} "
                             f"marginal efficiency {vs(sc.next_step, thr, 2)} >= {thr:.2f}", basis=Basis.THROUGHPUT,
                             want=min(s.step, unit.max_nodes - current), efficiency=efficiency)
                return

    requested = unit.requested_nodes
    if (w.tail_protected and requested is not None and current < min(requested, unit.max_nodes)
            and mean >= s.scale_down_below):
        w.tail_regrow = True
        _grow_checks(w, s, ctx, util=util, reason=Reason.SHRUNK_TOO_LONG,
                     msg=f"{tail_text(w)}: back to its requested {requested} node(s) first, mean util "
                     f"{_pct(mean, s.scale_down_below)} >= {s.scale_down_below}%", basis=Basis.UTILIZATION,
                     want=min(requested, unit.max_nodes) - current, efficiency=efficiency)
        if w.action is not Action.GROW:
            w.tail_regrow = False
        return
    if mean < s.scale_down_below:
        msg = f"mean util {_pct(mean, s.scale_down_below)} < {s.scale_down_below}% {over}"
        if not spec.shrink:
            w.hold(Reason.SHRINK_DISABLED, f"{msg}, but --no-shrink", Basis.UTILIZATION)
        elif current <= unit.min_nodes:
            w.hold(Reason.AT_MIN, f"{msg}, but at min {unit.min_nodes}", Basis.UTILIZATION)
        else:
            w.intend(Action.SHRINK, Reason.UNDERUTILIZED, msg, Basis.UTILIZATION,
                     min(s.step, current - unit.min_nodes))
        return
    if s.speedup_growth and current < unit.max_nodes and spec.grow:
        _speedup(w, s, ctx, util, mean=mean, over=over)
        return
    if mean > s.scale_up_above:
        _grow_checks(w, s, ctx, util=util, reason=Reason.OVERUTILIZED,
                     msg=f"mean util {_pct(mean, s.scale_up_above)} > {s.scale_up_above}% {over}",
                     basis=Basis.UTILIZATION,
                     want=min(s.step, unit.max_nodes - current), efficiency=efficiency)
        return
    w.hold(Reason.IN_BAND, f"mean util {_pct(mean)} within {s.scale_down_below}%..{s.scale_up_above}% {over}",
           Basis.UTILIZATION)


def _serving(w: UnitWork, s: UnitSettings, ctx: Context) -> None:
    """A serving unit: its bounds, then the serving rules of policy/serving.py instead of the utilization band."""
    unit, current = w.unit, w.current
    w.serving = True
    if current > unit.max_nodes and unit.spec.shrink:
        w.intend(Action.SHRINK, Reason.ABOVE_MAX, f"{current} nodes > max {unit.max_nodes}", Basis.BOUNDS,
                 current - unit.max_nodes)
        return
    if current < unit.min_nodes:
        _grow_checks(w, s, ctx, util=None, reason=Reason.BELOW_MIN, msg=f"{current} nodes < min {unit.min_nodes}",
                     basis=Basis.BOUNDS, want=unit.min_nodes - current, efficiency=1.0)
        return
    call = serving_call(unit, ctx.serving.get(unit.unit_id), s, ctx.now, current=current,
                        last_resize=ctx.last_resize.get(unit.unit_id), last_grow=ctx.last_grow.get(unit.unit_id))
    w.inputs.update(call.inputs)
    if call.action is Action.GROW:
        _grow_checks(w, s, ctx, util=None, reason=call.reason, msg=call.message, basis=Basis.SERVING,
                     want=min(call.want, max(0, unit.max_nodes - current)) or call.want, efficiency=1.0)
    elif call.action is Action.SHRINK:
        if not unit.spec.shrink:
            w.hold(Reason.SHRINK_DISABLED, f"{call.message}, but --no-shrink", Basis.SERVING)
        else:
            w.intend(Action.SHRINK, call.reason, call.message, Basis.SERVING, call.want)
    else:
        w.hold(call.reason, call.message, Basis.SERVING if call.reason is not Reason.NO_METRICS else Basis.NONE)


def _speedup(w: UnitWork, s: UnitSettings, ctx: Context, util: JobUtilization, *, mean: float, over: str) -> None:
    """speedup_growth: grow when the next step saves more than a restart (policy/speedup.py); record the numbers
    and the gain, by which the walk ranks grows among themselves."""
    current = w.current
    add = min(s.step, w.unit.max_nodes - current)
    sc = scaling(util.throughput, current, s, ctx.now)
    measured = sc.usable and sc.next_step is not None and sc.next_measured
    # an opted-in job (adaptive batch size): unless the next size was measured, the goodput the shared model
    # predicts at the plan it picks for each size
    adaptive = None if measured else _adaptive_speedup(w, util, current, add)
    if adaptive is not None:
        speedup, source, basis = adaptive, "goodput model", Basis.THROUGHPUT
    elif sc.usable and sc.next_step is not None:
        speedup, source, basis = speedup_from_efficiency(sc.next_step, current, add), "throughput", Basis.THROUGHPUT
    else:
        speedup, source, basis = model_speedup(mean, current, add), "utilization model", Basis.UTILIZATION
    if ctx.leaf_switch:
        part = w.unit.job.partition
        free = [n for n, parts in ctx.free_nodes.items() if part in parts]
        crossing = crosses_switch(unit_nodes(w.unit), add, ctx.leaf_switch, free)
        w.inputs["cross_switch"] = crossing
        if crossing:
            speedup = charge_cross_switch(speedup, mean, current, add)
            source += f", cross-switch x{1 + CROSS_SWITCH_SYNC_PENALTY:.2f} sync"
    eff = efficiency_of(speedup, current, add)
    observed = util.restart_s
    cost = observed if observed is not None else float(s.restart_cost_s)
    remaining = w.unit.job.remaining_seconds(ctx.now)
    gain = grow_gain(speedup, source, remaining, cost)
    thr = s.goodput_min_marginal_efficiency
    w.inputs.update({
        "next_speedup": round(speedup, 3),
        "speedup_source": source,
        "speedup_efficiency": round(eff, 3),
        "goodput_min_marginal_efficiency": thr,
        "restart_cost_s": round(cost, 1),
        "restart_cost.source": "observed" if observed is not None else s.source("restart_cost_s"),
        "grow_gain_s": None if gain.gain_s == float("inf") else round(gain.gain_s, 1),
    })
    left = "no time limit" if remaining is None else f"{max(0.0, remaining):.0f}s left"
    what = (f"+{add} node(s) to {current}: speedup {speedup:.3f} ({source}, mean util {_pct(mean)} {over}), "
            f"marginal efficiency {eff:.2f}, saves {gain.gain_s:.0f}s net of a {cost:.0f}s restart ({left})")
    if eff < thr or not gain.pays:
        why = f"efficiency {vs(eff, thr, 2)} < {thr:.2f}" if eff < thr else f"saving {vs(gain.gain_s, 0)}s <= 0"
        w.hold(Reason.LOW_SPEEDUP_GAIN, f"{what}: {why}", basis)
        return
    w.gain_s = gain.gain_s if gain.gain_s != float("inf") else 1e18 * speedup
    _grow_checks(w, s, ctx, util=util, reason=Reason.SPEEDUP_GAIN, msg=what, basis=basis, want=add, efficiency=eff)


def _adaptive_speedup(w: UnitWork, util: JobUtilization, current: int, add: int) -> float | None:
    """Adaptive batch size: goodput of the best plan at ``current + add`` nodes over that at ``current``
    (slurm_elastic.batchsize, the model the job reads its batch from), with the numbers recorded; None when the
    unit did not opt in or has no statistics and step times yet."""
    state = util.adaptive
    if state is None or current < 1 or add < 1:
        return None
    model = state.step_model
    per_node = util.gpus_allocated // current if util.gpus_allocated >= current else (
        model.gpus_per_node if model is not None else 0)
    now, nxt = goodput_at(state, current, per_node), goodput_at(state, current + add, per_node)
    if now is None or nxt is None or not now.goodput > 0:
        return None
    assert state.stats is not None  # goodput_at answers only with statistics
    w.inputs.update({
        "noise_scale": round(state.stats.noise_scale, 1),
        "batch_now": now.global_batch, "batch_next": nxt.global_batch,
        "local_batch_next": nxt.local_batch, "accum_steps_next": nxt.accum_steps,
        "batch_efficiency_now": round(now.efficiency, 3), "batch_efficiency_next": round(nxt.efficiency, 3),
        "goodput_now": round(now.goodput, 2), "goodput_next": round(nxt.goodput, 2),
    })
    return nxt.goodput / now.goodput


def _grow_checks(
    w: UnitWork,
    s: UnitSettings,
    ctx: Context,
    *,
    util: JobUtilization | None,
    reason: Reason,
    msg: str,
    basis: Basis,
    want: int,
    efficiency: float,
) -> None:
    unit, current = w.unit, w.current
    if not unit.spec.grow:
        w.hold(Reason.GROW_DISABLED, f"{msg}, but --no-grow", basis)
        return
    if current >= unit.max_nodes:
        w.hold(Reason.AT_MAX, f"{msg}, but at max {unit.max_nodes}", basis)
        return
    pending = unit.pending_extension_count
    if pending:
        w.hold(Reason.EXTENSION_PENDING, f"{msg}, but {pending} extension job(s) still pending", basis)
        return
    remaining = unit.job.remaining_seconds(ctx.now)
    if remaining is not None:
        w.inputs["remaining_s"] = round(remaining, 1)
        if remaining < s.min_remaining_for_grow_s:
            w.hold(Reason.NEAR_END,
                   f"{msg}, but {max(0.0, remaining):.0f}s of time limit left < min_remaining_for_grow_s "
                   f"{s.min_remaining_for_grow_s}s", basis)
            return
    if s.restart_cost_aware:
        observed = util.restart_s if util is not None else None
        cost = observed if observed is not None else float(s.restart_cost_s)
        gain = restart_gain_s(remaining, cost, efficiency, want, current)
        w.inputs["restart_cost_s"] = round(cost, 1)
        w.inputs["restart_cost.source"] = "observed" if observed is not None else s.source("restart_cost_s")
        w.inputs["expected_gain_s"] = None if gain == float("inf") else round(gain, 1)
        if gain <= cost:
            w.hold(Reason.RESTART_COST,
                   f"{msg}, but expected gain {gain:.0f}s over the remaining {remaining or 0:.0f}s "
                   f"<= restart cost {cost:.0f}s", basis)
            return
    w.intend(Action.GROW, reason, msg, basis, want)
