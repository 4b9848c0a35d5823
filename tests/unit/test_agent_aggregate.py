"""Attribution of devices to jobs and the per-job window statistics (pure, no I/O, explicit times)."""

from __future__ import annotations

import pytest

from slurm_elastic.agent.aggregate import JobHistory, JobPoint, aggregate_jobs
from slurm_elastic.agent.attribution import attribute
from slurm_elastic.agent.model import DeviceReading, GpuAllocation, JobRef, JobSource, ProcessReading


def gpu(index: int, util: float | None = 0.0, procs: tuple[ProcessReading, ...] = (), *,
        reason: str | None = None, error: str | None = None) -> DeviceReading:
    return DeviceReading(str(index), "gpu", index, f"GPU-{index}", "A100", index, 0, 40960, util,
                         reason if util is None else None, processes=procs, error=error)


def mig(index: int, gi: int, procs: tuple[ProcessReading, ...] = ()) -> DeviceReading:
    return DeviceReading(f"{index}/{gi}/0", "mig", index, f"MIG-{index}-{gi}", "A100 MIG 3g.20gb", None, 0, 19968,
                         None, "mig_no_utilization", parent_uuid=f"GPU-{index}", gpu_instance_id=gi,
                         compute_instance_id=0, profile="3g.20gb", processes=procs)


def proc(pid: int, util: float | None, mem: int = 100) -> ProcessReading:
    return ProcessReading(pid, mem, util)


def alloc(index: int, job: int, user: str = "alice", account: str = "nlp") -> GpuAllocation:
    return GpuAllocation(index, job, 1001, user, account)


def ref(job: int | None, source: JobSource = "cgroup", *, sluid: str | None = None, user: str | None = None) -> JobRef:
    return JobRef(job, source, sluid=sluid, user=user)


def point(job: int, utils: dict[str, float | None], *, allocated: tuple[str, ...] | None = None,
          in_use: tuple[str, ...] = (), mem: int = 0, reason: str | None = None) -> JobPoint:
    keys = tuple(sorted(utils))
    return JobPoint(job, keys, keys if allocated is None else allocated, in_use, tuple((k, utils[k]) for k in keys),
                    reason, mem)


# ---- attribution -------------------------------------------------------------------------------------------


def test_a_job_at_90_percent_on_two_gpus() -> None:
    devices = [gpu(0, 90, (proc(100, 90),)), gpu(1, 90, (proc(100, 90),)), gpu(2), gpu(3)]
    gpus, points = attribute(devices, {0: alloc(0, 7), 1: alloc(1, 7)}, {100: ref(7)})
    (p,) = points
    assert (p.job_id, p.allocated, p.in_use, p.util_mean, p.memory_used_mib) == (7, ("0", "1"), ("0", "1"), 90, 200)
    assert (p.user, p.account) == ("alice", "nlp")
    assert [(g.id, g.job_id, g.owner_source) for g in gpus] == [
        ("0", 7, "prolog"), ("1", 7, "prolog"), ("2", None, None), ("3", None, None)]
    assert gpus[0].processes[0].job_id == 7 and gpus[0].processes[0].job_source == "cgroup"


def test_allocated_but_idle_is_zero_not_missing() -> None:
    gpus, points = attribute([gpu(0), gpu(1), gpu(2)], {1: alloc(1, 8), 2: alloc(2, 8)}, {})
    (p,) = points
    assert (p.job_id, p.allocated, p.in_use, p.util_mean, p.util_max) == (8, ("1", "2"), (), 0.0, 0.0)


def test_holding_two_gpus_using_one_halves_the_mean() -> None:
    _, (p,) = attribute([gpu(0, 80, (proc(5, 80),)), gpu(1)], {0: alloc(0, 9), 1: alloc(1, 9)}, {5: ref(9)})
    assert (p.util_mean, p.util_max, p.in_use) == (40.0, 80.0, ("0",))


def test_two_jobs_on_one_node_are_kept_apart() -> None:
    devices = [gpu(0, 90, (proc(1, 90),)), gpu(1, 90, (proc(1, 90),)), gpu(2, 10, (proc(2, 10),)), gpu(3)]
    allocations = {0: alloc(0, 11), 1: alloc(1, 11), 2: alloc(2, 12, "bob", "vision"), 3: alloc(3, 12, "bob", "vision")}
    _, points = attribute(devices, allocations, {1: ref(11), 2: ref(12)})
    by_job = {p.job_id: p for p in points}
    assert (by_job[11].devices, by_job[11].util_mean) == (("0", "1"), 90.0)
    assert (by_job[12].devices, by_job[12].util_mean, by_job[12].in_use, by_job[12].user) == (("2", "3"), 5.0,
                                                                                              ("2",), "bob")


def test_shared_gpu_uses_per_process_utilization() -> None:
    devices = [gpu(0, 100, (proc(1, 70), proc(2, 30)))]
    _, points = attribute(devices, {}, {1: ref(21), 2: ref(22)})
    by_job = {p.job_id: p for p in points}
    assert (by_job[21].util_mean, by_job[22].util_mean) == (70.0, 30.0)
    assert by_job[21].allocated == () and by_job[21].in_use == ("0",)


def test_unattributed_process_on_an_allocated_gpu_belongs_to_the_allocation() -> None:
    gpus, (p,) = attribute([gpu(0, 50, (proc(9, 50),))], {0: alloc(0, 31)}, {})
    assert gpus[0].processes[0].job_id == 31 and gpus[0].processes[0].job_source == "prolog"
    assert p.util_mean == 50.0


def test_without_map_files_the_processes_job_owns_the_gpu() -> None:
    gpus, (p,) = attribute([gpu(0, 60, (proc(9, 60),))], {}, {9: ref(40, "environ", user="carol")})
    assert (gpus[0].job_id, gpus[0].owner_source, gpus[0].user) == (40, "process", "carol")
    assert (p.allocated, p.util_mean) == (("0",), 60.0)


def test_sluid_resolved_through_map_files() -> None:
    allocations = {0: GpuAllocation(0, 55, 0, "root", "root", "SEKNKTV3WPV500")}
    gpus, (p,) = attribute([gpu(0, 20, (proc(3, 20),))], allocations, {3: ref(None, sluid="SEKNKTV3WPV500")})
    assert gpus[0].processes[0].job_id == 55 and p.sluid == "SEKNKTV3WPV500"


def test_mig_instances_report_null_utilization_with_reason() -> None:
    devices = [DeviceReading("0", "gpu", 0, "GPU-0", "A100", 0, 0, 40960, None, "mig_enabled", mig_enabled=True),
               mig(0, 1, (proc(4, None),)), mig(0, 2)]
    gpus, (p,) = attribute(devices, {0: alloc(0, 99)}, {4: ref(60)})  # a map file on a MIG GPU is ignored
    assert [(g.id, g.utilization_percent, g.utilization_reason) for g in gpus] == [
        ("0", None, "mig_enabled"), ("0/1/0", None, "mig_no_utilization"), ("0/2/0", None, "mig_no_utilization")]
    assert (p.job_id, p.devices, p.util_mean, p.util_reason) == (60, ("0/1/0",), None, "mig_no_utilization")


def test_unreadable_device_and_allocated_gpu_without_reading() -> None:
    gpus, points = attribute([gpu(0, None, error="gpu_is_lost", reason="gpu_is_lost")],
                             {0: alloc(0, 70), 1: alloc(1, 70)}, {})
    assert [(g.id, g.error) for g in gpus] == [("0", "gpu_is_lost"), ("1", "no_device_reading")]
    (p,) = points
    assert (p.util_mean, p.util_reason, p.allocated) == (None, "gpu_is_lost", ("0", "1"))


# ---- window aggregation -----------------------------------------------------------------------------------


def test_mean_max_and_last_over_the_window() -> None:
    samples = [(t, {1: point(1, {"0": u, "1": 0.0}, in_use=("0",), mem=m)})
               for t, u, m in ((100.0, 80.0, 10), (105.0, 60.0, 30), (110.0, 100.0, 20))]
    (r,) = aggregate_jobs(samples, now=110.0, window_s=60.0)
    assert (r.util_mean_percent, r.util_max_percent, r.util_last_percent) == (40.0, 100.0, 50.0)
    assert (r.gpus_allocated, r.gpus_in_use, r.devices) == (2, 1, ("0", "1"))
    assert (r.memory_used_mib, r.memory_max_mib) == (20, 30)
    assert (r.sample_count, r.util_sample_count, r.first_sample_at, r.last_sample_at) == (3, 3, 100.0, 110.0)


def test_samples_outside_the_window_are_ignored() -> None:
    samples = [(t, {1: point(1, {"0": u})}) for t, u in ((0.0, 100.0), (50.0, 100.0), (95.0, 10.0), (100.0, 20.0))]
    (r,) = aggregate_jobs(samples, now=100.0, window_s=10.0)
    assert (r.util_mean_percent, r.util_max_percent, r.sample_count, r.first_sample_at) == (15.0, 20.0, 2, 95.0)


def test_only_jobs_of_the_latest_sample_are_reported() -> None:
    samples = [(1.0, {1: point(1, {"0": 5.0}), 2: point(2, {"1": 7.0})}), (2.0, {2: point(2, {"1": 9.0})})]
    assert [r.job_id for r in aggregate_jobs(samples, now=2.0, window_s=100.0)] == [2]
    assert aggregate_jobs([], now=2.0, window_s=100.0) == ()


def test_null_utilization_stays_null_with_its_reason() -> None:
    samples = [(t, {1: point(1, {"0/1/0": None}, reason="mig_no_utilization")}) for t in (1.0, 2.0)]
    (r,) = aggregate_jobs(samples, now=2.0, window_s=10.0)
    assert (r.util_mean_percent, r.util_max_percent, r.util_last_percent) == (None, None, None)
    assert (r.utilization_reason, r.sample_count, r.util_sample_count) == ("mig_no_utilization", 2, 0)


@pytest.mark.parametrize(("utils", "expected"), [
    ({"0": 90.0, "1": 90.0}, 90.0), ({"0": 90.0, "1": 0.0}, 45.0), ({"0": None, "1": 30.0}, 30.0),
    ({"0": None}, None),
])
def test_per_sample_mean_over_devices(utils: dict[str, float | None], expected: float | None) -> None:
    assert point(1, utils).util_mean == expected


def test_history_prunes_by_time() -> None:
    h = JobHistory(window_s=10.0)
    for t in range(0, 30, 5):
        h.add(float(t), [point(1, {"0": float(t)})])
    assert len(h) == 2  # 20 and 25: older samples are outside (15, 25]
    (r,) = h.jobs(now=25.0)
    assert (r.sample_count, r.util_mean_percent) == (2, 22.5)
