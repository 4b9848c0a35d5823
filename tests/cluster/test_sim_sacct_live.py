"""The sacct loader against live accounting from the test cluster, in both export forms."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm_elastic.sim.loaders import load_workload
from slurm_elastic.sim.workload import JobSpec
from tests.cluster.harness import TestCluster

FIELDS = "JobID,Submit,Start,End,Elapsed,AllocTRES,ReqTRES,NNodes,State,Partition,Account,User,Timelimit"
WINDOW = ["-a", "-S", "2020-01-01", "-E", "now"]


def _exports(cluster: TestCluster, tmp_path: Path) -> tuple[dict[str, JobSpec], dict[str, JobSpec]]:
    parsable = cluster.run(["sacct", *WINDOW, "-P", "-o", FIELDS], check=True).stdout
    as_json = cluster.run(["sacct", *WINDOW, "--json"], check=True, timeout=120).stdout
    (tmp_path / "acct.txt").write_text(parsable)
    (tmp_path / "acct.json").write_text(as_json)
    return (
        {j.job_id: j for j in load_workload(str(tmp_path / "acct.txt"), "sacct").jobs},
        {j.job_id: j for j in load_workload(str(tmp_path / "acct.json"), "sacct").jobs},
    )


@pytest.mark.cluster
def test_live_sacct_exports_load_and_agree(clean_cluster: TestCluster, tmp_path: Path) -> None:
    job_id = str(clean_cluster.submit("#!/bin/sh\nsleep 3\n", "-N2", "--gres=gpu:2", "--time=10"))
    # The cluster is shared: another test may cancel our job. Judge it only if it completed.
    state = clean_cluster.wait_state(int(job_id), {"COMPLETED", "CANCELLED", "FAILED"}, timeout=120)
    deadline = time.monotonic() + 60  # slurmctld reports the end to slurmdbd asynchronously
    while True:
        from_parsable, from_json = _exports(clean_cluster, tmp_path)
        if state != "COMPLETED" or (job_id in from_parsable and job_id in from_json) or time.monotonic() > deadline:
            break
        time.sleep(1)
    if state == "COMPLETED":
        for form, jobs in (("-P", from_parsable), ("--json", from_json)):
            assert job_id in jobs, f"job {job_id} missing from sacct {form}"
            job = jobs[job_id]
            assert (job.num_gpus, job.num_nodes, job.time_limit) == (4, 2, 600.0)
            assert job.duration is not None and 2.0 <= job.duration <= 30.0
    # Both forms describe the same jobs the same way (--json also lists earlier runs of requeued jobs, which
    # can only lengthen a job's replayed duration).
    assert from_parsable, "no GPU job in the live accounting"
    assert set(from_parsable) <= set(from_json)  # -P was exported first: whatever it saw finished, JSON saw
    for key, job in from_parsable.items():
        other = from_json[key]
        if other.num_nodes is None:
            # Cancelled at the instant it started (Start == End, empty AllocTRES): -P still prints NNodes=1 while
            # --json has no allocation at all. Such a job never held anything; its size cannot be compared.
            continue
        assert (other.num_nodes, other.time_limit) == (job.num_nodes, job.time_limit), key
        assert (other.duration or 0.0) >= (job.duration or 0.0), key
