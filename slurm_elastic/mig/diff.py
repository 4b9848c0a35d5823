"""What must change on a GPU to go from its current instances to a requested layout.

Like mig-parted's ``apply``, which reuses ``assert``: only what is missing is created and only what is in
the way or not requested is destroyed, so applying the result and diffing again yields nothing to do.
Instances that can stay are kept in place (jobs do not run on them during a change, but keeping them keeps
their device nodes, UUIDs and Slurm GRES records stable); the planner places the new ones around them, and
when it cannot, fewer instances are kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from slurm_elastic.mig.errors import LayoutError, LayoutProblem, MigRejectReason
from slurm_elastic.mig.model import GpuModel, GpuState, Layout, MigInstance, NodeLayout
from slurm_elastic.mig.validate import check_layout, plan_layout, sort_instances


@dataclass(frozen=True)
class GpuDiff:
    """The changes for one GPU, in the order they must be made: destroy, set MIG mode, create."""

    gpu_index: int
    model: str
    destroy: tuple[MigInstance, ...]
    set_mig_mode: bool | None  # None: the mode is already right
    create: tuple[MigInstance, ...]
    keep: tuple[MigInstance, ...]
    requested: Layout

    @property
    def is_noop(self) -> bool:
        return not self.destroy and not self.create and self.set_mig_mode is None

    def describe(self) -> list[str]:
        """One line per change, e.g. ``GPU 0: destroy 1g.10gb@0:1 gi=7``."""
        lines = [f"GPU {self.gpu_index}: destroy {inst}" for inst in self.destroy]
        if self.set_mig_mode is not None:
            lines.append(f"GPU {self.gpu_index}: {'enable' if self.set_mig_mode else 'disable'} MIG mode")
        lines += [f"GPU {self.gpu_index}: create {inst}" for inst in self.create]
        return lines


def diff_gpu(gpu: GpuModel, current: GpuState, requested: Layout) -> GpuDiff:
    """Changes that turn ``current`` into ``requested``; raises :class:`LayoutError` if it cannot be built.

    Current instances are kept when their profile is requested, their placement is allowed, they do not
    overlap, and they are complete (an instance reported with a GPU instance id but no compute instance id
    is a GPU instance without its compute instance, so it is rebuilt).
    """
    problems = check_layout(gpu, requested)
    if problems:
        raise LayoutError(problems)

    if not requested.mig_enabled:
        return GpuDiff(
            gpu_index=current.index,
            model=gpu.model,
            destroy=_destroy_order(current.instances),
            set_mig_mode=False if current.mig_enabled else None,
            create=(),
            keep=(),
            requested=requested,
        )

    set_mode = None if current.mig_enabled else True
    candidates = _keepable(gpu, current, requested) if current.mig_enabled else []
    keep, create = _best_keep(gpu, requested, candidates)
    kept_set = set(keep)
    destroy = tuple(i for i in current.instances if i not in kept_set)
    return GpuDiff(
        gpu_index=current.index,
        model=gpu.model,
        destroy=_destroy_order(destroy),
        set_mig_mode=set_mode,
        create=create,
        keep=tuple(sorted(keep, key=lambda i: (i.placement, i.profile))),
        requested=requested,
    )


def diff_node(
    models: Mapping[int, GpuModel], current: Sequence[GpuState], requested: NodeLayout
) -> tuple[GpuDiff, ...]:
    """Per-GPU diffs for the GPUs ``requested`` names; every problem of every GPU is raised at once."""
    by_index = {g.index: g for g in current}
    diffs: list[GpuDiff] = []
    problems: list[LayoutProblem] = []
    for index, layout in requested.gpus:
        state = by_index.get(index)
        gpu = models.get(index)
        if state is None or gpu is None:
            problems.append(LayoutProblem(MigRejectReason.UNKNOWN_PROFILE, f"GPU {index} does not exist on this node"))
            continue
        try:
            diffs.append(diff_gpu(gpu, state, layout))
        except LayoutError as exc:
            problems.extend(
                LayoutProblem(p.code, f"GPU {index}: {p.message}", p.profile) for p in exc.problems
            )
    if problems:
        raise LayoutError(problems)
    return tuple(diffs)


def _keepable(gpu: GpuModel, current: GpuState, requested: Layout) -> list[MigInstance]:
    wanted = requested.as_dict()
    sound, _ = sort_instances(gpu, current.instances)
    return [
        inst
        for inst in sound
        if inst.profile in wanted
        and not (inst.gpu_instance_id is not None and inst.compute_instance_id is None)
    ]


def _best_keep(
    gpu: GpuModel, requested: Layout, candidates: list[MigInstance]
) -> tuple[list[MigInstance], tuple[MigInstance, ...]]:
    """Keep as many candidates as possible; the first subset (in a fixed order) that still plans wins."""
    wanted = requested.as_dict()
    for size in range(len(candidates), -1, -1):
        for subset in combinations(candidates, size):
            counts: dict[str, int] = {}
            for inst in subset:
                counts[inst.profile] = counts.get(inst.profile, 0) + 1
            if any(n > wanted.get(name, 0) for name, n in counts.items()):
                continue
            remaining = {name: n - counts.get(name, 0) for name, n in wanted.items()}
            try:
                create = plan_layout(gpu, Layout.of(remaining), occupied=subset)
            except LayoutError:
                continue
            return list(subset), create
    # Unreachable: the empty subset plans because check_layout accepted the request on an empty GPU.
    raise AssertionError("an empty GPU must fit a validated layout")


def _destroy_order(instances: Sequence[MigInstance]) -> tuple[MigInstance, ...]:
    return tuple(sorted(instances, key=lambda i: (i.placement, i.profile)))
