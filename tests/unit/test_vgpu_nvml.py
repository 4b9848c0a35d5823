"""The virtual libnvidia-ml.so.1 through the real nvidia-ml-py: values, error codes, processes, MIG."""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace

import pynvml
import pytest

from slurm_elastic.testing.vgpu.state import (
    with_delay,
    with_fault,
    with_mig,
    with_process,
    without_pid,
)
from slurm_elastic.testing.vgpu.statefile import StateFile, process_starttime
from tests.unit import vgpu_support

vgpu = vgpu_support.vgpu
MIB = 1024 * 1024


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen(["sleep", "600"])
    yield p
    p.kill()
    p.wait()


def test_devices_are_described_by_the_state(vgpu: StateFile) -> None:
    state = vgpu.read()
    assert pynvml.nvmlDeviceGetCount() == 4
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    for g in state.gpus:
        h = pynvml.nvmlDeviceGetHandleByIndex(g.index)
        assert pynvml.nvmlDeviceGetUUID(h) == g.uuid
        assert pynvml.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-40GB"
        assert pynvml.nvmlDeviceGetMinorNumber(h) == g.index + 4
        assert pynvml.nvmlDeviceGetIndex(h) == g.index
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        assert (mem.total, mem.used, mem.free) == (40960 * MIB, 0, 40960 * MIB)
        assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 0
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []
        assert pynvml.nvmlDeviceGetHandleByUUID(g.uuid).contents is not None
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(4)


def test_a_live_process_shows_with_its_utilization_and_memory(vgpu: StateFile) -> None:
    me = os.getpid()
    vgpu.update(lambda s: with_process(s, me, (1, 2), sm_util=90, memory_mib=1000, starttime=process_starttime(me)))
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 90
    assert pynvml.nvmlDeviceGetMemoryInfo(h).used == 1000 * MIB
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(me, 1000 * MIB)]
    samples = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    assert [(s.pid, s.smUtil) for s in samples] == [(me, 90)]
    assert pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(0)).gpu == 0
    vgpu.update(lambda s: without_pid(s, me))
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []


def test_utilization_of_several_processes_adds_up_to_at_most_100(vgpu: StateFile,
                                                                 sleeper: subprocess.Popen[bytes]) -> None:
    vgpu.update(lambda s: with_process(with_process(s, os.getpid(), (0,), sm_util=70, memory_mib=10),
                                       sleeper.pid, (0,), sm_util=60, memory_mib=20))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 100
    assert pynvml.nvmlDeviceGetMemoryInfo(h).used == 30 * MIB


def test_dead_processes_disappear_at_read_time(vgpu: StateFile) -> None:
    p = subprocess.Popen(["sleep", "600"])
    vgpu.update(lambda s: with_process(s, p.pid, (0,), sm_util=50, memory_mib=10))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert [x.pid for x in pynvml.nvmlDeviceGetComputeRunningProcesses(h)] == [p.pid]
    p.kill()
    p.wait()
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 0
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h, 0)


def test_a_reused_pid_does_not_inherit_the_dead_workloads_entry(vgpu: StateFile) -> None:
    me = os.getpid()
    real = process_starttime(me)
    vgpu.update(lambda s: with_process(s, me, (0,), sm_util=50, memory_mib=10, starttime=real + 1))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    vgpu.update(lambda s: with_process(s, me, (0,), sm_util=50, memory_mib=10, starttime=real))
    assert len(pynvml.nvmlDeviceGetComputeRunningProcesses(h)) == 1


def test_process_utilization_honours_last_seen_timestamp(vgpu: StateFile) -> None:
    me = os.getpid()
    vgpu.update(lambda s: with_process(s, me, (0,), sm_util=40, memory_mib=10))
    vgpu.update(lambda s: replace(s, clock_us=5_000_000))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    samples = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    assert [(s.pid, s.timeStamp, s.smUtil) for s in samples] == [(me, 5_000_000, 40)]
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer than what we have seen
        pynvml.nvmlDeviceGetProcessUtilization(h, 5_000_000)
    assert len(pynvml.nvmlDeviceGetProcessUtilization(h, 4_999_999)) == 1
    vgpu.update(lambda s: replace(s, clock_us=6_000_000))
    assert [s.timeStamp for s in pynvml.nvmlDeviceGetProcessUtilization(h, 5_000_000)] == [6_000_000]


def test_real_clock_timestamps_are_microseconds(vgpu: StateFile) -> None:
    vgpu.update(lambda s: with_process(s, os.getpid(), (0,), sm_util=40, memory_mib=10))
    before = int(time.time() * 1e6)
    (sample,) = pynvml.nvmlDeviceGetProcessUtilization(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    after = int(time.time() * 1e6)
    assert before <= sample.timeStamp <= after


ERRORS = [
    (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVMLError_NotSupported),
    (pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVMLError_NoPermission),
    (pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVMLError_GpuIsLost),
    (pynvml.NVML_ERROR_UNKNOWN, pynvml.NVMLError_Unknown),
    (pynvml.NVML_ERROR_TIMEOUT, pynvml.NVMLError_Timeout),
    (pynvml.NVML_ERROR_INSUFFICIENT_POWER, pynvml.NVMLError_InsufficientPower),
]


@pytest.mark.parametrize(("code", "exc"), ERRORS, ids=[e.__name__ for _, e in ERRORS])
@pytest.mark.parametrize("function", ["nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo",
                                      "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetUUID"])
def test_a_fault_in_the_state_returns_that_code_on_that_gpu_only(
        vgpu: StateFile, code: int, exc: type[Exception], function: str) -> None:
    vgpu.update(lambda s: with_fault(s, function, code, gpu=2))
    call = {
        "nvmlDeviceGetUtilizationRates": pynvml.nvmlDeviceGetUtilizationRates,
        "nvmlDeviceGetMemoryInfo": pynvml.nvmlDeviceGetMemoryInfo,
        "nvmlDeviceGetComputeRunningProcesses_v3": pynvml.nvmlDeviceGetComputeRunningProcesses,
        "nvmlDeviceGetUUID": pynvml.nvmlDeviceGetUUID,
    }[function]
    with pytest.raises(exc):
        call(pynvml.nvmlDeviceGetHandleByIndex(2))
    call(pynvml.nvmlDeviceGetHandleByIndex(1))  # other GPUs answer


def test_function_names_match_without_version_suffix_and_star_matches_all(vgpu: StateFile) -> None:
    vgpu.update(lambda s: with_fault(s, "nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN))
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetCount()  # pynvml calls nvmlDeviceGetCount_v2
    vgpu.update(lambda s: replace(s, faults=()))
    vgpu.update(lambda s: with_fault(s, "*", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=3))
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(3)
    assert pynvml.nvmlDeviceGetCount() == 4


def test_faults_from_the_environment(vgpu: StateFile, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_ELASTIC_VGPU_FAULTS", "nvmlDeviceGetMinorNumber=3@1;nvmlDeviceGetName=4")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(1))
    assert pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(0)) == 4
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))


def test_delay_makes_a_call_slow(vgpu: StateFile) -> None:
    vgpu.update(lambda s: with_delay(s, "nvmlDeviceGetUtilizationRates", 300, gpu=0))
    t0 = time.monotonic()
    pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert time.monotonic() - t0 >= 0.3  # a lower bound only: the sleep happened


def test_init_fails_with_driver_not_loaded_when_the_state_is_missing(vgpu: StateFile,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_ELASTIC_VGPU_STATE", str(vgpu.path) + ".missing")
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()


@pytest.mark.parametrize(("code", "exc"), [(9, pynvml.NVMLError_DriverNotLoaded), (4, pynvml.NVMLError_NoPermission),
                                           (999, pynvml.NVMLError_Unknown)])
def test_init_fault_from_environment(vgpu: StateFile, monkeypatch: pytest.MonkeyPatch, code: int,
                                     exc: type[Exception]) -> None:
    monkeypatch.setenv("SLURM_ELASTIC_VGPU_FAULTS", f"nvmlInit={code}")
    with pytest.raises(exc):
        pynvml.nvmlInit()


def test_calls_before_init_are_uninitialized(tmp_path: os.PathLike[str]) -> None:
    vgpu_support.load_vgpu_library()
    lib = ctypes.CDLL(str(vgpu_support.vgpu_library()))
    # The library is process-wide: an earlier test in this process may have left NVML initialised (an init
    # whose shutdown runs only when its owner is garbage-collected). Undo those first; bounded.
    for _ in range(1000):
        if lib.nvmlShutdown() != pynvml.NVML_SUCCESS:
            break
    count = ctypes.c_uint()
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == pynvml.NVML_ERROR_UNINITIALIZED


@vgpu_support.needs_no_system_nvml
def test_library_not_found_without_the_library_on_the_path(tmp_path: os.PathLike[str]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    code = ("import pynvml\ntry:\n    pynvml.nvmlInit()\n"
            "except pynvml.NVMLError_LibraryNotFound:\n    print('notfound')\n")
    out = subprocess.run([vgpu_support.PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.stdout.strip() == "notfound", out.stderr


# ---- MIG ---------------------------------------------------------------------------------------------------


def test_mig_read_side(vgpu: StateFile) -> None:
    vgpu.update(lambda s: with_mig(s, 3, (("3g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6))))
    parent = pynvml.nvmlDeviceGetHandleByIndex(3)
    assert pynvml.nvmlDeviceGetMigMode(parent) == [1, 1]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(parent)
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    seen = []
    for k in range(3):
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, k)
        assert pynvml.nvmlDeviceIsMigDeviceHandle(mig)
        gi, ci = pynvml.nvmlDeviceGetGpuInstanceId(mig), pynvml.nvmlDeviceGetComputeInstanceId(mig)
        gih = pynvml.nvmlDeviceGetGpuInstanceById(parent, gi)
        info = pynvml.nvmlGpuInstanceGetInfo(gih)
        cinfo = pynvml.nvmlComputeInstanceGetInfo(pynvml.nvmlGpuInstanceGetComputeInstanceById(gih, ci))
        seen.append((gi, ci, info.profileId, info.placement.start, cinfo.profileId,
                     pynvml.nvmlDeviceGetMemoryInfo(mig).total // MIB, pynvml.nvmlDeviceGetName(mig)))
        assert pynvml.nvmlDeviceGetUUID(mig).startswith("MIG-")
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetUtilizationRates(mig)
        parent_again = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        assert pynvml.nvmlDeviceGetUUID(parent_again) == pynvml.nvmlDeviceGetUUID(parent)
    assert seen == [
        (1, 0, 9, 0, 2, 19968, "NVIDIA A100-SXM4-40GB MIG 3g.20gb"),
        (2, 0, 14, 4, 1, 9856, "NVIDIA A100-SXM4-40GB MIG 2g.10gb"),
        (3, 0, 19, 6, 0, 4864, "NVIDIA A100-SXM4-40GB MIG 1g.5gb"),
    ]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 3)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # a GPU without MIG mode
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(pynvml.nvmlDeviceGetHandleByIndex(0), 0)


def test_mig_profiles_and_placements(vgpu: StateFile) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert (info.id, info.sliceCount, info.instanceCount, info.memorySizeMB, info.name) == (
        9, 3, 2, 19968, "MIG 3g.20gb")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)
    count = ctypes.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, 14, None, ctypes.byref(count))
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, 14, placements, ctypes.byref(count))
    assert [(p.start, p.size) for p in placements] == [(0, 2), (2, 2), (4, 2)]


def test_mig_write_side_drives_the_state_through_nvml(vgpu: StateFile) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # MIG mode off
        pynvml.nvmlDeviceCreateGpuInstance(h, 9)
    assert pynvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(h) == [1, 1]
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 2

    # As with the real library, the placement is passed by reference (the C API takes a pointer).
    placement = ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(4, 4))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # not a placement of 3g.20gb
        pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(2, 4)))
    gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, placement)
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 1
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # slot taken
        pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, placement)
    ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    state = vgpu.read()
    assert [(i.id, i.profile_id, i.start, i.size) for i in state.gpu_instances] == [(1, 9, 4, 4)]
    assert [(c.gi, c.id, c.profile_id) for c in state.compute_instances] == [(1, 0, 2)]
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"

    with pytest.raises(pynvml.NVMLError_InUse):  # a GI with a CI cannot go
        pynvml.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_InUse):  # MIG mode cannot go while instances exist
        pynvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_DISABLE)
    pynvml.nvmlComputeInstanceDestroy(ci)
    pynvml.nvmlGpuInstanceDestroy(gi)
    pynvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_DISABLE)
    state = vgpu.read()
    assert state.gpu_instances == () and state.compute_instances == () and not state.gpu(0).mig_current


def test_mig_write_refused_without_permission(vgpu: StateFile) -> None:
    vgpu.update(lambda s: with_fault(s, "nvmlDeviceSetMigMode", pynvml.NVML_ERROR_NO_PERMISSION))
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceSetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0), 1)
    assert not vgpu.read().gpu(0).mig_current


def test_mig_mode_change_refused_while_a_process_runs(vgpu: StateFile) -> None:
    vgpu.update(lambda s: with_process(s, os.getpid(), (0,), sm_util=5, memory_mib=1))
    with pytest.raises(pynvml.NVMLError_InUse):
        pynvml.nvmlDeviceSetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0), 1)


def test_mig_processes_are_listed_per_instance(vgpu: StateFile) -> None:
    vgpu.update(lambda s: with_mig(s, 3, (("3g.20gb", 0), ("3g.20gb", 4))))
    vgpu.update(lambda s: with_process(s, os.getpid(), (3,), sm_util=50, memory_mib=700, gi=2, ci=0))
    parent = pynvml.nvmlDeviceGetHandleByIndex(3)
    first, second = (pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, k) for k in range(2))
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(first) == []
    (p,) = pynvml.nvmlDeviceGetComputeRunningProcesses(second)
    assert (p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) == (os.getpid(), 700 * MIB, 2, 0)
    assert pynvml.nvmlDeviceGetMemoryInfo(second).used == 700 * MIB
