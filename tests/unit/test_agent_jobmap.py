"""pid and GPU -> Slurm job: cgroup lines (real fixtures), environ, prolog map files, and /proc fixture trees."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from slurm_elastic.agent.jobmap import CgroupJob, MapFileError, parse_cgroup, parse_environ, parse_gpu_map
from slurm_elastic.agent.model import GpuAllocation, JobRef
from slurm_elastic.agent.procfs import GpuMapReader, ProcJobResolver

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cgroup"

EXPECTED: dict[str, CgroupJob | None] = {
    "v1-slurm22.05-debian-multislurmd-batch.txt": CgroupJob(43, None, "batch", 0, "n1", 1),
    "v1-slurm22.05-debian-multislurmd-step0.txt": CgroupJob(43, None, "0", 0, "n1", 1),
    "v1-host-not-in-a-job.txt": None,
    "v1-classic-single-slurmd.txt": CgroupJob(123, None, "0", 1000, None, 1),
    "v2-step0.txt": CgroupJob(3385, None, "0", None, None, 2),
    "v2-multislurmd-batch.txt": CgroupJob(77, None, "batch", None, "n1", 2),
    "v2-slurmstepd-of-a-step.txt": CgroupJob(3385, None, "0", None, None, 2),
    "v2-slurmstepd-infinity.txt": None,
    "v2-slurm26.05-sluid-step0.txt": CgroupJob(None, "SEKNKTV3WPV500", "0", None, None, 2),
    "v2-slurm26.05-sluid-multislurmd-extern.txt": CgroupJob(None, "SEKNKTV3WPV500", "extern", None, "gpu_node_7", 2),
    "v2-user-session.txt": None,
    "v2-container-namespace.txt": None,
}


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.txt")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cgroup_fixture(name: str) -> None:
    assert parse_cgroup((FIXTURES / name).read_text()) == EXPECTED[name]


@pytest.mark.parametrize("path", [
    "7:freezer:/slurm/uid_1/job_2x/step_0",  # not a number
    "7:freezer:/slurmx/uid_1/job_2/step_0",
    "0::/system.slice/slurmstepd.scope/job_/step_0",
    "0::/system.slice/slurmstepd.scope/sSHORT/step_0",  # not a SLUID (length)
    "0::/system.slice/slurmstepd.scope/sEKNKTV3WPV50I/step_0",  # I is not Crockford base32
    "garbage without colons",
])
def test_lookalikes_are_not_jobs(path: str) -> None:
    assert parse_cgroup(path) is None


def env_bytes(**kv: str) -> bytes:
    return b"\0".join(f"{k}={v}".encode() for k, v in kv.items()) + b"\0"


def test_environ() -> None:
    job = parse_environ(env_bytes(PATH="/bin", SLURM_JOB_ID="43", SLURM_JOB_USER="alice", SLURM_JOB_ACCOUNT="nlp",
                                  SLURM_JOB_UID="1001", SLURM_STEP_ID="0"))
    assert job is not None
    assert (job.job_id, job.user, job.account, job.uid, job.step, job.sluid) == (43, "alice", "nlp", 1001, "0", None)
    assert parse_environ(env_bytes(PATH="/bin", HOME="/root")) is None
    assert parse_environ(env_bytes(SLURM_JOB_ID="not-a-number")) is None
    assert parse_environ(b"") is None
    legacy = parse_environ(env_bytes(SLURM_JOBID="9"))
    assert legacy is not None and legacy.job_id == 9
    assert parse_environ(b"SLURM_JOB_ID=5\0SLURM_JOB_USER=\xff\xfe\0") is not None  # undecodable bytes: no crash


def test_map_file_lines() -> None:
    assert parse_gpu_map(2, "43 0 root root -\n") == GpuAllocation(2, 43, 0, "root", "root", None)
    assert parse_gpu_map(0, "7 1001 alice nlp sekNKTV3WPV500") == GpuAllocation(0, 7, 1001, "alice", "nlp",
                                                                                 "SEKNKTV3WPV500")
    assert parse_gpu_map(1, "8 - - -").user is None
    for bad in ("", "x 0 root root", "1 2 3", "1 2 3 4 5 6"):
        with pytest.raises(MapFileError):
            parse_gpu_map(0, bad)


# ---- /proc and map-directory fixture trees ----------------------------------------------------------------


def make_proc(root: Path, pid: int, *, cgroup: str | None = None, environ: bytes | None = None,
              starttime: int = 1000, unreadable: tuple[str, ...] = ()) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{pid} (python3 (x)) S 1 {' '.join(['0'] * 17)} {starttime} 0 0\n")
    if cgroup is not None:
        (d / "cgroup").write_text(cgroup)
    if environ is not None:
        (d / "environ").write_bytes(environ)
    for name in unreadable:
        (d / name).mkdir()  # reading a directory fails like EACCES would: an OSError


V1_LINE = (FIXTURES / "v1-slurm22.05-debian-multislurmd-batch.txt").read_text()
HOST_LINE = (FIXTURES / "v1-host-not-in-a-job.txt").read_text()
SLUID_LINE = (FIXTURES / "v2-slurm26.05-sluid-step0.txt").read_text()


def test_resolver_order_cgroup_then_environ(tmp_path: Path) -> None:
    make_proc(tmp_path, 10, cgroup=V1_LINE, environ=env_bytes(SLURM_JOB_ID="999"))
    make_proc(tmp_path, 11, cgroup=HOST_LINE, environ=env_bytes(SLURM_JOB_ID="44", SLURM_JOB_USER="bob"))
    make_proc(tmp_path, 12, cgroup=HOST_LINE, environ=env_bytes(PATH="/bin"))
    make_proc(tmp_path, 13, cgroup=SLUID_LINE, environ=env_bytes(SLURM_JOB_ID="45"))
    make_proc(tmp_path, 14, cgroup=SLUID_LINE, unreadable=("environ",))
    resolver = ProcJobResolver(tmp_path, user_name={0: "root"}.get)
    got = resolver.resolve([10, 11, 12, 13, 14, 15])
    assert got[10] == JobRef(43, "cgroup", step="batch", uid=0, user="root")
    assert got[11] == JobRef(44, "environ", user="bob")
    assert 12 not in got and 15 not in got  # not a job; does not exist
    assert got[13] == JobRef(45, "environ", sluid="SEKNKTV3WPV500", step="0")
    assert got[14] == JobRef(None, "cgroup", sluid="SEKNKTV3WPV500", step="0")  # left for the map files


def test_resolver_survives_vanishing_and_unreadable_files(tmp_path: Path) -> None:
    make_proc(tmp_path, 20, unreadable=("cgroup", "environ"))
    make_proc(tmp_path, 21)  # stat only: cgroup and environ vanished mid-scan
    assert ProcJobResolver(tmp_path).resolve([20, 21]) == {}


def test_resolver_caches_per_pid_and_start_time_and_notices_reuse(tmp_path: Path) -> None:
    make_proc(tmp_path, 30, cgroup=V1_LINE)
    resolver = ProcJobResolver(tmp_path, user_name=lambda uid: None)
    assert resolver.resolve([30])[30].job_id == 43
    (tmp_path / "30" / "cgroup").write_text(HOST_LINE)  # same process: its job cannot change, the cache answers
    assert resolver.resolve([30])[30].job_id == 43
    make_proc(tmp_path, 30, cgroup=HOST_LINE, environ=env_bytes(SLURM_JOB_ID="50"), starttime=2000)  # pid reused
    assert resolver.resolve([30])[30] == JobRef(50, "environ")


def test_resolver_on_the_real_proc() -> None:
    env = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_JOB_ACCOUNT": "nlp"}
    child = subprocess.Popen(["sleep", "60"], env=env)
    try:
        # Until the exec is complete: before it /proc shows the parent's environ, and the kernel renames the
        # task (comm) before it sets up the new environ, so waiting for comm alone raced (1 run in ~10 failed).
        for _ in range(1000):
            if Path(f"/proc/{child.pid}/comm").read_text().strip() == "sleep" and \
                    b"SLURM_JOB_ID=77\0" in Path(f"/proc/{child.pid}/environ").read_bytes():
                break
            time.sleep(0.01)
        ref = ProcJobResolver("/proc").resolve([child.pid])[child.pid]
    finally:
        child.kill()
        child.wait()
    own = parse_cgroup(Path("/proc/self/cgroup").read_text())
    if own is None:  # the usual case; inside a Slurm job (CI on a cluster) the cgroup wins, as it should
        assert (ref.job_id, ref.account, ref.source) == (77, "nlp", "environ")
    else:
        assert (ref.job_id, ref.source) == (own.job_id, "cgroup")
    assert ProcJobResolver("/proc").resolve([child.pid]) == {}  # gone


def test_map_reader(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    d.mkdir()
    (d / "0").write_text("43 0 root root -\n")
    (d / "2").write_text("44 1001 alice nlp -\n")
    (d / ".3.45").write_text("45 0 root root -\n")  # the prolog's temporary file
    (d / "1").write_text("garbage\n")
    allocations, errors = GpuMapReader(tmp_path, "n1").read()
    assert {i: a.job_id for i, a in allocations.items()} == {0: 43, 2: 44}
    assert [(e.code, e.device) for e in errors] == [("gpu_map_invalid", "1")]
    assert GpuMapReader(tmp_path, "n9").read() == ({}, [])
