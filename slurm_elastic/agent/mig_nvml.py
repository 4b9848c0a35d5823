"""The real :class:`~slurm_elastic.mig.device.MigDevice`: one GPU's MIG calls through nvidia-ml-py (``pynvml``).

Thin on purpose: each method is one NVML call or a short loop of them (table in :mod:`slurm_elastic.mig.device`),
and every NVML error becomes a :class:`~slurm_elastic.mig.errors.MigDeviceError` that names the GPU, the call
and NVML's reason. Tests run it unchanged against the virtual ``libnvidia-ml.so.1`` (:mod:`slurm_elastic.testing.vgpu`);
docs/mig.md lists what has only been checked there.

NVML must be initialised (``nvmlInit``) by the caller; handles are looked up per call, so a device object stays
valid across MIG changes (GPU instance handles are not kept, because destroying an instance frees them).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pynvml

from slurm_elastic.agent.reader import nvml_reason
from slurm_elastic.mig.device import ComputeInstanceRecord, GpuInstanceRecord, MigMode, NvmlProfileInfo
from slurm_elastic.mig.errors import MigDeviceError
from slurm_elastic.mig.model import Placement

T = TypeVar("T")


class MigNotSupportedError(MigDeviceError):
    """The GPU has no MIG mode (NVML: Not Supported)."""


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlMigDevice:
    def __init__(self, index: int, nvml: Any = pynvml) -> None:
        self._index = index
        self._n = nvml

    @property
    def index(self) -> int:
        return self._index

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        n = self._n
        try:
            return fn()
        except n.NVMLError_NotSupported as exc:
            raise MigNotSupportedError(f"GPU {self._index}: {what}: not supported ({exc})") from exc
        except n.NVMLError as exc:
            raise MigDeviceError(f"GPU {self._index}: {what}: {exc} ({nvml_reason(exc)})") from exc

    def _handle(self) -> Any:
        return self._call("get handle", lambda: self._n.nvmlDeviceGetHandleByIndex(self._index))

    # --- identity ----------------------------------------------------------------------------------------
    def name(self) -> str:
        h = self._handle()
        return _text(self._call("name", lambda: self._n.nvmlDeviceGetName(h)))

    def pci_device_id(self) -> str:
        """``0x233010DE``; empty when the driver (or the virtual library) cannot say."""
        h = self._handle()
        try:
            return f"0x{int(self._n.nvmlDeviceGetPciInfo(h).pciDeviceId):08X}"
        except (self._n.NVMLError, AttributeError):
            return ""

    # --- mode ------------------------------------------------------------------------------------------------
    def get_mig_mode(self) -> MigMode:
        h = self._handle()
        current, pending = self._call("get MIG mode", lambda: self._n.nvmlDeviceGetMigMode(h))
        enable = self._n.NVML_DEVICE_MIG_ENABLE
        return MigMode(current == enable, pending == enable)

    def set_mig_mode(self, enabled: bool) -> MigMode:
        h = self._handle()
        mode = self._n.NVML_DEVICE_MIG_ENABLE if enabled else self._n.NVML_DEVICE_MIG_DISABLE
        self._call("set MIG mode", lambda: self._n.nvmlDeviceSetMigMode(h, mode))
        return self.get_mig_mode()

    # --- capabilities --------------------------------------------------------------------------------------
    def gpu_instance_profiles(self) -> Sequence[NvmlProfileInfo]:
        n = self._n
        h = self._handle()
        out: dict[int, NvmlProfileInfo] = {}
        for idx in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, idx)
            except (n.NVMLError_NotSupported, n.NVMLError_InvalidArgument):
                continue  # this profile does not exist on this GPU
            except n.NVMLError as exc:
                raise MigDeviceError(f"GPU {self._index}: profile info {idx}: {exc}") from exc
            out.setdefault(
                int(info.id),
                NvmlProfileInfo(
                    profile_id=int(info.id),
                    name=_text(getattr(info, "name", f"profile-{idx}")),
                    slice_count=int(info.sliceCount),
                    instance_count=int(info.instanceCount),
                    memory_size_mb=int(info.memorySizeMB),
                    multiprocessor_count=int(info.multiprocessorCount),
                ),
            )
        return tuple(out.values())

    def possible_placements(self, profile_id: int) -> Sequence[Placement]:
        n = self._n
        h = self._handle()
        count = ctypes.c_uint(0)
        self._call("placements",
                   lambda: n.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, None, ctypes.byref(count)))
        if count.value == 0:
            return ()
        arr = (n.c_nvmlGpuInstancePlacement_t * count.value)()
        self._call("placements",
                   lambda: n.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, arr, ctypes.byref(count)))
        return tuple(Placement(int(p.start), int(p.size)) for p in arr[: count.value])

    # --- GPU instances ----------------------------------------------------------------------------------------
    def _gi_handles(self) -> list[Any]:
        n = self._n
        h = self._handle()
        handles: list[Any] = []
        for p in self.gpu_instance_profiles():
            size = max(p.instance_count, 1)
            arr = (n.c_nvmlGpuInstance_t * size)()
            count = ctypes.c_uint(0)
            self._call("list GPU instances",
                       lambda: n.nvmlDeviceGetGpuInstances(h, p.profile_id, arr, ctypes.byref(count)))  # noqa: B023
            handles.extend(arr[: count.value])
        return handles

    def list_gpu_instances(self) -> Sequence[GpuInstanceRecord]:
        out = []
        for gi in self._gi_handles():
            info = self._call("GPU instance info", lambda: self._n.nvmlGpuInstanceGetInfo(gi))  # noqa: B023
            out.append(GpuInstanceRecord(int(info.id), int(info.profileId),
                                         Placement(int(info.placement.start), int(info.placement.size))))
        return tuple(sorted(out, key=lambda r: r.gpu_instance_id))

    def create_gpu_instance(self, profile_id: int, placement: Placement) -> int:
        n = self._n
        h = self._handle()
        ref = ctypes.byref(n.c_nvmlGpuInstancePlacement_t(placement.start, placement.size))
        gi = self._call(f"create GPU instance (profile {profile_id} at {placement})",
                        lambda: n.nvmlDeviceCreateGpuInstanceWithPlacement(h, profile_id, ref))
        return int(self._call("GPU instance info", lambda: n.nvmlGpuInstanceGetInfo(gi)).id)

    def _gi(self, gpu_instance_id: int) -> Any:
        h = self._handle()
        return self._call(f"GPU instance {gpu_instance_id}",
                          lambda: self._n.nvmlDeviceGetGpuInstanceById(h, gpu_instance_id))

    def destroy_gpu_instance(self, gpu_instance_id: int) -> None:
        gi = self._gi(gpu_instance_id)
        self._call(f"destroy GPU instance {gpu_instance_id}", lambda: self._n.nvmlGpuInstanceDestroy(gi))

    # --- compute instances ---------------------------------------------------------------------------------
    def _ci_profiles(self, gi: Any) -> list[tuple[int, int, int]]:
        """(profile id, slice count, max instances) of every compute-instance profile of the GPU instance."""
        n = self._n
        out: dict[int, tuple[int, int, int]] = {}
        for idx in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, idx, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except (n.NVMLError_NotSupported, n.NVMLError_InvalidArgument):
                continue
            except n.NVMLError as exc:
                raise MigDeviceError(f"GPU {self._index}: compute profile info {idx}: {exc}") from exc
            out.setdefault(int(info.id), (int(info.id), int(info.sliceCount), int(info.instanceCount)))
        return list(out.values())

    def list_compute_instances(self, gpu_instance_id: int) -> Sequence[ComputeInstanceRecord]:
        n = self._n
        gi = self._gi(gpu_instance_id)
        out: list[ComputeInstanceRecord] = []
        for pid, slices, maximum in self._ci_profiles(gi):
            arr = (n.c_nvmlComputeInstance_t * max(maximum, 1))()
            count = ctypes.c_uint(0)
            self._call("list compute instances",
                       lambda: n.nvmlGpuInstanceGetComputeInstances(gi, pid, arr, ctypes.byref(count)))  # noqa: B023
            for ci in arr[: count.value]:
                info = self._call("compute instance info", lambda: n.nvmlComputeInstanceGetInfo(ci))  # noqa: B023
                out.append(ComputeInstanceRecord(int(info.id), slices))
        return tuple(sorted(out, key=lambda c: c.compute_instance_id))

    def create_compute_instance(self, gpu_instance_id: int) -> int:
        """The GPU instance's one full-size compute instance (the CI profile with all its slices)."""
        n = self._n
        gi = self._gi(gpu_instance_id)
        gi_profile = int(self._call("GPU instance info", lambda: n.nvmlGpuInstanceGetInfo(gi)).profileId)
        slices = {p.profile_id: p.slice_count for p in self.gpu_instance_profiles()}.get(gi_profile)
        full = [pid for pid, s, _ in self._ci_profiles(gi) if s == slices]
        if not full:
            raise MigDeviceError(
                f"GPU {self._index}: GPU instance {gpu_instance_id} offers no {slices}-slice compute profile")
        ci = self._call(f"create compute instance in GPU instance {gpu_instance_id}",
                        lambda: n.nvmlGpuInstanceCreateComputeInstance(gi, full[0]))
        return int(self._call("compute instance info", lambda: n.nvmlComputeInstanceGetInfo(ci)).id)

    def destroy_compute_instance(self, gpu_instance_id: int, compute_instance_id: int) -> None:
        n = self._n
        gi = self._gi(gpu_instance_id)
        ci = self._call(f"compute instance {compute_instance_id}",
                        lambda: n.nvmlGpuInstanceGetComputeInstanceById(gi, compute_instance_id))
        self._call(f"destroy compute instance {gpu_instance_id}/{compute_instance_id}",
                   lambda: n.nvmlComputeInstanceDestroy(ci))
