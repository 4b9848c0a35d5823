"""Typed, immutable values of the MIG core: profiles, GPU models, placements, layouts and instances.

Everything here is plain data. The rules that combine them live in :mod:`slurm_elastic.mig.validate`,
:mod:`slurm_elastic.mig.diff` and friends; nothing here talks to a GPU, a file or the clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

# NVIDIA GPU instance profile names: "<compute>g.<memory>gb" plus optional attributes such as "+me",
# "+me.all", "+gfx" or "-me" (MIG user guide, "Supported MIG Profiles", profile references).
PROFILE_NAME_RE = re.compile(
    r"^(?P<compute>[1-9][0-9]*)g\.(?P<memory>[0-9]+)gb(?P<attrs>(?:[+-][a-z]+(?:\.[a-z]+)*)*)$"
)


@dataclass(frozen=True, order=True)
class Placement:
    """Where a GPU instance sits: NVML's ``nvmlGpuInstancePlacement_t`` (units are memory slices)."""

    start: int
    size: int

    @property
    def end(self) -> int:
        """One past the last occupied memory slice."""
        return self.start + self.size

    def slices(self) -> range:
        return range(self.start, self.end)

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"{self.start}:{self.size}"


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile of one GPU model, e.g. ``3g.40gb`` on an H100-80GB."""

    name: str
    compute_slices: int
    memory_slices: int
    max_instances: int
    placement_starts: tuple[int, ...]
    profile_id: int | None = None  # nvmlGpuInstanceProfileInfo_t.id, the "ID" column of nvidia-smi mig -lgip
    nvml_profile: str | None = None  # NVML_GPU_INSTANCE_PROFILE_* constant name

    def placements(self) -> tuple[Placement, ...]:
        return tuple(Placement(s, self.memory_slices) for s in self.placement_starts)

    def allows(self, placement: Placement) -> bool:
        return placement.size == self.memory_slices and placement.start in self.placement_starts


@dataclass(frozen=True)
class GpuModel:
    """A MIG-capable GPU model and its profiles, from the catalog or built from what NVML reports."""

    model: str
    compute_slices: int
    memory_slices: int
    profiles: tuple[MigProfile, ...]
    description: str = ""
    nvml_names: tuple[str, ...] = ()
    pci_device_ids: tuple[str, ...] = ()
    slurm_type: str | None = None  # Slurm GRES type for the whole GPU when MIG is off
    memory_gb: int | None = None
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def profile(self, name: str) -> MigProfile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None

    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)


@dataclass(frozen=True)
class Layout:
    """A requested layout for one GPU: MIG on or off, and how many instances of each profile.

    Counts are kept sorted by profile name and without zero entries, so equal layouts compare equal
    whatever order they were written in.
    """

    counts: tuple[tuple[str, int], ...] = ()
    mig_enabled: bool = True

    @classmethod
    def of(cls, counts: Mapping[str, int], mig_enabled: bool = True) -> Layout:
        """Build from a mapping such as ``{"3g.40gb": 2}``. Counts are checked by the validator, not here."""
        return cls(tuple(sorted((k, v) for k, v in counts.items() if v != 0)), mig_enabled)

    @classmethod
    def disabled(cls) -> Layout:
        return cls((), False)

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)

    def total_instances(self) -> int:
        return sum(n for _, n in self.counts)

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self.counts)


@dataclass(frozen=True, order=True)
class MigInstance:
    """One GPU instance (with its single full-size compute instance) as it exists or will exist.

    ``gpu_instance_id`` and ``compute_instance_id`` are NVML's ids; they are ``None`` for planned instances.
    """

    profile: str
    placement: Placement
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    def __str__(self) -> str:
        ids = "" if self.gpu_instance_id is None else f" gi={self.gpu_instance_id}"
        if self.compute_instance_id is not None:
            ids += f" ci={self.compute_instance_id}"
        return f"{self.profile}@{self.placement}{ids}"


@dataclass(frozen=True)
class GpuState:
    """What one physical GPU looks like now: model, MIG mode and the instances that exist on it."""

    index: int
    model: str
    mig_enabled: bool
    instances: tuple[MigInstance, ...] = ()
    mig_pending: bool | None = None  # pending mode when it differs from the current one (needs a GPU reset)

    def layout(self) -> Layout:
        counts: dict[str, int] = {}
        for inst in self.instances:
            counts[inst.profile] = counts.get(inst.profile, 0) + 1
        return Layout.of(counts, self.mig_enabled)


@dataclass(frozen=True)
class NodeLayout:
    """A requested layout per GPU index of one node. GPUs not listed are left as they are."""

    gpus: tuple[tuple[int, Layout], ...] = field(default=())

    @classmethod
    def of(cls, per_gpu: Mapping[int, Layout] | Iterable[tuple[int, Layout]]) -> NodeLayout:
        items = per_gpu.items() if isinstance(per_gpu, Mapping) else per_gpu
        return cls(tuple(sorted(items, key=lambda kv: kv[0])))

    def for_gpu(self, index: int) -> Layout | None:
        for i, layout in self.gpus:
            if i == index:
                return layout
        return None


def describe_counts(counts: Iterable[tuple[str, int]], compute_of: Mapping[str, int] | None = None) -> str:
    """Human form of a layout: ``4g.40gb + 2 × 3g.40gb + 1g.10gb`` (largest profiles first)."""
    items = [(name, n) for name, n in counts if n > 0]
    weights = compute_of or {}
    items.sort(key=lambda kv: (-weights.get(kv[0], _compute_from_name(kv[0])), kv[0]))
    if not items:
        return "no instances"
    return " + ".join(name if n == 1 else f"{n} × {name}" for name, n in items)


def _compute_from_name(name: str) -> int:
    m = PROFILE_NAME_RE.match(name)
    return int(m.group("compute")) if m else 0
