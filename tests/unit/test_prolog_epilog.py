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
