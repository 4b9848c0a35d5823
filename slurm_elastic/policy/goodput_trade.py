"""Goodput trades: what a unit's last node is worth, shrink victims by it, and node moves.

The same model ``speedup_growth`` grows by (policy/speedup.py), read one node down:

* an opted-in unit (adaptive batch size): the goodput the shared batch-size model predicts for the best plan at
  ``n`` nodes over that at ``n - 1`` (slurm_elastic.batchsize);
* a unit that publishes throughput: its measured last step's marginal efficiency, speedup ``1 + eff / (n - 1)``;
* else the linear-sync model of its utilization ``u`` at ``n``: on ``n - 1`` nodes a step takes
  ``u * n / (n - 1) + (1 - u) * (n - 1) / n`` of what it takes now (below about 50% utilization it is faster).

The **loss** of giving one node back is the seconds its remaining run (its time limit left) gets longer, plus
one restart: ``(remaining - restart) * (slowdown - 1) + restart``. Without a time limit, or with less than a
restart left of it, it is unknown: such a unit ranks after every known one, by its slowdown, and gives no node
to a move.

``victim_by_goodput``: shrink-to-admit and reserve-reclaim victims go least loss first (only lower-priority
units are ever victims to admit). ``goodput_moves``: a speedup grow refused for want of free nodes may take a
node from the unit whose last node is worth least, when what it saves (net of its restart) beats what the other
loses (with its restart): that unit shrinks by one node (GOODPUT_MOVE) and the grower takes the node on a
later cycle. Donors give only nodes above the size they asked for: moves trade what units grew into, never a
request (measured: moving the long many-node jobs' requested nodes, one per cooldown, cost workload-6's p99 39%).
One move per unit per cycle; a donor's shrink starts its cooldown.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from slurm_elastic.batchsize import goodput_at
from slurm_elastic.policy.config import UnitSettings
from slurm_elastic.policy.reasons import Action, Reason
from slurm_elastic.policy.signals import scaling, utilization_gate
from slurm_elastic.policy.speedup import speedup_from_efficiency
from slurm_elastic.policy.work import Context, NodeValue, UnitWork


def model_slowdown(util_pct: float, nodes: int) -> float:
    """How many times longer a step takes on ``nodes - 1`` nodes under the linear-sync model, from the mean GPU
    utilization (percent) at ``nodes``; infinite for the last node."""
    if nodes <= 1:
        return math.inf
    u = min(1.0, max(0.0, util_pct / 100.0))
    m = nodes - 1
    return u * nodes / m + (1.0 - u) * m / nodes


def loss_s(slowdown: float, remaining_s: float | None, restart_s: float) -> float | None:
    """Seconds the remaining run gets longer on one node fewer, plus one restart. None without a time limit, or
    when less than a restart is left of it: the job still runs, so the limit no longer says how long (measured:
    counting such a job's loss as one restart strips it node by node at its end)."""
    if remaining_s is None or remaining_s <= restart_s:
        return None
    return (remaining_s - restart_s) * (slowdown - 1.0) + restart_s


def node_value(w: UnitWork, s: UnitSettings, ctx: Context) -> NodeValue | None:
    """The value of ``w``'s last node, recorded in its inputs; None at one node or without usable metrics."""
    n = w.current
    util = ctx.utilization.get(w.unit_id)
    if n <= 1 or util is None:
        return None
    gate = utilization_gate(util, s, ctx.now)
    if gate.mean is None:
        return None
    slowdown: float | None = None
    source = ""
    state = util.adaptive
    if state is not None:
        per_node = util.gpus_allocated // n if util.gpus_allocated >= n else (
            state.step_model.gpus_per_node if state.step_model is not None else 0)
        now, less = goodput_at(state, n, per_node), goodput_at(state, n - 1, per_node)
        if now is not None and less is not None and less.goodput > 0:
            slowdown, source = now.goodput / less.goodput, "goodput model"
    if slowdown is None:
        sc = scaling(util.throughput, n, s, ctx.now)
        if sc.usable and sc.last_step is not None:
            slowdown, source = speedup_from_efficiency(sc.last_step, n - 1, 1), "throughput"
    if slowdown is None:
        slowdown, source = model_slowdown(gate.mean, n), "utilization model"
    restart = util.restart_s if util.restart_s is not None else float(s.restart_cost_s)
    value = NodeValue(slowdown, source, loss_s(slowdown, w.unit.job.remaining_seconds(ctx.now), restart), restart)
    w.inputs.update({
        "last_node_slowdown": round(slowdown, 3),
        "last_node_source": source,
        "last_node_loss_s": None if value.loss_s is None else round(value.loss_s, 1),
    })
    return value


def victim_key(w: UnitWork) -> tuple[int, float, int, int]:
    """victim_by_goodput: least loss first, then units without a time limit by slowdown, then units without a
    value; then lowest priority, then unit id."""
    v = w.node_value
    if v is None:
        return (2, 0.0, w.priority, w.unit_id)
    if v.loss_s is None:
        return (1, v.slowdown, w.priority, w.unit_id)
    return (0, v.loss_s, w.priority, w.unit_id)


def _donor_ok(w: UnitWork) -> bool:
    """May give a node to a move: above the size it asked for (moves trade what units grew into, never a request),
    free to shrink for others, holding this cycle, with a known loss."""
    v = w.node_value
    asked = w.unit.requested_nodes if w.unit.requested_nodes is not None else w.unit.submitted_nodes
    if asked is not None and w.current <= asked:
        return False
    return (w.reclaim_ok and w.action is Action.HOLD and w.taken == 0 and not w.granted and v is not None
            and v.loss_s is not None and w.current - w.unit.min_nodes > 0 and w.move_to is None
            and w.moved_from is None and bool(w.removal()))


def plan_moves(works: list[UnitWork], fits: Callable[[str, UnitWork, UnitWork], bool]) -> None:
    """goodput_moves: pair the speedup grows refused for want of free nodes (largest saving per node first) with
    the donors whose last node is worth least; ``fits(node, donor, receiver)`` says whether the donor's next node
    would fit the receiver once freed. Results land on the works (``move_to``, ``moved_from``, ``taken``)."""
    receivers = sorted(
        (w for w in works if w.action is Action.GROW and w.gain_s is not None and not w.granted
         and w.final is Reason.NO_FREE_NODES and not w.serving and w.want > 0),
        key=lambda w: (-(w.gain_s or 0.0) / w.want, w.unit_id))
    donors = sorted((w for w in works if _donor_ok(w)), key=victim_key)
    for r in receivers:
        gain = (r.gain_s or 0.0) / r.want  # the saving of one node of its step
        for d in donors:
            if d.move_to is not None or d.unit_id == r.unit_id:
                continue
            v = d.node_value
            assert v is not None and v.loss_s is not None
            if v.loss_s >= gain:
                break  # donors are sorted by loss: no later one pays either
            node = d.removal()[0].node
            if not fits(node, d, r):
                continue
            d.move_to, r.moved_from = r.unit_id, d.unit_id
            d.taken += 1
            d.inputs.update({"move_to": r.unit.job.display_id, "move_node": node,
                             "move_gain_s": round(gain, 1), "move_loss_s": round(v.loss_s, 1)})
            r.inputs.update({"move_from": d.unit.job.display_id, "move_node": node})
            d.message = (f"gives node {node} to unit {r.unit.job.display_id}, whose next node saves {gain:.0f}s "
                         f"net of its restart, where losing it costs this one {v.loss_s:.0f}s (slowdown "
                         f"{v.slowdown:.3f}, {v.source}, with a {v.restart_s:.0f}s restart)")
            r.message += (f"; unit {d.unit.job.display_id} gives it node {node} (GOODPUT_MOVE), taken once "
                          f"free")
            break
