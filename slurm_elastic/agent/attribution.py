"""Ties one sample's devices and processes to Slurm jobs (pure: readings, allocations and pid->job in; report
views and per-job points out).

Ownership of a GPU comes first from the Slurm allocation (the prolog's map file for that GPU index), so a job
that holds GPUs and runs nothing on them still owns them, at 0%. Without a map file, a GPU whose processes all
belong to one job is that job's. A process's job comes from its cgroup, then its environ (resolved before this
step), then the map file of the GPU it runs on. MIG instances have no map files: Slurm's MIG GRES indices are not
NVML indices, so their owner comes from their processes.

A job's utilization on a device is the device's utilization when the job is the device's only user, else the
sum of its processes' SM utilization (shared GPUs). A device without a value gives None with the reason, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from slurm_elastic.agent.aggregate import JobPoint
from slurm_elastic.agent.model import DeviceReading, GpuAllocation, JobRef
from slurm_elastic.agent.payload import GpuReport, ProcessReport

REASON_NO_DEVICE_READING = "no_device_reading"  # allocated GPU that NVML did not report (degraded, error)
REASON_NO_PROCESS_UTILIZATION = "no_process_utilization"


@dataclass
class _JobAcc:
    devices: dict[str, float | None] = field(default_factory=dict)
    allocated: set[str] = field(default_factory=set)
    in_use: set[str] = field(default_factory=set)
    reasons: list[str] = field(default_factory=list)
    memory: int = 0
    sluid: str | None = None
    user: str | None = None
    account: str | None = None
    uid: int | None = None

    def meta(self, sluid: str | None, user: str | None, account: str | None, uid: int | None) -> None:
        self.sluid = self.sluid or sluid
        self.user = self.user or user
        self.account = self.account or account
        self.uid = self.uid if self.uid is not None else uid


def _device_sort_key(key: str) -> tuple[int, ...]:
    return tuple(int(x) for x in key.split("/") if x.isdigit())


def _process_reports(
    d: DeviceReading, alloc: GpuAllocation | None, pid_jobs: Mapping[int, JobRef],
    by_sluid: Mapping[str, GpuAllocation],
) -> tuple[ProcessReport, ...]:
    out = []
    for p in d.processes:
        ref = pid_jobs.get(p.pid)
        job_id, source = (ref.job_id, ref.source) if ref else (None, None)
        sluid, step = (ref.sluid, ref.step) if ref else (None, None)
        if job_id is None and sluid is not None and sluid in by_sluid:
            job_id, source = by_sluid[sluid].job_id, "prolog"
        if job_id is None and alloc is not None and sluid is None:
            job_id, source = alloc.job_id, "prolog"
        out.append(ProcessReport(p.pid, job_id, sluid, step, source if job_id is not None else None,
                                 p.sm_util_percent, p.memory_used_mib))
    return tuple(out)


def attribute(
    devices: Sequence[DeviceReading],
    allocations: Mapping[int, GpuAllocation],
    pid_jobs: Mapping[int, JobRef],
) -> tuple[tuple[GpuReport, ...], tuple[JobPoint, ...]]:
    by_sluid = {a.sluid: a for a in allocations.values() if a.sluid}
    refs_by_job: dict[int, JobRef] = {}
    for ref in pid_jobs.values():
        if ref.job_id is not None:
            refs_by_job.setdefault(ref.job_id, ref)

    gpus: list[GpuReport] = []
    jobs: dict[int, _JobAcc] = {}
    read_indices = {d.index for d in devices if d.kind == "gpu"}
    for d in devices:
        alloc = allocations.get(d.index) if d.kind == "gpu" and not d.mig_enabled else None
        procs = _process_reports(d, alloc, pid_jobs, by_sluid)
        proc_jobs = {p.job_id for p in procs if p.job_id is not None}
        owner: int | None
        if alloc is not None:
            owner, owner_source = alloc.job_id, "prolog"
        elif len(proc_jobs) == 1:
            owner, owner_source = next(iter(proc_jobs)), "process"
        else:
            owner, owner_source = None, None
        owner_ref = refs_by_job.get(owner) if owner is not None else None
        user = alloc.user if alloc else (owner_ref.user if owner_ref else None)
        account = alloc.account if alloc else (owner_ref.account if owner_ref else None)
        util_reason = (d.error or d.utilization_reason) if d.utilization_percent is None else None
        gpus.append(GpuReport(
            id=d.key, kind=d.kind, index=d.index, uuid=d.uuid, name=d.name, minor=d.minor,
            mig_enabled=d.mig_enabled, parent_uuid=d.parent_uuid, gpu_instance_id=d.gpu_instance_id,
            compute_instance_id=d.compute_instance_id, profile=d.profile,
            utilization_percent=d.utilization_percent,
            utilization_reason=util_reason or ("unknown" if d.utilization_percent is None else None),
            memory_used_mib=d.memory_used_mib, memory_total_mib=d.memory_total_mib,
            job_id=owner, user=user, account=account, owner_source=owner_source,
            processes=procs, processes_reason=d.processes_reason, error=d.error,
        ))

        holders = proc_jobs | ({owner} if owner is not None else set())
        for job_id in holders:
            acc = jobs.setdefault(job_id, _JobAcc())
            mine = [p for p in procs if p.job_id == job_id]
            if job_id == owner:
                acc.allocated.add(d.key)
            if mine:
                acc.in_use.add(d.key)
            util: float | None
            if job_id == owner and len(mine) == len(procs):
                util, reason = d.utilization_percent, gpus[-1].utilization_reason
            elif any(p.sm_util_percent is None for p in mine):
                util, reason = None, d.utilization_reason or REASON_NO_PROCESS_UTILIZATION
            else:
                util, reason = min(100.0, sum(p.sm_util_percent or 0.0 for p in mine)), None
            if d.error:
                util, reason = None, d.error
            acc.devices[d.key] = util
            if util is None and reason:
                acc.reasons.append(reason)
            acc.memory += sum(p.memory_used_mib or 0 for p in mine)
            jref = refs_by_job.get(job_id)
            if alloc is not None and job_id == alloc.job_id:
                acc.meta(alloc.sluid, alloc.user, alloc.account, alloc.uid)
            if jref is not None:
                acc.meta(jref.sluid, jref.user, jref.account, jref.uid)

    # Allocated GPUs that NVML did not report (degraded mode, NVML failure): held, not measured.
    for index, alloc in sorted(allocations.items()):
        if index in read_indices:
            continue
        key = str(index)
        gpus.append(GpuReport(
            id=key, kind="gpu", index=index, uuid=None, name=None, minor=None, mig_enabled=False,
            parent_uuid=None, gpu_instance_id=None, compute_instance_id=None, profile=None,
            utilization_percent=None, utilization_reason=REASON_NO_DEVICE_READING, memory_used_mib=None,
            memory_total_mib=None, job_id=alloc.job_id, user=alloc.user, account=alloc.account,
            owner_source="prolog", processes=(), processes_reason=REASON_NO_DEVICE_READING,
            error=REASON_NO_DEVICE_READING,
        ))
        acc = jobs.setdefault(alloc.job_id, _JobAcc())
        acc.allocated.add(key)
        acc.devices[key] = None
        acc.reasons.append(REASON_NO_DEVICE_READING)
        acc.meta(alloc.sluid, alloc.user, alloc.account, alloc.uid)

    points = []
    for job_id, acc in sorted(jobs.items()):
        keys = tuple(sorted(acc.devices, key=_device_sort_key))
        points.append(JobPoint(
            job_id=job_id, devices=keys,
            allocated=tuple(k for k in keys if k in acc.allocated),
            in_use=tuple(k for k in keys if k in acc.in_use),
            util_by_device=tuple((k, acc.devices[k]) for k in keys),
            util_reason=acc.reasons[0] if acc.reasons else None,
            memory_used_mib=acc.memory, sluid=acc.sluid, user=acc.user, account=acc.account, uid=acc.uid,
        ))
    return tuple(gpus), tuple(points)
