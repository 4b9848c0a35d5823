"""``mig plan``: what ``mig apply`` would do to a node, computed without changing anything (pure).

From the agent's report (the GPUs now and the profiles NVML offers), Slurm's view of the node (its GRES, its
jobs) and the current slurm.conf / gres.conf texts, it gives the per-GPU diff, the Slurm GRES before and after,
the gres.conf lines to be written and the jobs the change waits for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from slurm_elastic.mig.diff import GpuDiff, diff_node
from slurm_elastic.mig.gres import render_node_gres_config
from slurm_elastic.mig.model import GpuState, NodeLayout
from slurm_elastic.mig.ports import JobOnNode, NodeStatus, WorkflowSettings
from slurm_elastic.mig.slurmconf import node_gres_lines, node_gres_value
from slurm_elastic.mig.wire import NodeMigReport


@dataclass(frozen=True)
class NodePlan:
    node: str
    diffs: tuple[GpuDiff, ...]
    slurm_gres_now: str  # what Slurm shows now
    conf_gres_now: str | None  # Gres= in slurm.conf now
    gres_after: str
    lines_now: tuple[str, ...]
    lines_after: tuple[str, ...]
    lines_provisional: bool  # device files depend on instance ids that exist only after the apply
    jobs: tuple[JobOnNode, ...]  # the workflow waits for these (drained first: no new ones start)
    node_state: str
    notes: tuple[str, ...] = ()

    @property
    def is_noop(self) -> bool:
        return all(d.is_noop for d in self.diffs) and self.gres_after == (self.conf_gres_now or "")

    def describe(self) -> list[str]:
        out = [f"node {self.node} ({self.node_state})"]
        changes = [line for d in self.diffs for line in d.describe()]
        out += ["GPU changes:", *(f"  {c}" for c in changes)] if changes else ["GPU changes: none"]
        out.append(f"Slurm Gres=: {self.conf_gres_now or '(none)'} -> {self.gres_after}"
                   f"   (Slurm shows {self.slurm_gres_now or '(none)'})")
        out.append("gres.conf lines now:")
        out += [f"  {line}" for line in self.lines_now] or ["  (none)"]
        out.append("gres.conf lines after" + (" (device files fixed after the apply):" if self.lines_provisional
                                                else ":"))
        out += [f"  {line}" for line in self.lines_after]
        if self.jobs:
            out.append("jobs it waits for (the node is drained first, so no new job starts there):")
            out += [f"  {j.job_id} {j.user} {j.state}" for j in self.jobs]
        else:
            out.append("jobs affected: none running on the node")
        out += [f"note: {n}" for n in self.notes]
        return out


def planned_states(report: NodeMigReport, diffs: Sequence[GpuDiff]) -> tuple[GpuState, ...]:
    """Every GPU's state after the diffs: kept instances keep their ids, created ones have none yet."""
    by_index = {d.gpu_index: d for d in diffs}
    out = []
    for g in report.gpus:
        d = by_index.get(g.index)
        if d is None:
            out.append(g.state)
        else:
            out.append(replace(g.state, mig_enabled=d.requested.mig_enabled, mig_pending=None,
                               instances=tuple(sorted((*d.keep, *d.create), key=lambda i: (i.placement, i.profile)))))
    return tuple(out)


def plan_node_change(
    node: str,
    report: NodeMigReport,
    requested: NodeLayout,
    settings: WorkflowSettings,
    *,
    status: NodeStatus,
    jobs: Sequence[JobOnNode],
    slurm_text: str,
    gres_text: str,
) -> NodePlan:
    """Raises :class:`~slurm_elastic.mig.errors.LayoutError` when the layout cannot be built on the node."""
    diffs = diff_node(report.models(), report.states(), requested)
    after = NodeMigReport(report.node, tuple(replace(g, state=s) for g, s in
                                             zip(report.gpus, planned_states(report, diffs), strict=True)),
                          report.mig_minors)
    config = render_node_gres_config(node, after, device_files=settings.device_files,
                                     mps_per_gpu=settings.mps_per_gpu, autodetect_off=settings.autodetect_off,
                                     whole_gpu_type=settings.whole_gpu_type, planned=True)
    provisional = any(line.endswith("after the apply>") for line in config.gres_lines)
    notes = tuple(n for g in report.gpus for n in g.notes)
    return NodePlan(
        node=node,
        diffs=diffs,
        slurm_gres_now=status.gres,
        conf_gres_now=node_gres_value(slurm_text, node),
        gres_after=config.node_gres,
        lines_now=node_gres_lines(gres_text, node),
        lines_after=config.gres_lines,
        lines_provisional=provisional,
        jobs=tuple(jobs),
        node_state="+".join((status.state, *status.flags)),
        notes=notes,
    )
