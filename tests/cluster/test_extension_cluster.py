"""Grow mechanics on the real cluster: an extension job is the leader's script, run as its owner, on the chosen
nodes, with the role variables; the anti-forgery rule holds against a job that fakes the tag."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from slurm_elastic.controller.extension import build_request, rendezvous_endpoint, trusted_extensions
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.runner import SlurmCommands
from tests.cluster.harness import TestCluster

SCRIPT = """#!/bin/bash
#ELASTIC --min-nodes 1 --max-nodes 3
echo "role=${SLURM_ELASTIC_ROLE:-leader} parent=${SLURM_ELASTIC_PARENT:-} rdzv=${SLURM_ELASTIC_RDZV_ENDPOINT:-}"
echo "user=$(id -un) account=$SLURM_JOB_ACCOUNT partition=$SLURM_JOB_PARTITION gpus=$SLURM_JOB_GPUS"
echo "nodes=$SLURM_JOB_NODELIST"
sleep 300
"""


@pytest.fixture
def slurm(clean_cluster: TestCluster) -> SlurmCli:
    return SlurmCli(SlurmCommands(env=clean_cluster.env))


def _wait_output(cluster: TestCluster, job_id: int, needle: str) -> str:
    import time

    path = cluster.jobs_dir / f"{job_id}.out"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if path.exists() and needle in (text := path.read_text()):
            return text
        time.sleep(0.3)
    raise AssertionError(f"{needle!r} not in {path}")


def test_extension_job_runs_as_owner_with_role_variables(slurm: SlurmCli, clean_cluster: TestCluster) -> None:
    leader_id = clean_cluster.submit(SCRIPT, "-N1", "--gres=gpu:2", "--time=30", user="alice")
    clean_cluster.wait_state(leader_id, {"RUNNING"})
    leader = slurm.job(leader_id)
    assert leader is not None and leader.working_dir == "/tmp"
    free = [n for n in clean_cluster.nodes if n not in leader.nodes][:2]
    script = slurm.batch_script(leader_id)
    assert "#ELASTIC --min-nodes 1" in script
    req = build_request(leader, free, f"grow:{leader_id}:1:1", datetime.now(tz=UTC),
                        rendezvous=rendezvous_endpoint(leader, "127.0.0.1"),
                        base_env={"PATH": "/usr/bin:/bin", "SLURM_CONF": clean_cluster.env["SLURM_CONF"]})
    ext_id = slurm.submit_as(req.user, script, [*req.sbatch_args, f"--output={clean_cluster.jobs_dir}/%j.out"],
                             env=req.env)
    clean_cluster.wait_state(ext_id, {"RUNNING"})
    text = _wait_output(clean_cluster, ext_id, "nodes=")
    assert f"role=extension parent={leader_id} rdzv=127.0.0.1:{29500 + leader_id % 1000}" in text
    assert "user=alice account=nlp partition=train gpus=0,1" in text
    ext = slurm.job(ext_id)
    assert ext is not None and sorted(ext.nodes) == sorted(free) and ext.gpus_per_node() == 2
    assert ext.time_limit_min is not None and ext.time_limit_min <= 30
    # The controller recognises it -- and not a job of bob's that copies the tag.
    forged = clean_cluster.submit("#!/bin/bash\nsleep 300\n", "-N1", f"--comment={req.tag.render()}", user="bob")
    snap = slurm.snapshot()
    known = {(leader_id, req.tag.key)}
    exts = trusted_extensions(snap.jobs, {leader_id: leader}, lambda p, k: (p, k) in known)
    assert [j.job_id for j in exts[leader_id]] == [ext_id]
    assert forged not in [j.job_id for j in exts[leader_id]]
