"""The production NVML reader and the sampler, run unchanged against the virtual libnvidia-ml.so.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

from slurm_elastic.agent.errors import NvmlReadError, NvmlUnavailableError
from slurm_elastic.agent.payload import parse_payload
from slurm_elastic.agent.procfs import GpuMapReader, ProcJobResolver
from slurm_elastic.agent.reader import NvmlGpuReader
from slurm_elastic.agent.sampler import Sampler
from slurm_elastic.testing.vgpu.state import with_delay, with_fault, with_mig, with_process, without_faults
from slurm_elastic.testing.vgpu.statefile import StateFile
from tests.unit import vgpu_support

vgpu = vgpu_support.vgpu
V1 = "6:freezer:/slurm_n1/uid_0/job_{job}/step_batch\n5:devices:/slurm_n1/uid_0/job_{job}/step_batch/task_0\n"


@pytest.fixture
def workers() -> Iterator[list[int]]:
    """Three live processes to register as GPU workloads."""
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(3)]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def fake_proc(root: Path, pid: int, job: int) -> None:
    """A /proc entry for ``pid`` in job ``job`` (the agent reads /proc from a fixture root)."""
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} (sleep) S 1 {' '.join(['0'] * 17)} 12345 0\n")
    (d / "cgroup").write_text(V1.format(job=job))


def make_sampler(tmp_path: Path, **kw: object) -> Sampler:
    args: dict[str, object] = dict(node="n1", reader=NvmlGpuReader(), resolver=ProcJobResolver(tmp_path / "proc"),
                                   gpu_map=GpuMapReader(tmp_path / "map", "n1"), interval_s=1.0, window_s=60.0,
                                   nvml_timeout_s=10.0)
    args.update(kw)
    return Sampler(**args)  # type: ignore[arg-type]


def write_map(tmp_path: Path, gpu: int, line: str) -> None:
    d = tmp_path / "map" / "n1"
    d.mkdir(parents=True, exist_ok=True)
    (d / str(gpu)).write_text(line + "\n")


def test_a_sample_of_four_gpus_with_jobs(vgpu: StateFile, workers: list[int], tmp_path: Path) -> None:
    a, b, _ = workers
    vgpu.update(lambda s: with_process(with_process(s, a, (0, 1), sm_util=90, memory_mib=1000),
                                       b, (2,), sm_util=10, memory_mib=500))
    fake_proc(tmp_path / "proc", a, 101)
    fake_proc(tmp_path / "proc", b, 102)
    for gpu, job in ((0, 101), (1, 101), (2, 102), (3, 102)):
        write_map(tmp_path, gpu, f"{job} 0 root root -")
    sampler = make_sampler(tmp_path)
    assert sampler.start().status == "ok"
    try:
        report = sampler.sample_once()
    finally:
        sampler.close()
    assert [(g.id, g.utilization_percent, g.memory_used_mib, g.job_id) for g in report.gpus] == [
        ("0", 90.0, 1000, 101), ("1", 90.0, 1000, 101), ("2", 10.0, 500, 102), ("3", 0.0, 0, 102)]
    jobs = {j.job_id: j for j in report.jobs}
    assert (jobs[101].util_last_percent, jobs[101].gpus_in_use, jobs[101].memory_used_mib) == (90.0, 2, 2000)
    assert (jobs[102].util_last_percent, jobs[102].gpus_allocated, jobs[102].gpus_in_use) == (5.0, 2, 1)
    assert report.gpus[0].processes[0].sm_util_percent == 90.0
    assert report.errors == ()


def test_not_supported_fields_are_null_and_not_errors(vgpu: StateFile) -> None:
    vgpu.update(lambda s: with_fault(with_fault(s, "nvmlDeviceGetUtilizationRates", 3, gpu=1),
                                     "nvmlDeviceGetMinorNumber", 3))
    reader = NvmlGpuReader()
    reader.open()
    reading = reader.read()
    reader.close()
    d1 = reading.devices[1]
    assert (d1.utilization_percent, d1.utilization_reason, d1.minor) == (None, "not_supported", None)
    assert reading.devices[0].utilization_percent == 0.0
    assert reading.errors == ()


@pytest.mark.parametrize(("function", "code", "reason"), [
    ("*", pynvml.NVML_ERROR_GPU_IS_LOST, "gpu_is_lost"),
    ("nvmlDeviceGetUUID", pynvml.NVML_ERROR_UNKNOWN, "unknown"),
    ("nvmlDeviceGetHandleByIndex", pynvml.NVML_ERROR_NO_PERMISSION, "no_permission"),
])
def test_an_unreadable_gpu_is_reported_and_the_others_still_read(vgpu: StateFile, function: str, code: int,
                                                                 reason: str) -> None:
    vgpu.update(lambda s: with_fault(s, function, code, gpu=2))
    reader = NvmlGpuReader()
    reader.open()
    reading = reader.read()
    reader.close()
    assert [(d.key, d.error) for d in reading.devices] == [("0", None), ("1", None), ("2", reason), ("3", None)]
    assert [(e.code, e.device) for e in reading.errors] == [(reason, "2")]


@pytest.mark.parametrize(("function", "code", "field"), [
    ("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN, "memory_used_mib"),
    ("nvmlDeviceGetUtilizationRates", pynvml.NVML_ERROR_GPU_IS_LOST, "utilization_percent"),
    ("nvmlDeviceGetName", pynvml.NVML_ERROR_NO_PERMISSION, "name"),
])
def test_a_failing_field_is_null_with_an_error_entry(vgpu: StateFile, function: str, code: int, field: str) -> None:
    vgpu.update(lambda s: with_fault(s, function, code, gpu=0))
    reader = NvmlGpuReader()
    reader.open()
    reading = reader.read()
    reader.close()
    assert getattr(reading.devices[0], field) is None
    assert getattr(reading.devices[1], field) is not None
    assert len(reading.errors) == 1 and reading.errors[0].device == "0"


def test_process_list_refused(vgpu: StateFile, workers: list[int]) -> None:
    vgpu.update(lambda s: with_fault(with_process(s, workers[0], (0,), sm_util=5, memory_mib=1),
                                     "nvmlDeviceGetComputeRunningProcesses", pynvml.NVML_ERROR_NO_PERMISSION))
    reader = NvmlGpuReader()
    reader.open()
    d0 = reader.read().devices[0]
    reader.close()
    assert (d0.processes, d0.processes_reason, d0.utilization_percent) == ((), "no_permission", 5.0)


def test_last_seen_timestamp_is_carried_between_samples(vgpu: StateFile, workers: list[int]) -> None:
    vgpu.update(lambda s: replace(with_process(s, workers[0], (0,), sm_util=40, memory_mib=1), clock_us=7_000_000))
    reader = NvmlGpuReader()
    reader.open()
    try:
        assert reader.read().devices[0].processes[0].sm_util_percent == 40.0
        # Same clock: nothing newer than the last sample seen, so the process did not run since: 0, not 40.
        assert reader.read().devices[0].processes[0].sm_util_percent == 0.0
        vgpu.update(lambda s: replace(s, clock_us=8_000_000))
        assert reader.read().devices[0].processes[0].sm_util_percent == 40.0
    finally:
        reader.close()


def test_mig_instances_are_devices_with_null_utilization(vgpu: StateFile, workers: list[int]) -> None:
    vgpu.update(lambda s: with_mig(s, 1, (("3g.20gb", 0), ("2g.10gb", 4))))
    vgpu.update(lambda s: with_process(s, workers[0], (1,), sm_util=50, memory_mib=300, gi=1, ci=0))
    reader = NvmlGpuReader()
    reader.open()
    devices = reader.read().devices
    reader.close()
    assert [d.key for d in devices] == ["0", "1", "1/1/0", "1/2/0", "2", "3"]
    parent, first, second = devices[1], devices[2], devices[3]
    assert (parent.mig_enabled, parent.utilization_percent, parent.utilization_reason) == (True, None, "mig_enabled")
    assert (first.kind, first.parent_uuid, first.gpu_instance_id, first.compute_instance_id, first.profile) == (
        "mig", parent.uuid, 1, 0, "3g.20gb")
    assert (first.utilization_percent, first.utilization_reason) == (None, "mig_no_utilization")
    assert (first.memory_total_mib, first.memory_used_mib) == (19968, 300)
    assert [(p.pid, p.sm_util_percent) for p in first.processes] == [(workers[0], None)]
    assert second.profile == "2g.10gb" and second.processes == ()


def test_mig_profile_falls_back_to_the_device_name(vgpu: StateFile) -> None:
    vgpu.update(lambda s: with_fault(with_mig(s, 0, (("1g.5gb", 0),)), "nvmlDeviceGetGpuInstanceById",
                                     pynvml.NVML_ERROR_NO_PERMISSION))
    reader = NvmlGpuReader()
    reader.open()
    reading = reader.read()
    reader.close()
    assert reading.devices[1].profile == "1g.5gb"
    assert [e.code for e in reading.errors] == ["no_permission"]


def test_whole_read_failure_raises(vgpu: StateFile) -> None:
    vgpu.update(lambda s: with_fault(s, "nvmlDeviceGetCount", pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    reader = NvmlGpuReader()
    reader.open()
    with pytest.raises(NvmlReadError) as info:
        reader.read()
    reader.close()
    assert info.value.reason == "driver_not_loaded"


def test_open_without_driver(vgpu: StateFile, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_ELASTIC_VGPU_STATE", "/nonexistent/n1.state")
    with pytest.raises(NvmlUnavailableError) as info:
        NvmlGpuReader().open()
    assert info.value.reason == "driver_not_loaded"


# ---- the sampler ------------------------------------------------------------------------------------------


def test_sampler_refuses_to_start_without_nvml_unless_degraded(vgpu: StateFile, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_ELASTIC_VGPU_FAULTS", "nvmlInit=9")
    with pytest.raises(NvmlUnavailableError):
        make_sampler(tmp_path).start()
    write_map(tmp_path, 1, "55 1001 alice nlp -")
    sampler = make_sampler(tmp_path, degraded_ok=True)
    info = sampler.start()
    assert info.status == "degraded" and "Driver Not Loaded" in (info.message or "")
    report = sampler.sample_once()
    sampler.close()
    assert report.nvml.status == "degraded"
    assert [(g.id, g.job_id, g.error) for g in report.gpus] == [("1", 55, "no_device_reading")]
    (job,) = report.jobs
    assert (job.job_id, job.util_mean_percent, job.utilization_reason) == (55, None, "no_device_reading")


def test_a_hung_nvml_call_times_out_and_never_piles_up(vgpu: StateFile, tmp_path: Path) -> None:
    sampler = make_sampler(tmp_path, nvml_timeout_s=0.5)
    sampler.start()
    try:
        assert sampler.sample_once().nvml.status == "ok"
        vgpu.update(lambda s: with_delay(s, "nvmlDeviceGetUtilizationRates", 3000, gpu=0))
        first = sampler.sample_once()
        assert (first.nvml.status, [e.code for e in first.errors], first.gpus) == ("error", ["nvml_timeout"], ())
        second = sampler.sample_once()  # the stuck call is still running: no second thread is started
        assert [e.code for e in second.errors] == ["nvml_busy"]
        vgpu.update(without_faults)
        deadline = time.monotonic() + 30
        while sampler._caller.busy and time.monotonic() < deadline:
            time.sleep(0.05)
        third = sampler.sample_once()
        assert (third.nvml.status, len(third.gpus)) == ("ok", 4)
        assert sampler.counters.sample_errors_total == {"nvml_timeout": 1, "nvml_busy": 1}
    finally:
        sampler.close()


def test_sampler_reopens_nvml_after_a_failed_read(vgpu: StateFile, tmp_path: Path) -> None:
    sampler = make_sampler(tmp_path)
    sampler.start()
    try:
        vgpu.update(lambda s: with_fault(s, "nvmlDeviceGetCount", pynvml.NVML_ERROR_GPU_IS_LOST))
        bad = sampler.sample_once()
        assert bad.nvml.status == "error" and [e.code for e in bad.errors] == ["gpu_is_lost"]
        vgpu.update(without_faults)
        assert sampler.sample_once().nvml.status == "ok"
    finally:
        sampler.close()


def test_a_process_gone_from_proc_is_unattributed_not_fatal(vgpu: StateFile, workers: list[int],
                                                            tmp_path: Path) -> None:
    vgpu.update(lambda s: with_process(s, workers[0], (0,), sm_util=30, memory_mib=10))
    (tmp_path / "proc").mkdir()  # the fixture /proc lacks the pid: it "exited" between NVML and /proc
    sampler = make_sampler(tmp_path)
    sampler.start()
    report = sampler.sample_once()
    sampler.close()
    (p,) = report.gpus[0].processes
    assert (p.pid, p.job_id, p.job_source) == (workers[0], None, None)
    assert report.jobs == ()


# ---- the CLI (fresh processes: the library comes from LD_LIBRARY_PATH as in production) ------------------

CLI = [sys.executable, "-c", "from slurm_elastic.cli import main; main()", "agent"]


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_cli_once_json_prints_a_valid_payload(vgpu: StateFile, workers: list[int], tmp_path: Path) -> None:
    vgpu.update(lambda s: with_process(s, workers[0], (3,), sm_util=77, memory_mib=10))
    out = run_cli(["--once", "--json", "--node", "n1", "--gpu-map-dir", str(tmp_path)],
                  vgpu_support.vgpu_env(vgpu.path))
    assert out.returncode == 0, out.stderr
    report = parse_payload(json.loads(out.stdout))
    assert (report.node, report.nvml.status, report.gpus[3].utilization_percent) == ("n1", "ok", 77.0)


def test_cli_once_text(vgpu: StateFile, tmp_path: Path) -> None:
    out = run_cli(["--once", "--node", "n1", "--gpu-map-dir", str(tmp_path)], vgpu_support.vgpu_env(vgpu.path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("node n1  nvml ok (driver 550.54.15)")


@vgpu_support.needs_no_system_nvml
def test_cli_without_nvml_library_fails_clearly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "SLURM_ELASTIC_VGPU_STATE")}
    env["PYTHONPATH"] = str(vgpu_support.REPO)
    out = run_cli(["--once", "--json", "--node", "n1"], env)
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "slurm-elastic agent: error: NVML unavailable (library_not_found): NVML library libnvidia-ml.so.1 not found: "
        "is the NVIDIA driver installed? (run with --on-nvml-missing degraded to report no GPUs)"]
    degraded = run_cli(["--once", "--json", "--node", "n1", "--on-nvml-missing", "degraded",
                        "--gpu-map-dir", str(tmp_path)], env)
    assert degraded.returncode == 0, degraded.stderr
    report = parse_payload(json.loads(degraded.stdout))
    assert (report.nvml.status, report.gpus) == ("degraded", ())


def test_cli_driver_not_loaded(vgpu: StateFile) -> None:
    out = run_cli(["--once", "--node", "n1"], vgpu_support.vgpu_env(vgpu.path.with_name("missing.state")))
    assert out.returncode == 1
    assert "driver is not loaded" in out.stderr


def test_cli_usage_errors_exit_2(vgpu: StateFile) -> None:
    out = run_cli(["--json"], vgpu_support.vgpu_env(vgpu.path))
    assert out.returncode == 2 and "--json needs --once" in out.stderr
