"""Reading GPUs: the :class:`GpuReader` port, its NVML adapter (production) and the no-GPU adapter (degraded).

:class:`NvmlGpuReader` is the production code path. Tests and the demo run it unchanged against the virtual
``libnvidia-ml.so.1`` (:mod:`slurm_elastic.testing.vgpu`). Rules it keeps:

- a field NVML does not support is None with a reason, never 0; other per-field errors are reported and the
  sample goes on; a device that cannot be read at all is reported with its error;
- per-process utilization comes from ``nvmlDeviceGetProcessUtilization`` with the newest timestamp already seen
  on that device (lastSeenTimeStamp), so each sample covers the time since the previous one;
- MIG instances are devices of their own (parent, GPU/compute instance ids, profile) whose utilization is None,
  reason ``mig_no_utilization``: NVML has no utilization counters for MIG instances.

Readers are not thread-safe; the agent calls them from one worker thread (:mod:`.bounded`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import pynvml

from slurm_elastic.agent.errors import NvmlReadError, NvmlUnavailableError
from slurm_elastic.agent.model import DeviceReading, NvmlReading, ProcessReading, SampleError

T = TypeVar("T")
MIB = 1024 * 1024

REASON_NOT_SUPPORTED = "not_supported"
REASON_MIG_ENABLED = "mig_enabled"  # a GPU in MIG mode: its instances are reported instead
REASON_MIG_NO_UTILIZATION = "mig_no_utilization"


class GpuReader(Protocol):
    def open(self) -> str | None:
        """Initialises the library; returns the driver version. Raises NvmlUnavailableError."""

    def read(self) -> NvmlReading:
        """One sample of every device. Raises NvmlReadError when nothing at all can be read."""

    def close(self) -> None: ...


class NullGpuReader:
    """Degraded mode: no NVML, no GPUs."""

    def open(self) -> str | None:
        return None

    def read(self) -> NvmlReading:
        return NvmlReading(devices=())

    def close(self) -> None:
        return None


def nvml_reason(exc: BaseException) -> str:
    """``NVMLError_GpuIsLost`` -> ``gpu_is_lost``; a bare NVMLError(42) -> ``nvml_error_42``."""
    name = type(exc).__name__
    if name.startswith("NVMLError_"):
        return re.sub(r"(?<!^)(?=[A-Z])", "_", name.removeprefix("NVMLError_")).lower()
    value = getattr(exc, "value", None)
    return f"nvml_error_{value}" if value is not None else "nvml_error"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _Device:
    """Per-device read helper: a failing optional field becomes None plus a reported error."""

    def __init__(self, key: str, errors: list[SampleError], nvml: Any) -> None:
        self.key = key
        self.errors = errors
        self.nvml = nvml

    def field(self, what: str, fn: Callable[[], T]) -> tuple[T | None, str | None]:
        try:
            return fn(), None
        except self.nvml.NVMLError_NotSupported:
            return None, REASON_NOT_SUPPORTED
        except self.nvml.NVMLError as exc:
            reason = nvml_reason(exc)
            self.errors.append(SampleError(reason, f"{what}: {exc}", self.key))
            return None, reason


class NvmlGpuReader:
    """The production reader, through nvidia-ml-py (``pynvml``)."""

    def __init__(self, nvml: Any = pynvml) -> None:
        self._nvml = nvml
        self._open = False
        self._last_seen: dict[str, int] = {}  # device uuid -> newest process-utilization timestamp (µs)
        self._mig_profiles: dict[str, str | None] = {}  # MIG device uuid -> profile name

    def open(self) -> str | None:
        n = self._nvml
        try:
            n.nvmlInit()
        except n.NVMLError_LibraryNotFound as exc:
            raise NvmlUnavailableError(
                "library_not_found", "NVML library libnvidia-ml.so.1 not found: is the NVIDIA driver installed?"
            ) from exc
        except n.NVMLError_DriverNotLoaded as exc:
            raise NvmlUnavailableError(
                "driver_not_loaded", "the NVIDIA driver is not loaded (NVML: Driver Not Loaded)") from exc
        except n.NVMLError as exc:
            raise NvmlUnavailableError(nvml_reason(exc), f"NVML initialisation failed: {exc}") from exc
        self._open = True
        try:
            return _text(n.nvmlSystemGetDriverVersion())
        except n.NVMLError:
            return None

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass

    def read(self) -> NvmlReading:
        n = self._nvml
        errors: list[SampleError] = []
        try:
            count = n.nvmlDeviceGetCount()
        except n.NVMLError as exc:
            raise NvmlReadError(nvml_reason(exc), f"cannot count GPUs: {exc}") from exc
        devices: list[DeviceReading] = []
        for index in range(count):
            key = str(index)
            try:
                handle = n.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(n.nvmlDeviceGetUUID(handle))
            except n.NVMLError as exc:
                reason = nvml_reason(exc)
                errors.append(SampleError(reason, f"GPU {index}: {exc}", key))
                devices.append(DeviceReading(key, "gpu", index, None, error=reason))
                continue
            devices.extend(self._read_gpu(index, handle, uuid, errors))
        return NvmlReading(tuple(devices), tuple(errors))

    # -- one physical GPU ----------------------------------------------------------------------------------
    def _read_gpu(self, index: int, handle: Any, uuid: str, errors: list[SampleError]) -> list[DeviceReading]:
        n = self._nvml
        d = _Device(str(index), errors, n)
        name, _ = d.field("name", lambda: _text(n.nvmlDeviceGetName(handle)))
        minor, _ = d.field("minor number", lambda: int(n.nvmlDeviceGetMinorNumber(handle)))
        mem, _ = d.field("memory", lambda: n.nvmlDeviceGetMemoryInfo(handle))
        mig_mode, _ = d.field("MIG mode", lambda: n.nvmlDeviceGetMigMode(handle))
        mig_enabled = bool(mig_mode and mig_mode[0] == n.NVML_DEVICE_MIG_ENABLE)
        util: float | None
        util_reason: str | None
        procs: tuple[ProcessReading, ...]
        procs_reason: str | None
        if mig_enabled:
            util, util_reason = None, REASON_MIG_ENABLED
        else:
            rates, util_reason = d.field("utilization", lambda: n.nvmlDeviceGetUtilizationRates(handle))
            util = float(rates.gpu) if rates is not None else None
        if mig_enabled:  # processes are listed under the instances they run on
            procs, procs_reason = (), REASON_MIG_ENABLED
        else:
            procs, procs_reason = self._processes(d, handle, uuid, per_process_util=True)
        gpu = DeviceReading(
            key=str(index), kind="gpu", index=index, uuid=uuid, name=name, minor=minor,
            memory_used_mib=int(mem.used) // MIB if mem is not None else None,
            memory_total_mib=int(mem.total) // MIB if mem is not None else None,
            utilization_percent=util, utilization_reason=util_reason, mig_enabled=mig_enabled,
            processes=procs, processes_reason=procs_reason,
        )
        out = [gpu]
        if mig_enabled:
            out += self._read_mig_devices(index, handle, uuid, errors)
        return out

    def _processes(
        self, d: _Device, handle: Any, uuid: str, *, per_process_util: bool
    ) -> tuple[tuple[ProcessReading, ...], str | None]:
        n = self._nvml
        plist, reason = d.field("processes", lambda: n.nvmlDeviceGetComputeRunningProcesses(handle))
        if plist is None:
            return (), reason
        utils: dict[int, float] | None = None
        if per_process_util:
            utils = self._process_utilization(d, handle, uuid)
        procs = []
        for p in plist:
            used = getattr(p, "usedGpuMemory", None)
            sm = None if utils is None else utils.get(int(p.pid), 0.0)  # no sample since lastSeen: idle
            procs.append(ProcessReading(int(p.pid), int(used) // MIB if used is not None else None, sm))
        return tuple(procs), None

    def _process_utilization(self, d: _Device, handle: Any, uuid: str) -> dict[int, float] | None:
        n = self._nvml
        last_seen = self._last_seen.get(uuid, 0)
        try:
            samples = n.nvmlDeviceGetProcessUtilization(handle, last_seen)
        except n.NVMLError_NotFound:
            return {}  # no sample newer than lastSeen: no process ran kernels since
        except n.NVMLError_NotSupported:
            return None
        except n.NVMLError as exc:
            d.errors.append(SampleError(nvml_reason(exc), f"process utilization: {exc}", d.key))
            return None
        sums: dict[int, list[float]] = {}
        newest = last_seen
        for s in samples:
            sums.setdefault(int(s.pid), []).append(float(s.smUtil))
            newest = max(newest, int(s.timeStamp))
        self._last_seen[uuid] = newest
        return {pid: sum(v) / len(v) for pid, v in sums.items()}

    # -- MIG -----------------------------------------------------------------------------------------------
    def _read_mig_devices(
        self, index: int, parent: Any, parent_uuid: str, errors: list[SampleError]
    ) -> list[DeviceReading]:
        n = self._nvml
        d = _Device(str(index), errors, n)
        count, _ = d.field("MIG device count", lambda: int(n.nvmlDeviceGetMaxMigDeviceCount(parent)))
        out: list[DeviceReading] = []
        for k in range(count or 0):
            try:
                mig = n.nvmlDeviceGetMigDeviceHandleByIndex(parent, k)
            except n.NVMLError_NotFound:
                continue
            except n.NVMLError as exc:
                errors.append(SampleError(nvml_reason(exc), f"MIG device {k}: {exc}", str(index)))
                continue
            try:
                gi = int(n.nvmlDeviceGetGpuInstanceId(mig))
                ci = int(n.nvmlDeviceGetComputeInstanceId(mig))
                uuid = _text(n.nvmlDeviceGetUUID(mig))
            except n.NVMLError as exc:
                errors.append(SampleError(nvml_reason(exc), f"MIG device {k}: {exc}", str(index)))
                continue
            key = f"{index}/{gi}/{ci}"
            md = _Device(key, errors, n)
            name, _ = md.field("name", lambda: _text(n.nvmlDeviceGetName(mig)))  # noqa: B023 - called at once
            mem, _ = md.field("memory", lambda: n.nvmlDeviceGetMemoryInfo(mig))  # noqa: B023
            procs, procs_reason = self._processes(md, mig, uuid, per_process_util=False)
            out.append(DeviceReading(
                key=key, kind="mig", index=index, uuid=uuid, name=name,
                memory_used_mib=int(mem.used) // MIB if mem is not None else None,
                memory_total_mib=int(mem.total) // MIB if mem is not None else None,
                utilization_percent=None, utilization_reason=REASON_MIG_NO_UTILIZATION,
                parent_uuid=parent_uuid, gpu_instance_id=gi, compute_instance_id=ci,
                profile=self._mig_profile(parent, uuid, gi, ci, name=name, d=md),
                processes=procs, processes_reason=procs_reason,
            ))
        return out

    def _mig_profile(self, parent: Any, uuid: str, gi: int, ci: int, *, name: str | None, d: _Device) -> str | None:
        """The compute instance's profile name (e.g. "1c.3g.20gb", or "3g.20gb" for a whole GPU instance),
        from the instance and profile queries; cached per MIG device UUID (a repartition changes the UUID)."""
        if uuid in self._mig_profiles:
            return self._mig_profiles[uuid]
        n = self._nvml
        profile: str | None = None
        try:
            gi_handle = n.nvmlDeviceGetGpuInstanceById(parent, gi)
            gi_profile_id = int(n.nvmlGpuInstanceGetInfo(gi_handle).profileId)
            ci_handle = n.nvmlGpuInstanceGetComputeInstanceById(gi_handle, ci)
            ci_profile_id = int(n.nvmlComputeInstanceGetInfo(ci_handle).profileId)
            for idx in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                try:
                    info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gi_handle, idx, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
                except n.NVMLError:
                    continue
                if int(info.id) == ci_profile_id:
                    profile = _text(info.name)
                    break
            if profile is None:
                for idx in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
                    try:
                        ginfo = n.nvmlDeviceGetGpuInstanceProfileInfo(parent, idx)
                    except n.NVMLError:
                        continue
                    if int(ginfo.id) == gi_profile_id:
                        profile = _text(ginfo.name)
                        break
        except n.NVMLError as exc:
            # Instance queries may need root; the device name ("... MIG 3g.20gb") still tells the profile.
            d.errors.append(SampleError(nvml_reason(exc), f"MIG profile: {exc}", d.key))
        if profile is None and name and " MIG " in name:
            profile = name.rsplit(" MIG ", 1)[1]
        if profile is not None:
            profile = profile.removeprefix("MIG ").strip() or None
            self._mig_profiles[uuid] = profile
        return profile
