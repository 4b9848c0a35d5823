"""The GPU capability the MIG workflow needs, as a Protocol, plus pure helpers that read through it.

One real implementation (NVML, in the agent) and one in-memory fake (:mod:`slurm_elastic.testing.mig_fake`) satisfy
it, like mig-parted's ``mig/mode`` and ``mig/config`` managers. The methods mirror NVML calls one to one so
the real adapter stays thin:

==============================  ====================================================================
method                          NVML
==============================  ====================================================================
``get_mig_mode``                nvmlDeviceGetMigMode (current, pending)
``set_mig_mode``                nvmlDeviceSetMigMode (may need a GPU reset to take effect)
``gpu_instance_profiles``       nvmlDeviceGetGpuInstanceProfileInfo(V) for each profile constant
``possible_placements``         nvmlDeviceGetGpuInstancePossiblePlacements_v2
``list_gpu_instances``          nvmlDeviceGetGpuInstances (+ nvmlGpuInstanceGetInfo for the placement)
``create_gpu_instance``         nvmlDeviceCreateGpuInstanceWithPlacement
``destroy_gpu_instance``        nvmlGpuInstanceDestroy
``list_compute_instances``      nvmlGpuInstanceGetComputeInstances
``create_compute_instance``     nvmlGpuInstanceCreateComputeInstance (the GI's full-size CI profile)
``destroy_compute_instance``    nvmlComputeInstanceDestroy
==============================  ====================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from slurm_elastic.mig.model import GpuState, MigInstance, Placement


@dataclass(frozen=True)
class MigMode:
    current: bool
    pending: bool

    @property
    def needs_reset(self) -> bool:
        return self.current != self.pending


@dataclass(frozen=True)
class NvmlProfileInfo:
    """What nvmlDeviceGetGpuInstanceProfileInfo reports for one profile (the fields the MIG core uses)."""

    profile_id: int  # nvmlGpuInstanceProfileInfo_t.id
    name: str  # v2 "name", e.g. "MIG 3g.40gb"; the "MIG " prefix is dropped by profile_name()
    slice_count: int  # compute slices
    instance_count: int  # maximum number of instances
    memory_size_mb: int = 0
    multiprocessor_count: int = 0

    def profile_name(self) -> str:
        name = self.name.strip()
        return name[4:].strip() if name.upper().startswith("MIG ") else name


@dataclass(frozen=True)
class GpuInstanceRecord:
    gpu_instance_id: int
    profile_id: int
    placement: Placement


@dataclass(frozen=True)
class ComputeInstanceRecord:
    compute_instance_id: int
    slice_count: int  # compute slices of this CI; a full-size CI has the GI profile's slice count


@runtime_checkable
class MigDevice(Protocol):
    """One physical MIG-capable GPU. Failures raise :class:`~slurm_elastic.mig.errors.MigDeviceError`."""

    @property
    def index(self) -> int: ...

    def name(self) -> str: ...

    def pci_device_id(self) -> str: ...

    def get_mig_mode(self) -> MigMode: ...

    def set_mig_mode(self, enabled: bool) -> MigMode: ...

    def gpu_instance_profiles(self) -> Sequence[NvmlProfileInfo]: ...

    def possible_placements(self, profile_id: int) -> Sequence[Placement]: ...

    def list_gpu_instances(self) -> Sequence[GpuInstanceRecord]: ...

    def create_gpu_instance(self, profile_id: int, placement: Placement) -> int: ...

    def destroy_gpu_instance(self, gpu_instance_id: int) -> None: ...

    def list_compute_instances(self, gpu_instance_id: int) -> Sequence[ComputeInstanceRecord]: ...

    def create_compute_instance(self, gpu_instance_id: int) -> int: ...

    def destroy_compute_instance(self, gpu_instance_id: int, compute_instance_id: int) -> None: ...


@dataclass(frozen=True)
class NvmlGpuReport:
    """Everything NVML says about a GPU's MIG capabilities: the input of the catalog comparison."""

    name: str
    pci_device_id: str
    profiles: tuple[NvmlProfileInfo, ...]
    placements: tuple[tuple[int, tuple[Placement, ...]], ...]  # profile_id -> possible placements

    def placements_of(self, profile_id: int) -> tuple[Placement, ...]:
        return dict(self.placements).get(profile_id, ())


def report_of(device: MigDevice) -> NvmlGpuReport:
    """Read the device's MIG capabilities (profiles and possible placements) into a value."""
    profiles = tuple(sorted(device.gpu_instance_profiles(), key=lambda p: p.profile_id))
    placements = tuple(
        (p.profile_id, tuple(sorted(device.possible_placements(p.profile_id)))) for p in profiles
    )
    return NvmlGpuReport(device.name(), device.pci_device_id(), profiles, placements)


def observe(device: MigDevice, model: str) -> GpuState:
    """The device's current MIG state as a :class:`GpuState` (profile names as NVML reports them).

    A GPU instance with no compute instance is reported with ``compute_instance_id=None``; one with several
    (sub-partitioned by hand) reports the lowest id, and the diff keeps it only if it is the full-size one.
    """
    mode = device.get_mig_mode()
    names = {p.profile_id: p.profile_name() for p in device.gpu_instance_profiles()}
    slices = {p.profile_id: p.slice_count for p in device.gpu_instance_profiles()}
    instances: list[MigInstance] = []
    if mode.current:
        for gi in device.list_gpu_instances():
            cis = sorted(
                device.list_compute_instances(gi.gpu_instance_id), key=lambda c: c.compute_instance_id
            )
            full = len(cis) == 1 and cis[0].slice_count == slices.get(gi.profile_id)
            instances.append(
                MigInstance(
                    profile=names.get(gi.profile_id, f"profile-{gi.profile_id}"),
                    placement=gi.placement,
                    gpu_instance_id=gi.gpu_instance_id,
                    compute_instance_id=cis[0].compute_instance_id if full else None,
                )
            )
    return GpuState(
        index=device.index,
        model=model,
        mig_enabled=mode.current,
        instances=tuple(sorted(instances, key=lambda i: (i.placement, i.profile))),
        mig_pending=mode.pending if mode.needs_reset else None,
    )
