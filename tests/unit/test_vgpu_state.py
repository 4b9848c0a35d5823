"""The virtual GPU state: text format, safe file updates, and the workload helper."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_elastic.testing.vgpu.build import build_library
from slurm_elastic.testing.vgpu.state import (
    TornStateError,
    VgpuState,
    VgpuStateError,
    format_state,
    make_node_state,
    parse_state,
    with_delay,
    with_fault,
    with_mig,
    with_process,
)
from slurm_elastic.testing.vgpu.statefile import StateFile, process_starttime
from slurm_elastic.testing.vgpu.workload import VgpuWorkloadError, allocated_gpus, parse_gpu_list, state_path
from tests.unit import vgpu_support


def rich_state() -> VgpuState:
    s = make_node_state("n2", 4, minor_base=4)
    s = with_process(s, 1234, (0, 1), sm_util=90, memory_mib=1000, starttime=42)
    s = with_mig(s, 3, (("3g.20gb", 0), ("1g.5gb", 4)))
    s = with_process(s, 1235, (3,), sm_util=10, memory_mib=100, gi=2, ci=0)
    s = with_fault(s, "nvmlDeviceGetUtilizationRates", 3, gpu=1)
    return with_delay(s, "*", 50)


def test_format_round_trips() -> None:
    s = rich_state()
    assert parse_state(format_state(s)) == s


def test_format_is_line_oriented_with_header_and_end() -> None:
    text = format_state(make_node_state("n1", 1, mig_capable=False))
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines[0] == "vgpu-state 1"
    assert lines[-1] == "end"
    assert any(line.startswith("gpu 0 0 40960 0 GPU-") and line.endswith("NVIDIA A100-SXM4-40GB") for line in lines)


def test_names_with_spaces_survive() -> None:
    text = "vgpu-state 1\ngpu 0 3 80 0 GPU-x NVIDIA H100 80GB HBM3\nend\n"
    assert parse_state(text).gpus[0].name == "NVIDIA H100 80GB HBM3"


def test_unknown_records_are_kept_verbatim() -> None:
    s = parse_state("vgpu-state 1\nfuture-thing 1 2 3\nend\n")
    assert s.extra == ("future-thing 1 2 3",)
    assert "future-thing 1 2 3" in format_state(s)


@pytest.mark.parametrize("text", ["", "vgpu-state 1\n", "vgpu-state 1\ngpu 0 0 10 0 GPU-a A\n"])
def test_without_end_the_state_is_torn(text: str) -> None:
    with pytest.raises(TornStateError):
        parse_state(text)


@pytest.mark.parametrize(("text", "message"), [
    ("vgpu-state 2\nend\n", "vgpu-state 1"),
    ("vgpu-state 1\ngpu 0 x 10 0 GPU-a A\nend\n", "not a number"),
    ("vgpu-state 1\ngpu 0 0 10 0 GPU-a\nend\n", "uuid and a name"),
    ("vgpu-state 1\ngpu 0 0 10 0 GPU-a A\ngpu 0 1 10 0 GPU-b B\nend\n", "duplicate GPU index"),
    ("vgpu-state 1\nproc 5 3 -1 -1 10 1 1 0\nend\n", "unknown GPU 3"),
    ("vgpu-state 1\nend\ngpu 0 0 10 0 GPU-a A\n", "after 'end'"),
])
def test_bad_states_are_refused_with_the_line(text: str, message: str) -> None:
    with pytest.raises(VgpuStateError, match=message):
        parse_state(text)


def test_edits_validate() -> None:
    s = make_node_state("n1", 2)
    with pytest.raises(VgpuStateError):
        with_process(s, 5, (7,), sm_util=10, memory_mib=1)
    with pytest.raises(VgpuStateError):
        with_process(s, 5, (0,), sm_util=101, memory_mib=1)
    with pytest.raises(VgpuStateError, match="unknown MIG profile"):
        with_mig(s, 0, (("9g.99gb", 0),))
    with pytest.raises(VgpuStateError, match="invalid or taken"):
        with_mig(s, 0, (("3g.20gb", 0), ("2g.10gb", 2)))


def test_gpu_uuids_are_stable_and_distinct_per_node() -> None:
    a, b = make_node_state("n1", 4), make_node_state("n2", 4)
    assert make_node_state("n1", 4).gpus == a.gpus
    assert not {g.uuid for g in a.gpus} & {g.uuid for g in b.gpus}


# ---- the file ----------------------------------------------------------------------------------------------


def test_write_is_atomic_and_keeps_mode(tmp_path: Path) -> None:
    sf = StateFile(tmp_path / "n1.state")
    sf.write(make_node_state("n1", 2))
    assert (sf.path.stat().st_mode & 0o777) == 0o666
    assert (sf.lock_path.stat().st_mode & 0o777) == 0o666
    before = sf.path.stat().st_ino
    sf.update(lambda s: with_process(s, 9, (1,), sm_util=1, memory_mib=1))
    assert sf.path.stat().st_ino != before  # replaced by rename, never rewritten under a reader
    assert [p.pid for p in sf.read().processes] == [9]
    assert not [p for p in tmp_path.iterdir() if ".tmp." in p.name]


def test_falls_back_to_in_place_rewrite_when_rename_is_refused(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    sf = StateFile(tmp_path / "n1.state")
    sf.write(make_node_state("n1", 2))

    def refuse(src: str, dst: str) -> None:  # what a sticky directory does to another user's file
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "rename", refuse)
    ino = sf.path.stat().st_ino
    sf.update(lambda s: with_process(s, 9, (1,), sm_util=1, memory_mib=1))
    assert sf.path.stat().st_ino == ino
    assert [p.pid for p in sf.read().processes] == [9]
    assert not [p for p in tmp_path.iterdir() if ".tmp." in p.name]


def test_concurrent_updates_lose_nothing(tmp_path: Path) -> None:
    sf = StateFile(tmp_path / "n1.state")
    sf.write(make_node_state("n1", 1))
    code = (
        "import sys\nfrom slurm_elastic.testing.vgpu.statefile import StateFile\n"
        "from slurm_elastic.testing.vgpu.state import with_process\n"
        "sf = StateFile(sys.argv[1]); base = int(sys.argv[2])\n"
        "for i in range(25):\n"
        "    sf.update(lambda s: with_process(s, base + i, (0,), sm_util=1, memory_mib=1))\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(sf.path), str(1000 * (k + 1))],
                              env=vgpu_support.vgpu_env(sf.path)) for k in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert len(sf.read().processes) == 100


def test_process_starttime_reads_field_22(tmp_path: Path) -> None:
    (tmp_path / "77").mkdir()
    fields = " ".join(str(n) for n in range(3, 30))  # field n holds the number n
    (tmp_path / "77" / "stat").write_text(f"77 (a (weird) name) S {fields[2:]}\n")
    assert process_starttime(77, tmp_path) == 22
    assert process_starttime(78, tmp_path) == 0
    assert process_starttime(os.getpid()) > 0


def test_a_workload_in_a_time_namespace_records_its_start_as_seen_outside() -> None:
    """The test cluster's resumed nodes run slurmd (and so their jobs) in a time namespace booted at the resume
    (docker-slurm/power-resume.sh): inside, /proc/<pid>/stat shows the start 100 s off. The workload records it
    as the agent outside reads it, so the virtual NVML library keeps counting its utilization."""
    if subprocess.run(["unshare", "--time", "--boottime", "-100", "true"], capture_output=True,
                      check=False).returncode != 0:
        pytest.skip("no time namespaces here (unshare --time needs root and Linux >= 5.6)")
    code = ("import os, sys; from slurm_elastic.testing.vgpu.statefile import host_starttime, process_starttime; "
            "print(os.getpid(), process_starttime(os.getpid()), host_starttime(os.getpid()), flush=True); "
            "sys.stdin.read()")
    with subprocess.Popen(["unshare", "--time", "--boottime", "-100", sys.executable, "-c", code],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}) as child:
        assert child.stdout is not None and child.stdin is not None
        pid, inside, recorded = (int(x) for x in child.stdout.readline().split())
        outside = process_starttime(pid)  # what the agent reads, while the child still runs
        child.stdin.close()
    hz = os.sysconf("SC_CLK_TCK")
    assert inside == outside - 100 * hz  # the namespace's view: what the workload recorded before
    assert recorded == outside


def test_build_is_idempotent(tmp_path: Path) -> None:
    lib = build_library(tmp_path)
    mtime = lib.stat().st_mtime_ns
    assert build_library(tmp_path) == lib
    assert lib.stat().st_mtime_ns == mtime
    (tmp_path / "libnvidia-ml.so.1.sha256").write_text("stale\n")
    build_library(tmp_path)
    assert (tmp_path / "libnvidia-ml.so.1.sha256").read_text().strip() != "stale"


# ---- the workload ------------------------------------------------------------------------------------------


def test_gpu_lists() -> None:
    assert parse_gpu_list("0,2-3") == (0, 2, 3)
    assert allocated_gpus({"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}) == (2, 3)
    assert allocated_gpus({"CUDA_VISIBLE_DEVICES": "1"}) == (1,)
    with pytest.raises(VgpuWorkloadError):
        allocated_gpus({})
    with pytest.raises(VgpuWorkloadError):
        parse_gpu_list("GPU-abc")


def test_state_path_resolution() -> None:
    assert state_path({"SLURM_ELASTIC_VGPU_DIR": "/d"}, "n3") == Path("/d/n3.state")
    both = {"SLURM_ELASTIC_VGPU_STATE": "/x.state", "SLURM_ELASTIC_VGPU_DIR": "/d"}
    assert state_path(both, "n3") == Path("/x.state")
    with pytest.raises(VgpuWorkloadError):
        state_path({}, "n3")


def _wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_workload_registers_changes_utilization_and_cleans_up(tmp_path: Path) -> None:
    sf = StateFile(tmp_path / "n1.state")
    sf.write(make_node_state("n1", 4))
    util_file = tmp_path / "util"
    util_file.write_text("10\n")
    env = vgpu_support.vgpu_env(sf.path, SLURMD_NODENAME="n1", SLURM_JOB_GPUS="1,3")
    env.pop("SLURM_ELASTIC_VGPU_STATE")
    env["SLURM_ELASTIC_VGPU_DIR"] = str(tmp_path)
    p = subprocess.Popen([sys.executable, "-m", "slurm_elastic.testing.vgpu.workload", "--util", "50",
                          "--mem-mib", "300", "--util-file", str(util_file)],
                         env=env, stdout=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: len(sf.read().processes) == 2)
        entries = sf.read().processes
        assert {(e.pid, e.gpu, e.sm_util, e.memory_mib) for e in entries} == {(p.pid, 1, 10, 300), (p.pid, 3, 10, 300)}
        assert all(e.starttime == process_starttime(p.pid) for e in entries)
        util_file.write_text("90\n")
        p.send_signal(signal.SIGUSR2)
        _wait_for(lambda: {e.sm_util for e in sf.read().processes} == {90})
    finally:
        p.terminate()
        assert p.wait(timeout=30) == 0
    assert sf.read().processes == ()


def test_workload_without_gpus_fails_clearly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")}
    out = subprocess.run([sys.executable, "-m", "slurm_elastic.testing.vgpu.workload", "--util", "5", "--state",
                          str(tmp_path / "x.state")], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1
    assert "no GPUs" in out.stderr
