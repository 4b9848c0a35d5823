"""Which nodes a shrink gives back, and in what order.

Order: pending extension jobs are always cancelled (they hold no node yet but would grow the job again);
then running extension jobs, newest first, each from its last node to its own first node; then the leader's
nodes from the last one, never its keep host (the batch host). Each extension job's first node goes last, so
an extension job that loses only part of its nodes is shrunk in place and keeps its batch host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from slurm_elastic.policy.model import ElasticUnit, ExtensionJob, ExtensionShrink, ShrinkPlan


@dataclass(frozen=True)
class Removable:
    node: str
    extension: int | None  # job id, or None for the leader


def _when(ext: ExtensionJob) -> datetime | None:
    return ext.start_time or ext.submit_time


def newest_first(exts: list[ExtensionJob]) -> list[ExtensionJob]:
    """Newest first by start (else submit) time, then higher job id; extensions without a time count oldest."""
    timed = sorted((e for e in exts if _when(e) is not None), key=lambda e: (_when(e), e.job_id), reverse=True)
    untimed = sorted((e for e in exts if _when(e) is None), key=lambda e: e.job_id, reverse=True)
    return timed + untimed


def _ext_order(ext: ExtensionJob) -> list[str]:
    host = ext.batch_host if ext.batch_host in ext.nodes else ext.nodes[0]
    rest = [n for n in ext.nodes if n != host]
    return [*reversed(rest), host]


def removal_order(unit: ElasticUnit) -> list[Removable]:
    """Every node the unit could give back, first to go first (the keep host is never in it)."""
    order: list[Removable] = []
    for ext in newest_first([e for e in unit.extensions if e.is_running and e.nodes]):
        order.extend(Removable(n, ext.job_id) for n in _ext_order(ext))
    keep = unit.keep_host
    order.extend(Removable(n, None) for n in reversed(unit.job.nodes) if n != keep)
    return order


def plan_shrink(unit: ElasticUnit, order: list[Removable], amount: int, admits: tuple[int, ...] = ()) -> ShrinkPlan:
    """The plan that gives back the first ``amount`` nodes of ``order`` (from :func:`removal_order`)."""
    gone = order[:amount]
    gone_set = {r.node for r in gone}
    cancel = [e.job_id for e in sorted(unit.pending_extensions, key=lambda e: e.job_id)]
    partial: ExtensionShrink | None = None
    by_id = {e.job_id: e for e in unit.extensions}
    seen: list[int] = []
    for r in gone:
        if r.extension is not None and r.extension not in seen:
            seen.append(r.extension)
    for ext_id in seen:
        ext = by_id[ext_id]
        keep = tuple(n for n in ext.nodes if n not in gone_set)
        if keep:
            partial = ExtensionShrink(ext_id, keep)
        else:
            cancel.append(ext_id)
    leader_keep: tuple[str, ...] | None = None
    if any(r.extension is None for r in gone):
        leader_keep = tuple(n for n in unit.job.nodes if n not in gone_set)
    return ShrinkPlan(
        cancel_extensions=tuple(cancel),
        shrink_extension=partial,
        leader_keep_nodes=leader_keep,
        released_nodes=tuple(r.node for r in gone),
        admits=admits,
    )


def time_limit_extension_s(remaining_s: float | None, before: int, after: int, cap_s: int) -> int:
    """Seconds to add to a job's time limit when it shrinks from ``before`` to ``after`` nodes.

    At worst linear scaling the remaining work takes ``before / after`` times as long on fewer nodes, so the
    limit grows by ``remaining * (before / after - 1)``: nodes x time left stays what it was. Rounded up to
    whole minutes (Slurm's unit), at most ``cap_s`` rounded down to whole minutes. No limit (None), no time
    left, or no shrink: 0.
    """
    if remaining_s is None or remaining_s <= 0 or after <= 0 or after >= before:
        return 0
    minutes = math.ceil(remaining_s * (before - after) / after / 60 - 1e-9)
    return min(minutes, cap_s // 60) * 60


def time_limit_giveback_s(remaining_s: float | None, before: int, after: int, added_s: int) -> int:
    """Seconds to take off a job's time limit when it grows from ``before`` to ``after`` nodes: the mirror of
    :func:`time_limit_extension_s`. The remaining work now takes ``before / after`` of the time left, so
    ``remaining * (1 - before / after)`` is no longer needed; at most ``added_s`` (what shrinks added and was
    not given back), so the limit never ends below what the user asked for. Whole minutes, rounded down."""
    if remaining_s is None or remaining_s <= 0 or added_s <= 0 or before <= 0 or after <= before:
        return 0
    spare_min = math.floor(remaining_s * (after - before) / after / 60 + 1e-9)
    return min(spare_min * 60, added_s // 60 * 60)

