"""GPU-granular growth (``gpu_granular_growth``): a grow that found no whole free node takes a few GPUs of a
node that is already partly used, as one extension job with ``--gres=gpu:k`` on that node.

Slurm's cons_tres lets two jobs share a node when each holds part of its GPUs (and CPUs), so an extension job
may hold ``k`` GPUs of a node that another job also uses. The torch templates start one
worker per GPU the task holds, so such an extension adds ``k`` workers to the rendezvous. A shrink gives the
``k`` GPUs back by cancelling that extension job (extensions go first, newest first: policy/shrink.py).

This runs after the walk (policy/walk.py), on the units whose grow the walk refused with NO_FREE_NODES, and
only on partly used nodes, which the walk's pool never hands out: the two never compete for a node. Rules:

* **Who.** A unit whose settings have ``gpu_granular_growth`` and whose job did not ask for whole nodes
  (``#ELASTIC --whole-nodes``, e.g. NVLink), with GPUs per node. Units under an extension quota, fair share,
  a growth cap or Slurm GPU limits keep whole nodes: those counts are the walk's, in nodes.
* **What is free.** GPUs of available nodes in the unit's partition that are partly allocated (MIXED), not
  requested by a pending extension job, not flagged (completing, reserved, planned, draining, ...).
* **Pending jobs first, all of them.** Each pending job of the partition (highest priority first) reserves its
  GPUs on partly used nodes: for each node it asks, the best fit (fewest free) where its GPUs per node fit, else
  the most free GPUs there are, since Slurm may start a job that asks GPUs per job (``--gpus``) on several
  partly used nodes, and its backfill starts lower-priority jobs on free GPUs too. Grows get what is left, in
  priority order. Measured in the simulator (docs/performance.md, "GPU-granular growth"): reserving only for
  pending jobs of higher priority, or only where one of their nodes fits, let grows take GPUs that arrivals
  then waited for (fixed batch up to 1.04x whole-node's average JCT; 1.01x at worst with this rule).
* **Which node.** Never one of the unit's own nodes (a unit counts its size in the nodes it spans, and its
  bounds are in nodes); the node with the most free GPUs, then natural name order. The extension takes
  ``min(free, the unit's GPUs per node)`` GPUs and counts as one node of the unit. One node per grow: a later
  cycle grows again if it still pays.

Pure: reads the snapshot and the walk's results, returns decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from slurm_elastic.policy.capacity import _NOT_FREE_FLAGS, natural_key
from slurm_elastic.policy.model import Decision, GrowPlan, PolicyInput
from slurm_elastic.policy.reasons import Action, Reason
from slurm_elastic.policy.work import Context, UnitWork
from slurm_elastic.slurm.model import GresCount, Job, Node


@dataclass
class _Spare:
    """Free GPUs of one partly used node, by GPU type (None: any type)."""

    node: Node
    free: dict[str | None, int]

    def count(self, gtype: str | None) -> int:
        return self.free.get(gtype, 0) if gtype is not None else self.free.get(None, 0)

    def take(self, gtype: str | None, k: int) -> None:
        self.free[None] = self.free.get(None, 0) - k
        if gtype is not None:
            self.free[gtype] = self.free.get(gtype, 0) - k


def _gpu_type(job: Job) -> str | None:
    return next((g.type for g in job.gres_per_node if g.name == "gpu"), None)


def eligible(w: UnitWork, inp: PolicyInput) -> bool:
    """A grow the walk refused for want of whole free nodes, of a unit that may grow by GPUs."""
    s = w.settings
    if (w.action is not Action.GROW or w.granted or w.final is not Reason.NO_FREE_NODES or s is None
            or not s.gpu_granular_growth or w.unit.spec.whole_nodes or w.unit.job.gpus_per_node() <= 0):
        return False
    under_quota = (s.max_extension_nodes_per_account >= 0 or s.max_extension_nodes_per_qos >= 0
                   or s.max_extension_gpus_per_account >= 0 or s.max_extension_gpus_per_qos >= 0
                   or s.fair_share or s.growth_cap_percent < 100 or bool(inp.gpu_limits))
    return not under_quota


def spare_gpus(inp: PolicyInput) -> dict[str, _Spare]:
    """Partly used nodes with free GPUs, by name."""
    requested = {n for u in inp.units for e in u.pending_extensions for n in e.nodes}
    out: dict[str, _Spare] = {}
    for node in inp.snapshot.nodes:
        if (node.state != "MIXED" or not node.is_available or node.name in requested
                or _NOT_FREE_FLAGS.intersection(node.state_flags)):
            continue
        used = node.gpus_used()
        total = node.gpus()
        if used <= 0 or used >= total:
            continue
        free: dict[str | None, int] = {None: total - used}
        for g in node.gres:
            if g.name == "gpu" and g.type is not None:
                taken = sum(u.count for u in node.gres_used if u.name == "gpu" and u.type == g.type)
                free[g.type] = min(free.get(g.type, 0) + g.count - taken, total - used)
        out[node.name] = _Spare(node, free)
    return out


def grow_by_gpus(decisions: Sequence[Decision], works: Sequence[UnitWork], inp: PolicyInput,
                 ctx: Context) -> list[Decision]:
    """``decisions`` with each eligible refused grow turned into a grow of k GPUs on a partly used node."""
    candidates = [w for w in works if eligible(w, inp)]
    if not candidates:
        return list(decisions)
    spare = spare_gpus(inp)
    if not spare:
        return list(decisions)
    units = {u.unit_id for u in inp.units}
    ext_ids = {e.job_id for u in inp.units for e in u.extensions}
    pending = [j for j in inp.snapshot.jobs
               if j.state == "PENDING" and j.job_id not in units and j.job_id not in ext_ids]
    for j in sorted(pending, key=lambda j: (-j.priority, j.job_id)):
        _reserve(j, spare)
        if not any(sp.count(None) > 0 for sp in spare.values()):
            return list(decisions)  # pending jobs could use every free GPU there is
    grown: dict[int, Decision] = {}
    by_unit = {d.unit_id: d for d in decisions}
    for w in sorted(candidates, key=lambda w: (-w.priority, w.unit_id)):
        made = _grant(w, spare, by_unit[w.unit_id], ctx)
        if made is not None:
            grown[w.unit_id] = made
    return [grown.get(d.unit_id, d) for d in decisions]


def _reserve(job: Job, spare: dict[str, _Spare]) -> None:
    """The pending job's GPUs, per node where one of its nodes fits (best fit), else wherever they are free:
    Slurm may start a job that asks GPUs per job (``--gpus``) on several partly used nodes."""
    gpn, gtype = job.gpus_per_node(), _gpu_type(job)
    if gpn <= 0:
        return
    parts = set(job.partition.split(","))
    usable = [s for s in spare.values() if parts.intersection(s.node.partitions)]
    left = gpn * max(1, job.node_count)
    while left > 0:
        want = min(gpn, left)
        fits = [s for s in usable if s.count(gtype) >= want]
        if fits:
            best = min(fits, key=lambda s: (s.count(gtype), natural_key(s.node.name)))
        else:
            some = [s for s in usable if s.count(gtype) > 0]
            if not some:
                return
            best = max(some, key=lambda s: s.count(gtype))
            want = best.count(gtype)
        best.take(gtype, want)
        left -= want


def _grant(w: UnitWork, spare: dict[str, _Spare], held: Decision, ctx: Context) -> Decision | None:
    job = w.unit.job
    gpn, gtype = job.gpus_per_node(), _gpu_type(job)
    own = set(job.nodes) | {n for e in w.unit.extensions for n in e.nodes}
    fits = [s for s in spare.values()
            if s.count(gtype) > 0 and job.partition in s.node.partitions and s.node.name not in own]
    if not fits:
        return None
    best = min(fits, key=lambda s: (-s.count(gtype), natural_key(s.node.name)))
    k = min(best.count(gtype), gpn)
    best.take(gtype, k)
    remaining = job.remaining_seconds(ctx.now)
    gres = (GresCount("gpu", gtype, k),)
    grow = GrowPlan(nodes=(best.node.name,), partition=job.partition, gres_per_node=gres,
                    tres_per_node=f"gres/gpu:{k}", user=job.user, account=job.account, qos=job.qos,
                    time_limit_s=None if remaining is None else max(0, int(remaining)))
    message = w.message.rsplit(", but ", 1)[0]
    message += (f"; no whole node free: +{k} GPU(s) on {best.node.name}, a node other jobs use (gpu_granular_growth "
                f"{w.settings.source('gpu_granular_growth') if w.settings is not None else 'default'})")
    inputs = dict(held.inputs)
    inputs.update({"grow_gpus": k, "grow_node": best.node.name, "gpus_per_node": gpn})
    return replace(held, action=Action.GROW, target_nodes=w.current + 1, reason=w.reason, message=message,
                   inputs=MappingProxyType(inputs), grow=grow)
