"""What the agent reads, before it is attributed to jobs: NVML readings and job references (plain values)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DeviceKind = Literal["gpu", "mig"]
JobSource = Literal["cgroup", "environ", "prolog"]


@dataclass(frozen=True)
class SampleError:
    """One problem met during a sample. Logged, counted, reported; the sample goes on."""

    code: str  # stable, e.g. "gpu_is_lost", "nvml_timeout", "gpu_map_unreadable"
    message: str
    device: str | None = None


@dataclass(frozen=True)
class ProcessReading:
    pid: int
    memory_used_mib: int | None  # None: NVML could not tell
    sm_util_percent: float | None  # None: no per-process utilization (MIG, or the query failed)


@dataclass(frozen=True)
class DeviceReading:
    """One device of one sample: a whole GPU, or one MIG instance (kind="mig", under its parent GPU)."""

    key: str  # "0" for GPU 0; "0/1/0" for GPU 0, GPU instance 1, compute instance 0
    kind: DeviceKind
    index: int  # NVML index of the physical GPU (the parent's, for a MIG instance)
    uuid: str | None
    name: str | None = None
    minor: int | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    utilization_percent: float | None = None
    utilization_reason: str | None = None  # why utilization_percent is None
    mig_enabled: bool = False
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    profile: str | None = None  # MIG profile, e.g. "3g.20gb" or "1c.3g.20gb"
    processes: tuple[ProcessReading, ...] = ()
    processes_reason: str | None = None  # set when the process list could not be read
    error: str | None = None  # the device could not be read at all (e.g. "gpu_is_lost")


@dataclass(frozen=True)
class NvmlReading:
    devices: tuple[DeviceReading, ...]
    errors: tuple[SampleError, ...] = ()


@dataclass(frozen=True)
class JobRef:
    """Which job a process belongs to, and how we know."""

    job_id: int | None  # None when only a SLUID is known (Slurm 26.05 cgroup paths)
    source: JobSource
    sluid: str | None = None
    step: str | None = None
    uid: int | None = None
    user: str | None = None
    account: str | None = None


@dataclass(frozen=True)
class GpuAllocation:
    """A prolog map file: this job holds this GPU (global index on the node)."""

    gpu_index: int
    job_id: int
    uid: int | None
    user: str | None
    account: str | None
    sluid: str | None = None
