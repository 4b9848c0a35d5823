"""An in-memory :class:`~slurm_elastic.mig.device.MigDevice` for tests and simulations.

It enforces what the driver enforces (placements from its own profile table, no overlap, MIG mode on,
no GPU instance destroyed while it still has compute instances) and records every mutating call in
``calls``, so tests can assert exact sequences. Its profile table comes from a catalog
:class:`~slurm_elastic.mig.model.GpuModel` and can be overridden to play a driver that disagrees with the
catalog.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from slurm_elastic.mig.device import ComputeInstanceRecord, GpuInstanceRecord, MigMode, NvmlProfileInfo
from slurm_elastic.mig.errors import MigDeviceError
from slurm_elastic.mig.model import GpuModel, Placement


@dataclass
class _Gi:
    profile_id: int
    placement: Placement
    cis: dict[int, int] = field(default_factory=dict)  # ci id -> slice count


class FakeMigDevice:
    """A GPU whose MIG state lives in memory. ``mode_change_needs_reset`` leaves new modes pending."""

    def __init__(
        self,
        gpu: GpuModel,
        index: int = 0,
        *,
        mig_enabled: bool = False,
        profiles: Sequence[NvmlProfileInfo] | None = None,
        placements: Mapping[int, Sequence[Placement]] | None = None,
        mode_change_needs_reset: bool = False,
    ) -> None:
        self._index = index
        self._name = gpu.nvml_names[0] if gpu.nvml_names else gpu.model
        self._pci = gpu.pci_device_ids[0] if gpu.pci_device_ids else "0x000010DE"
        if profiles is None:
            profiles = [
                NvmlProfileInfo(
                    profile_id=p.profile_id if p.profile_id is not None else n,
                    name=f"MIG {p.name}",
                    slice_count=p.compute_slices,
                    instance_count=p.max_instances,
                )
                for n, p in enumerate(gpu.profiles)
            ]
        self._profiles = {p.profile_id: p for p in profiles}
        if placements is None:
            by_name = {p.name: p for p in gpu.profiles}
            placements = {
                info.profile_id: by_name[info.profile_name()].placements()
                for info in profiles
                if info.profile_name() in by_name
            }
        self._placements = {k: tuple(v) for k, v in placements.items()}
        self._memory_slices = gpu.memory_slices
        self._mode = MigMode(mig_enabled, mig_enabled)
        self._needs_reset = mode_change_needs_reset
        self._gis: dict[int, _Gi] = {}
        self._next_gi = 1
        self.calls: list[tuple[object, ...]] = []

    # --- identity ---------------------------------------------------------------------------------------
    @property
    def index(self) -> int:
        return self._index

    def name(self) -> str:
        return self._name

    def pci_device_id(self) -> str:
        return self._pci

    # --- mode ---------------------------------------------------------------------------------------------
    def get_mig_mode(self) -> MigMode:
        return self._mode

    def set_mig_mode(self, enabled: bool) -> MigMode:
        self.calls.append(("set_mig_mode", enabled))
        if not enabled and self._gis:
            raise MigDeviceError(f"GPU {self._index}: cannot disable MIG while GPU instances exist (In use)")
        if self._needs_reset:
            self._mode = MigMode(self._mode.current, enabled)
        else:
            self._mode = MigMode(enabled, enabled)
        return self._mode

    def reset(self) -> None:
        """What a GPU reset does to the mode: the pending mode becomes current."""
        self.calls.append(("reset",))
        self._mode = MigMode(self._mode.pending, self._mode.pending)

    # --- capabilities ---------------------------------------------------------------------------------
    def gpu_instance_profiles(self) -> Sequence[NvmlProfileInfo]:
        return tuple(self._profiles.values())

    def possible_placements(self, profile_id: int) -> Sequence[Placement]:
        if profile_id not in self._profiles:
            raise MigDeviceError(
                f"GPU {self._index}: profile id {profile_id} is not supported (Invalid Argument)"
            )
        return self._placements.get(profile_id, ())

    # --- GPU instances ----------------------------------------------------------------------------------
    def list_gpu_instances(self) -> Sequence[GpuInstanceRecord]:
        self._need_mig()
        return tuple(
            GpuInstanceRecord(gi_id, gi.profile_id, gi.placement) for gi_id, gi in sorted(self._gis.items())
        )

    def create_gpu_instance(self, profile_id: int, placement: Placement) -> int:
        self.calls.append(("create_gpu_instance", profile_id, placement.start, placement.size))
        self._need_mig()
        if profile_id not in self._profiles:
            raise MigDeviceError(
                f"GPU {self._index}: profile id {profile_id} is not supported (Invalid Argument)"
            )
        if placement not in self._placements.get(profile_id, ()):
            raise MigDeviceError(
                f"GPU {self._index}: {placement} is not a possible placement of profile {profile_id} "
                "(Invalid Argument)"
            )
        same = sum(1 for gi in self._gis.values() if gi.profile_id == profile_id)
        if same >= self._profiles[profile_id].instance_count:
            raise MigDeviceError(
                f"GPU {self._index}: no more instances of profile {profile_id} (Insufficient Resources)"
            )
        for gi in self._gis.values():
            if gi.placement.overlaps(placement):
                raise MigDeviceError(
                    f"GPU {self._index}: {placement} overlaps the GPU instance at {gi.placement} "
                    "(Insufficient Resources)"
                )
        gi_id = self._next_gi
        self._next_gi += 1
        self._gis[gi_id] = _Gi(profile_id, placement)
        return gi_id

    def destroy_gpu_instance(self, gpu_instance_id: int) -> None:
        self.calls.append(("destroy_gpu_instance", gpu_instance_id))
        gi = self._gi(gpu_instance_id)
        if gi.cis:
            raise MigDeviceError(
                f"GPU {self._index}: GPU instance {gpu_instance_id} still has compute instances (In use)"
            )
        del self._gis[gpu_instance_id]

    # --- compute instances -------------------------------------------------------------------------------
    def list_compute_instances(self, gpu_instance_id: int) -> Sequence[ComputeInstanceRecord]:
        gi = self._gi(gpu_instance_id)
        return tuple(ComputeInstanceRecord(ci, n) for ci, n in sorted(gi.cis.items()))

    def create_compute_instance(self, gpu_instance_id: int) -> int:
        self.calls.append(("create_compute_instance", gpu_instance_id))
        gi = self._gi(gpu_instance_id)
        if gi.cis:
            raise MigDeviceError(
                f"GPU {self._index}: GPU instance {gpu_instance_id} already has a compute instance "
                "(Insufficient Resources)"
            )
        ci_id = 0
        gi.cis[ci_id] = self._profiles[gi.profile_id].slice_count
        return ci_id

    def destroy_compute_instance(self, gpu_instance_id: int, compute_instance_id: int) -> None:
        self.calls.append(("destroy_compute_instance", gpu_instance_id, compute_instance_id))
        gi = self._gi(gpu_instance_id)
        if compute_instance_id not in gi.cis:
            raise MigDeviceError(
                f"GPU {self._index}: no compute instance {compute_instance_id} in GI {gpu_instance_id}"
            )
        del gi.cis[compute_instance_id]

    # --- test helpers ------------------------------------------------------------------------------------
    def add_partial_compute_instance(self, gpu_instance_id: int, slice_count: int) -> int:
        """Add a compute instance smaller than its GPU instance, as a hand-made sub-partition would."""
        gi = self._gi(gpu_instance_id)
        ci_id = max(gi.cis, default=-1) + 1
        gi.cis[ci_id] = slice_count
        return ci_id

    def _gi(self, gpu_instance_id: int) -> _Gi:
        self._need_mig()
        gi = self._gis.get(gpu_instance_id)
        if gi is None:
            raise MigDeviceError(f"GPU {self._index}: no GPU instance {gpu_instance_id} (Not Found)")
        return gi

    def _need_mig(self) -> None:
        if not self._mode.current:
            raise MigDeviceError(f"GPU {self._index}: MIG mode is disabled (Not Supported)")
