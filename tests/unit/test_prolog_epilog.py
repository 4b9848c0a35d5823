"""plugins/prolog.sh and epilog.sh: one map file per allocated GPU, removed by the epilog; never fail a job."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_elastic.agent.procfs import GpuMapReader

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    """Copies of the scripts in their own directory, with an env file beside them (as the cluster installs them)."""
    d = tmp_path / "etc"
    d.mkdir()
    for name in ("prolog.sh", "epilog.sh"):
        shutil.copy(PLUGINS / name, d / name)
    (d / "slurm-elastic.env").write_text(f"SLURM_ELASTIC_GPU_MAP_DIR={tmp_path / 'map'}\n")
    return d


def run(script: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": "n2"}
    return subprocess.run([str(script)], env={**base, **env}, capture_output=True, text=True, timeout=30, check=False)


JOB = {"SLURM_JOB_ID": "43", "SLURM_JOB_UID": "1001", "SLURM_JOB_USER": "alice", "SLURM_JOB_ACCOUNT": "nlp",
       "SLURM_JOB_GPUS": "1,3"}


def test_prolog_writes_one_file_per_gpu_and_epilog_removes_them(scripts: Path, tmp_path: Path) -> None:
    assert run(scripts / "prolog.sh", **JOB).returncode == 0
    d = tmp_path / "map" / "n2"
    assert sorted(p.name for p in d.iterdir()) == ["1", "3"]
    assert (d / "1").read_text() == "43 1001 alice nlp -\n"
    allocations, errors = GpuMapReader(tmp_path / "map", "n2").read()
    assert errors == [] and {i: (a.job_id, a.user, a.account) for i, a in allocations.items()} == {
        1: (43, "alice", "nlp"), 3: (43, "alice", "nlp")}
    (d / "0").write_text("44 0 root root -\n")  # another job's GPU
    assert run(scripts / "epilog.sh", SLURM_JOB_ID="43").returncode == 0
    assert sorted(p.name for p in d.iterdir()) == ["0"]


def test_prolog_records_the_sluid_when_slurm_gives_one(scripts: Path, tmp_path: Path) -> None:
    run(scripts / "prolog.sh", **{**JOB, "SLURM_JOB_SLUID": "sEKNKTV3WPV500"})
    assert (tmp_path / "map" / "n2" / "1").read_text() == "43 1001 alice nlp sEKNKTV3WPV500\n"


def test_without_gpus_or_job_nothing_is_written(scripts: Path, tmp_path: Path) -> None:
    assert run(scripts / "prolog.sh", SLURM_JOB_ID="5").returncode == 0
    assert run(scripts / "prolog.sh", SLURM_JOB_GPUS="0").returncode == 0
    assert not (tmp_path / "map").exists()


def test_odd_gpu_tokens_are_skipped(scripts: Path, tmp_path: Path) -> None:
    run(scripts / "prolog.sh", **{**JOB, "SLURM_JOB_GPUS": "0,../../x,2"})
    assert sorted(p.name for p in (tmp_path / "map" / "n2").iterdir()) == ["0", "2"]


def test_failures_never_fail_the_job(scripts: Path, tmp_path: Path) -> None:
    (tmp_path / "map").write_text("a file where the directory should be")
    for script in ("prolog.sh", "epilog.sh"):
        out = run(scripts / script, **JOB)
        assert (out.returncode, out.stderr) == (0, "")
    (scripts / "slurm-elastic.env").write_text("this is ( not shell\n")  # broken settings: defaults are used
    out = run(scripts / "prolog.sh", **JOB, SLURM_ELASTIC_GPU_MAP_DIR=str(tmp_path / "fallback"))
    assert out.returncode == 0
    assert sorted(p.name for p in (tmp_path / "fallback" / "n2").iterdir()) == ["1", "3"]


def test_scripts_are_executable_posix_sh() -> None:
    for name in ("prolog.sh", "epilog.sh"):
        path = PLUGINS / name
        assert os.access(path, os.X_OK)
        assert path.read_text().startswith("#!/bin/sh\n")
        assert path.read_text().rstrip().endswith("exit 0")
        assert subprocess.run(["sh", "-n", str(path)], timeout=30, check=False).returncode == 0


# ---- MPS -------------------------------------------------------------------------------------------------------

FAKE_MPS = Path(__file__).resolve().parents[1] / "fakes" / "nvidia-cuda-mps-control"


@pytest.fixture
def mps(scripts: Path, tmp_path: Path) -> Path:
    """The env file also names the fake MPS control; a fake scontrol on PATH records drains."""
    (scripts / "slurm-elastic.env").write_text(
        f"SLURM_ELASTIC_GPU_MAP_DIR={tmp_path / 'map'}\nSLURM_ELASTIC_MPS_CONTROL={FAKE_MPS}\n"
        "SLURM_ELASTIC_MPS_QUIT_WAIT=1\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.log"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    return tmp_path / "mps" / "n2"  # beside the map directory, per node


def run_mps(script: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run(script, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", **env)


def commands(mps_dir: Path, gpu: int) -> list[str]:
    log = mps_dir / f"gpu{gpu}" / "log" / "fake-mps-control.log"
    return log.read_text().splitlines() if log.exists() else []


MPS_JOB = {"SLURM_JOB_ID": "50", "SLURM_JOB_UID": "1001", "SLURM_JOB_USER": "alice", "SLURM_JOB_GPUS": "1",
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50", "CUDA_VISIBLE_DEVICES": "0"}


def test_an_mps_job_gets_a_daemon_and_server_on_its_gpu_and_the_epilog_stops_it(
        scripts: Path, mps: Path, tmp_path: Path) -> None:
    assert run_mps(scripts / "prolog.sh", tmp_path, **MPS_JOB).returncode == 0
    assert commands(mps, 1) == ["get_server_list", "-d CUDA_VISIBLE_DEVICES=1",
                                "set_default_active_thread_percentage 50", "start_server -uid 1001"]
    assert (mps / "gpu1" / "jobs" / "50").read_text() == "1001 50\n"
    assert (mps / "gpu1" / "pipe" / "fake-daemon").exists()
    assert run_mps(scripts / "epilog.sh", tmp_path, **MPS_JOB).returncode == 0
    assert commands(mps, 1)[4:] == ["get_server_list", "quit", "get_server_list"]
    assert not (mps / "gpu1" / "pipe" / "fake-daemon").exists()
    assert not (tmp_path / "scontrol.log").exists()


def test_a_second_mps_job_reuses_the_daemon_and_the_last_one_out_stops_it(
        scripts: Path, mps: Path, tmp_path: Path) -> None:
    other = {**MPS_JOB, "SLURM_JOB_ID": "51", "SLURM_JOB_UID": "1002", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    run_mps(scripts / "prolog.sh", tmp_path, **MPS_JOB)
    run_mps(scripts / "prolog.sh", tmp_path, **other)
    assert commands(mps, 1)[4:] == ["get_server_list", "set_default_active_thread_percentage 25",
                                    "start_server -uid 1002"]
    run_mps(scripts / "epilog.sh", tmp_path, **MPS_JOB)
    assert len(commands(mps, 1)) == 7  # job 51 still uses the GPU: nothing sent
    run_mps(scripts / "epilog.sh", tmp_path, **other)
    assert commands(mps, 1)[7:] == ["get_server_list", "quit", "get_server_list"]


def test_a_whole_gpu_job_stops_mps_on_its_gpu(scripts: Path, mps: Path, tmp_path: Path) -> None:
    run_mps(scripts / "prolog.sh", tmp_path, **MPS_JOB)
    (mps / "gpu1" / "jobs" / "50").unlink()  # as if the MPS job's epilog never ran
    whole = {"SLURM_JOB_ID": "60", "SLURM_JOB_UID": "0", "SLURM_JOB_GPUS": "0,1"}
    assert run_mps(scripts / "prolog.sh", tmp_path, **whole).returncode == 0
    assert commands(mps, 1)[4:] == ["get_server_list", "quit", "get_server_list"]
    assert commands(mps, 0) == []  # GPU 0 never had MPS: not even asked
    assert not (tmp_path / "scontrol.log").exists()


def test_mps_that_will_not_quit_drains_the_node_and_the_job_still_starts(
        scripts: Path, mps: Path, tmp_path: Path) -> None:
    run_mps(scripts / "prolog.sh", tmp_path, **MPS_JOB)
    (mps / "gpu1" / "pipe" / "fake-stuck").write_text("")
    out = run_mps(scripts / "prolog.sh", tmp_path, SLURM_JOB_ID="61", SLURM_JOB_GPUS="1")
    assert (out.returncode, out.stderr) == (0, "")
    assert commands(mps, 1)[4:] == ["get_server_list", "quit", "get_server_list"]  # still there after the wait
    assert (tmp_path / "scontrol.log").read_text() == (
        "update NodeName=n2 State=DRAIN Reason=slurm-elastic: MPS on GPU 1 would not quit for whole-GPU job 61\n")


def test_without_mps_control_mps_is_skipped(scripts: Path, tmp_path: Path) -> None:
    (scripts / "slurm-elastic.env").write_text(
        f"SLURM_ELASTIC_GPU_MAP_DIR={tmp_path / 'map'}\nSLURM_ELASTIC_MPS_CONTROL={tmp_path / 'missing'}\n")
    assert run(scripts / "prolog.sh", **MPS_JOB).returncode == 0
    assert not (tmp_path / "mps").exists()
    assert (tmp_path / "map" / "n2" / "1").exists()
