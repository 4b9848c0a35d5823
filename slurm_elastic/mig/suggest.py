"""``mig suggest``: which GPUs to repartition so that pending jobs asking for MIG types (or whole GPUs) can run.

Pure: it works on values read beforehand (pending jobs' GPU requests, each GPU node's free GRES in Slurm, the
agents' MIG reports). Rules, in order:

1. Demand per Slurm GPU type is the pending jobs' ``gpu:<type>:<n>`` per node times their node count; a MIG type
   is one that is a profile of some GPU model reported by the agents (``1g.10gb``, ``1g.10gb_me``).
2. Free supply per type is what in-service nodes have unallocated in Slurm. The shortfall is demand minus supply.
3. Only GPUs of **idle** nodes (in service, no jobs) are candidates: a repartition drains the node. Whole GPUs
   are converted first, but never so many that pending whole-GPU requests lose their GPUs; then MIG GPUs whose
   layout has none of the wanted type. A GPU is filled with as many instances of the type as fit.
4. A whole-GPU shortfall is covered by turning MIG off on idle nodes' MIG GPUs whose types nobody waits for.

Each suggestion has a stable reason code and a message with its numbers; nothing applies one by itself (an
administrator runs the ``mig apply`` the CLI prints). Output order is deterministic (node, then GPU index).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from slurm_elastic.mig.gres import profile_for_slurm_type, slurm_type_for_profile
from slurm_elastic.mig.model import GpuModel, Layout, NodeLayout, describe_counts
from slurm_elastic.mig.validate import check_layout
from slurm_elastic.mig.wire import GpuMigReport, NodeMigReport


class SuggestReason(StrEnum):
    MIG_SHORTFALL = "MIG_SHORTFALL"  # pending jobs want a MIG type nobody has free
    WHOLE_GPU_SHORTFALL = "WHOLE_GPU_SHORTFALL"  # pending jobs want whole GPUs; idle MIG GPUs could give them
    UNMET = "UNMET"  # no idle GPU can cover (part of) a shortfall


@dataclass(frozen=True)
class PendingRequest:
    job_id: int
    gpu_type: str | None  # None: any GPU (untyped request)
    count: int  # GPUs per node
    nodes: int = 1


@dataclass(frozen=True)
class GpuNodeView:
    name: str
    idle: bool  # in service and without jobs
    free: Mapping[str, int]  # Slurm: unallocated gpu count per type ("" for untyped)
    report: NodeMigReport | None


@dataclass(frozen=True)
class Suggestion:
    node: str
    layout: NodeLayout  # only the GPUs to change
    reason: SuggestReason
    message: str
    covers: Mapping[str, int] = field(default_factory=dict)  # Slurm type -> GPUs it adds


@dataclass(frozen=True)
class Unmet:
    gpu_type: str
    missing: int
    message: str
    reason: SuggestReason = SuggestReason.UNMET


@dataclass(frozen=True)
class SuggestResult:
    demand: Mapping[str, int]
    free: Mapping[str, int]
    suggestions: tuple[Suggestion, ...]
    unmet: tuple[Unmet, ...]


WHOLE = "(whole GPU)"


def _mig_types(nodes: Sequence[GpuNodeView]) -> dict[str, set[str]]:
    """Slurm MIG type -> the GPU model labels that offer it."""
    out: dict[str, set[str]] = {}
    for n in nodes:
        for g in n.report.gpus if n.report else ():
            if g.model is not None:
                for p in g.model.profiles:
                    out.setdefault(slurm_type_for_profile(p.name), set()).add(g.model.model)
    return out


def _max_fill(model: GpuModel, profile: str) -> int:
    p = model.profile(profile)
    if p is None:
        return 0
    for k in range(p.max_instances, 0, -1):
        if not check_layout(model, Layout.of({profile: k})):
            return k
    return 0


def suggest(pending: Sequence[PendingRequest], nodes: Sequence[GpuNodeView]) -> SuggestResult:
    mig_types = _mig_types(nodes)
    demand: dict[str, int] = {}
    for r in pending:
        key = r.gpu_type if r.gpu_type in mig_types else WHOLE
        demand[key] = demand.get(key, 0) + r.count * max(r.nodes, 1)
    free: dict[str, int] = {}
    for n in nodes:
        for t, c in n.free.items():
            key = t if t in mig_types else WHOLE
            if c > 0:
                free[key] = free.get(key, 0) + c
    short = {t: d - free.get(t, 0) for t, d in demand.items() if d > free.get(t, 0)}

    taken: set[tuple[str, int]] = set()
    per_node: dict[str, dict[int, Layout]] = {}
    covers: dict[str, dict[str, int]] = {}
    messages: dict[str, list[str]] = {}
    reasons: dict[str, SuggestReason] = {}
    unmet: list[Unmet] = []
    idle = sorted((n for n in nodes if n.idle and n.report is not None), key=lambda n: n.name)

    # Whole GPUs that may be converted: free whole GPUs beyond what whole-GPU requests wait for.
    spare_whole = max(free.get(WHOLE, 0) - demand.get(WHOLE, 0), 0)
    for t in sorted((t for t in short if t != WHOLE), key=lambda t: (-short[t], t)):
        missing = short[t]
        profile = profile_for_slurm_type(t)
        candidates: list[tuple[int, str, GpuMigReport]] = []
        for n in idle:
            assert n.report is not None
            for g in n.report.gpus:
                if g.model is None or (n.name, g.index) in taken or g.model.profile(profile) is None:
                    continue
                if not g.state.mig_enabled:
                    candidates.append((0, n.name, g))
                elif profile not in g.state.layout().as_dict():
                    candidates.append((1, n.name, g))
        for kind, node, g in sorted(candidates, key=lambda c: (c[0], c[1], c[2].index)):
            if missing <= 0:
                break
            if kind == 0:
                if spare_whole <= 0:
                    continue
                spare_whole -= 1
            assert g.model is not None
            k = _max_fill(g.model, profile)
            if k == 0:
                continue
            taken.add((node, g.index))
            per_node.setdefault(node, {})[g.index] = Layout.of({profile: k})
            covers.setdefault(node, {})[t] = covers.get(node, {}).get(t, 0) + k
            was = "whole" if kind == 0 else describe_counts(g.state.layout().counts)
            messages.setdefault(node, []).append(
                f"GPU {g.index} ({was}) -> {k} x {profile}: {demand[t]} GPU(s) of type {t} pending, "
                f"{free.get(t, 0)} free")
            reasons.setdefault(node, SuggestReason.MIG_SHORTFALL)
            missing -= k
        if missing > 0:
            unmet.append(Unmet(t, missing, f"{missing} more {t} needed; no idle GPU can be repartitioned for it"))

    if WHOLE in short:
        missing = short[WHOLE]
        wanted_mig = {profile_for_slurm_type(t) for t in demand if t != WHOLE}
        for n in idle:
            assert n.report is not None
            for g in n.report.gpus:
                if missing <= 0:
                    break
                if g.model is None or not g.state.mig_enabled or (n.name, g.index) in taken:
                    continue
                if set(g.state.layout().as_dict()) & wanted_mig:
                    continue  # pending jobs want these instances
                taken.add((n.name, g.index))
                per_node.setdefault(n.name, {})[g.index] = Layout.disabled()
                wt = g.model.slurm_type or WHOLE
                covers.setdefault(n.name, {})[wt] = covers.get(n.name, {}).get(wt, 0) + 1
                messages.setdefault(n.name, []).append(
                    f"GPU {g.index} ({describe_counts(g.state.layout().counts)}) -> MIG off: {demand[WHOLE]} "
                    f"whole GPU(s) pending, {free.get(WHOLE, 0)} free")
                reasons.setdefault(n.name, SuggestReason.WHOLE_GPU_SHORTFALL)
                missing -= 1
        if missing > 0:
            unmet.append(Unmet(WHOLE, missing, f"{missing} more whole GPU(s) needed; no idle MIG GPU to turn off"))

    suggestions = tuple(
        Suggestion(node=node, layout=NodeLayout.of(per_node[node]), reason=reasons[node],
                   message="; ".join(messages[node]), covers=dict(sorted(covers[node].items())))
        for node in sorted(per_node)
    )
    return SuggestResult(dict(sorted(demand.items())), dict(sorted(free.items())), suggestions, tuple(unmet))
