"""What the ``verify`` steps check (pure): the agent reports the requested layout, Slurm shows the expected GRES
and the node's slurmd registered since the restart."""

from __future__ import annotations

from slurm_elastic.mig.model import Layout, NodeLayout, describe_counts
from slurm_elastic.mig.ports import NodeStatus
from slurm_elastic.mig.slurmconf import gres_summary
from slurm_elastic.mig.wire import NodeMigReport


def layout_matches(report: NodeMigReport, requested: NodeLayout) -> list[str]:
    """Mismatches between what the agent reports and ``requested`` (empty when they agree)."""
    out = []
    for index, layout in requested.gpus:
        g = report.gpu(index)
        if g is None:
            out.append(f"GPU {index} missing")
            continue
        have = g.state.layout()
        if have != layout:
            out.append(f"GPU {index}: {_describe(have)} instead of {_describe(layout)}")
    return out


def _describe(layout: Layout) -> str:
    return "MIG off" if not layout.mig_enabled else describe_counts(layout.counts)


SLURMD_START_SLACK_S = 2.0  # the node's clock against ours (NTP-synced hosts); slurmd reports its own start time


def gres_mismatch(expected: str, status: NodeStatus, restarted_at: float | None = None) -> str | None:
    """Why Slurm does not (yet) show ``expected`` for the node. ``restarted_at``: the slurmd must have started
    since then, i.e. registered its new gres.conf (slurmctld shows the new Gres= from slurm.conf before that)."""
    want, have = gres_summary(expected), gres_summary(status.gres)
    if want != have:
        return f"Slurm shows Gres={status.gres or '(none)'} for {status.name}, expected {expected}"
    if restarted_at is not None and (status.slurmd_started_at is None
                                     or status.slurmd_started_at < restarted_at - SLURMD_START_SLACK_S):
        return f"slurmd on {status.name} has not registered since the restart"
    if not status.registered:
        return f"{status.name} is {status.state}+{'+'.join(status.flags)} (not registered with its new GRES yet)"
    return None
