"""MPS on the live cluster: the real prolog and epilog, run by slurmd for a ``--gres=mps:50`` job, drive the fake
``nvidia-cuda-mps-control`` (tests/fakes/, named by the cluster's slurm-elastic.env) through the exact command
sequence of a job's life; a whole-GPU job stops MPS left on its GPUs."""

from __future__ import annotations

import pwd
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.agents_harness import install_plugins, wait_for
from tests.cluster.harness import TestCluster

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fakes" / "nvidia-cuda-mps-control"
NODE = "n3"


def state(cluster: TestCluster, job: int) -> str:
    out = cluster.run(["squeue", "-h", "-j", str(job), "-o", "%T"]).stdout.split()
    if out:
        return out[0]
    acct = cluster.run(["sacct", "-n", "-X", "-P", "-j", str(job), "-o", "State"]).stdout.split()
    return acct[0] if acct else "UNKNOWN"


@pytest.fixture
def mps(cluster: TestCluster) -> Iterator[Path]:
    env_file = cluster.root / "etc" / "slurm-elastic.env"
    if f"SLURM_ELASTIC_MPS_CONTROL={FAKE}" not in env_file.read_text():
        cluster.start()  # idempotent: rewrites the env file from this checkout's cluster.sh
    install_plugins(cluster)
    cluster.cancel_all()
    cluster.wait_nodes_idle()
    base = cluster.root / "mps" / NODE
    shutil.rmtree(base, ignore_errors=True)
    try:
        yield base
    finally:
        cluster.cancel_all()
        shutil.rmtree(base, ignore_errors=True)
        cluster.wait_nodes_idle()


def commands(base: Path, gpu: int) -> list[str]:
    log = base / f"gpu{gpu}" / "log" / "fake-mps-control.log"
    return log.read_text().splitlines() if log.exists() else []


def test_an_mps_job_starts_and_stops_its_gpus_mps_daemon(cluster: TestCluster, mps: Path) -> None:
    uid = pwd.getpwnam("alice").pw_uid
    job = cluster.submit("#!/bin/bash\necho PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE GPUS=$SLURM_JOB_GPUS\nsleep 4\n",
                         "--gres=mps:50", f"--nodelist={NODE}", "-N1", "-n1", user="alice")
    wait_for(f"job {job} running", lambda: True if state(cluster, job) == "RUNNING" else None, 120)
    (gpu_dir,) = wait_for("the MPS job file", lambda: [d for d in mps.glob("gpu*") if (d / "jobs" / str(job)).exists()]
                          or None)
    gpu = int(gpu_dir.name.removeprefix("gpu"))
    assert (gpu_dir / "jobs" / str(job)).read_text() == f"{uid} 50\n"
    started = ["get_server_list", f"-d CUDA_VISIBLE_DEVICES={gpu}", "set_default_active_thread_percentage 50",
               f"start_server -uid {uid}"]
    # The prolog writes the job file, then starts the daemon, then sends the last commands: wait for them (CI
    # once read the log after the first two, and once looked for the daemon right after the job file appeared).
    wait_for("the prolog's MPS commands", lambda: True if len(commands(mps, gpu)) >= len(started) else None, 30)
    assert commands(mps, gpu) == started
    assert (gpu_dir / "pipe" / "fake-daemon").exists()
    final = wait_for(f"job {job} to end", lambda: s if (s := state(cluster, job)) not in
                     ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING") else None, 120)
    assert final == "COMPLETED"
    wait_for("the epilog", lambda: True if not (gpu_dir / "jobs" / str(job)).exists() else None, 120)
    assert commands(mps, gpu) == [*started, "get_server_list", "quit", "get_server_list"]
    assert not (gpu_dir / "pipe" / "fake-daemon").exists()
    out = (cluster.jobs_dir / f"{job}.out").read_text()
    assert f"PCT=50 GPUS={gpu}" in out


def test_a_whole_gpu_job_stops_mps_left_running_on_its_gpus(cluster: TestCluster, mps: Path) -> None:
    for gpu in range(cluster.gpus_per_node):  # a daemon some earlier job left behind, on every GPU of the node
        d = mps / f"gpu{gpu}"
        subprocess.run([str(FAKE), "-d"], env={"CUDA_MPS_PIPE_DIRECTORY": str(d / "pipe"),
                                               "CUDA_MPS_LOG_DIRECTORY": str(d / "log")}, check=True, timeout=30)
    job = cluster.submit("#!/bin/bash\ntrue\n", f"--gres=gpu:{cluster.gpus_per_node}", f"--nodelist={NODE}",
                         "-N1", "-n1")
    assert wait_for(f"job {job} to end", lambda: s if (s := state(cluster, job)) in
                    ("COMPLETED", "FAILED", "CANCELLED") else None, 120) == "COMPLETED"
    for gpu in range(cluster.gpus_per_node):
        assert commands(mps, gpu) == ["-d CUDA_VISIBLE_DEVICES=", "get_server_list", "quit", "get_server_list"]
        assert not (mps / f"gpu{gpu}" / "pipe" / "fake-daemon").exists()
    node = cluster.run(["sinfo", "-h", "-N", "-n", NODE, "-o", "%T"]).stdout.split()[0]
    assert "drain" not in node
