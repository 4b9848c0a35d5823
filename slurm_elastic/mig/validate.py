"""Layout validation and the placement search (the planner).

A layout such as ``{"3g.40gb": 2}`` is valid on a GPU when every profile exists there, the counts respect
each profile's maximum, the compute and memory slices add up, and a real placement exists: every instance
gets one of its profile's allowed start indexes, and no two instances share a memory slice (NVML refuses to
create a GPU instance that overlaps an existing one). The search is exhaustive, so "no placement" is a fact,
not a heuristic's failure; it is tiny (at most 8 memory slices), and deterministic: the same request always
yields the same placement, whatever order the profiles were written in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slurm_elastic.mig.errors import LayoutError, LayoutProblem, MigRejectReason
from slurm_elastic.mig.model import GpuModel, Layout, MigInstance, MigProfile, Placement, describe_counts


def parse_layout(raw: Mapping[str, Any], mig_enabled: bool = True) -> Layout:
    """Turn decoded JSON/YAML such as ``{"3g.40gb": 2}`` into a :class:`Layout`, checking the types."""
    problems: list[LayoutProblem] = []
    counts: dict[str, int] = {}
    for name, count in raw.items():
        if not isinstance(name, str) or not name:
            problems.append(LayoutProblem(MigRejectReason.BAD_COUNT, f"profile names must be strings, got {name!r}"))
            continue
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            problems.append(
                LayoutProblem(
                    MigRejectReason.BAD_COUNT, f"count for {name} must be a whole number >= 0, got {count!r}", name
                )
            )
            continue
        counts[name] = count
    if problems:
        raise LayoutError(problems)
    return Layout.of(counts, mig_enabled)


def check_layout(gpu: GpuModel, layout: Layout) -> tuple[LayoutProblem, ...]:
    """Every reason ``layout`` cannot be built on an empty ``gpu``; empty when it can."""
    return _check(gpu, layout, occupied=())[0]


def plan_layout(
    gpu: GpuModel, layout: Layout, occupied: Sequence[MigInstance] = ()
) -> tuple[MigInstance, ...]:
    """A concrete placement for every instance of ``layout``, sorted by start; raises :class:`LayoutError`.

    ``occupied`` are instances that stay where they are (the planner places around them).
    """
    problems, placed = _check(gpu, layout, occupied)
    if problems:
        raise LayoutError(problems)
    assert placed is not None
    return placed


def check_instances(gpu: GpuModel, instances: Sequence[MigInstance]) -> tuple[LayoutProblem, ...]:
    """Problems with instances that already exist: unknown profile, disallowed placement, overlap."""
    return sort_instances(gpu, instances)[1]


def sort_instances(
    gpu: GpuModel, instances: Sequence[MigInstance]
) -> tuple[tuple[MigInstance, ...], tuple[LayoutProblem, ...]]:
    """Split existing instances into the sound ones and the problems of the others.

    Sound: known profile, allowed placement, no overlap with a sound instance that starts earlier.
    """
    problems: list[LayoutProblem] = []
    taken: list[MigInstance] = []
    for inst in sorted(instances, key=lambda i: (i.placement, i.profile)):
        profile = gpu.profile(inst.profile)
        if profile is None:
            problems.append(_unknown(gpu, inst.profile))
            continue
        if not profile.allows(inst.placement):
            problems.append(
                LayoutProblem(
                    MigRejectReason.BAD_PLACEMENT,
                    f"{inst} is not an allowed placement of {inst.profile} on {gpu.model} "
                    f"(starts {_starts(profile)}, size {profile.memory_slices})",
                    inst.profile,
                )
            )
            continue
        clash = next((t for t in taken if t.placement.overlaps(inst.placement)), None)
        if clash is not None:
            problems.append(LayoutProblem(MigRejectReason.OVERLAP, f"{inst} overlaps {clash}", inst.profile))
            continue
        taken.append(inst)
    return tuple(taken), tuple(problems)


def find_placement(
    gpu: GpuModel, counts: Sequence[tuple[MigProfile, int]], occupied: Sequence[Placement] = ()
) -> tuple[MigInstance, ...] | None:
    """Exhaustive search for non-overlapping allowed placements; None when there is none.

    Instances are placed most-constrained first (fewest allowed starts, then largest), each at the lowest
    free allowed start; instances of one profile take increasing starts, which removes symmetric retries.
    """
    items: list[MigProfile] = []
    for profile, n in counts:
        items.extend([profile] * n)
    items.sort(key=lambda p: (len(p.placement_starts), -p.memory_slices, -p.compute_slices, p.name))

    used = 0
    for pl in occupied:
        used |= _mask(pl)
    chosen: list[MigInstance] = []

    def place(i: int, used: int) -> bool:
        if i == len(items):
            return True
        profile = items[i]
        floor = -1
        if i > 0 and items[i - 1] is profile:
            floor = chosen[-1].placement.start
        for start in profile.placement_starts:
            if start <= floor:
                continue
            pl = Placement(start, profile.memory_slices)
            if pl.end > gpu.memory_slices:
                continue
            mask = _mask(pl)
            if used & mask:
                continue
            chosen.append(MigInstance(profile.name, pl))
            if place(i + 1, used | mask):
                return True
            chosen.pop()
        return False

    if not place(0, used):
        return None
    return tuple(sorted(chosen, key=lambda inst: (inst.placement, inst.profile)))


def _check(
    gpu: GpuModel, layout: Layout, occupied: Sequence[MigInstance]
) -> tuple[tuple[LayoutProblem, ...], tuple[MigInstance, ...] | None]:
    problems: list[LayoutProblem] = []
    if not layout.mig_enabled:
        if layout.counts:
            problems.append(
                LayoutProblem(
                    MigRejectReason.MIG_DISABLED_WITH_INSTANCES,
                    f"MIG is disabled but {describe_counts(layout.counts)} requested on {gpu.model}",
                )
            )
        return tuple(problems), (None if problems else ())

    for name, n in layout.counts:
        if n < 0:
            problems.append(LayoutProblem(MigRejectReason.BAD_COUNT, f"count for {name} must be >= 0, got {n}", name))
    unknown = [name for name, _ in layout.counts if gpu.profile(name) is None]
    problems.extend(_unknown(gpu, name) for name in unknown)
    if problems:
        return tuple(problems), None

    resolved: list[tuple[MigProfile, int]] = []
    for name, n in layout.counts:
        profile = gpu.profile(name)
        assert profile is not None
        resolved.append((profile, n))
    kept = [(gpu.profile(i.profile), i) for i in occupied]
    compute_of = {p.name: p.compute_slices for p in gpu.profiles}
    everything: dict[str, int] = dict(layout.counts)
    for inst in occupied:
        everything[inst.profile] = everything.get(inst.profile, 0) + 1
    described = describe_counts(layout.counts, compute_of)

    compute = sum(p.compute_slices * n for p, n in resolved)
    compute += sum(p.compute_slices for p, _ in kept if p is not None)
    if compute > gpu.compute_slices:
        what = describe_counts(everything.items(), compute_of)
        problems.append(
            LayoutProblem(
                MigRejectReason.COMPUTE_SLICES,
                f"{what} needs {compute} compute slices; {gpu.model} has {gpu.compute_slices}",
            )
        )
    for profile, _ in resolved:
        total = everything[profile.name]
        if total > profile.max_instances:
            problems.append(
                LayoutProblem(
                    MigRejectReason.MAX_INSTANCES,
                    f"{total} × {profile.name} exceeds the maximum of {profile.max_instances} "
                    f"instance{'s' if profile.max_instances > 1 else ''} of {profile.name} on {gpu.model}",
                    profile.name,
                )
            )
    memory = sum(p.memory_slices * n for p, n in resolved) + sum(i.placement.size for i in occupied)
    if memory > gpu.memory_slices:
        what = describe_counts(everything.items(), compute_of)
        problems.append(
            LayoutProblem(
                MigRejectReason.MEMORY_SLICES,
                f"{what} needs {memory} memory slices; {gpu.model} has {gpu.memory_slices}",
            )
        )
    if problems:
        return tuple(problems), None

    placed = find_placement(gpu, resolved, [i.placement for i in occupied])
    if placed is None:
        where = f" next to the kept {', '.join(str(i) for i in occupied)}" if occupied else ""
        hint = "; ".join(
            f"{p.name} starts at {_starts(p)}" for p, _ in sorted(resolved, key=lambda r: r[0].name)
        )
        return (
            (
                LayoutProblem(
                    MigRejectReason.NO_PLACEMENT, f"no valid placement: {described} on {gpu.model}{where} ({hint})"
                ),
            ),
            None,
        )
    return (), placed


def _unknown(gpu: GpuModel, name: str) -> LayoutProblem:
    return LayoutProblem(
        MigRejectReason.UNKNOWN_PROFILE,
        f"unknown profile {name} for {gpu.model} (known: {', '.join(gpu.profile_names())})",
        name,
    )


def _starts(profile: MigProfile) -> str:
    return "/".join(str(s) for s in profile.placement_starts)


def _mask(pl: Placement) -> int:
    return ((1 << pl.size) - 1) << pl.start
