"""The Slurm adapter against the real test cluster (no mocks)."""

from __future__ import annotations

import time

import pytest

from slurm_elastic.slurm.adapter import ResizeRefusedError, SlurmCli
from slurm_elastic.slurm.errors import SlurmJobNotFoundError
from slurm_elastic.slurm.runner import SlurmCommands
from tests.cluster.harness import RELEASE, TestCluster

SLEEPER = "#!/bin/bash\nid -un > /dev/null\nsleep 600\n"


@pytest.fixture
def slurm(clean_cluster: TestCluster) -> SlurmCli:
    return SlurmCli(SlurmCommands(env=clean_cluster.env))


def test_snapshot_reads_nodes_partitions_and_gpus(slurm: SlurmCli, clean_cluster: TestCluster) -> None:
    snap = slurm.snapshot()
    assert snap.slurm_version and snap.slurm_version.startswith(RELEASE)
    assert snap.data_parser == {"22.05": "v0.0.38", "24.11": "v0.0.42", "26.05": "v0.0.45"}[RELEASE]
    # the 22.05 cluster's power-saved nodes (hidden partition cold, docs/power-saving.md) are listed too
    power = {n.name for n in snap.nodes if "cold" in n.partitions}
    assert power in (set(), {"n5", "n6"})
    assert sorted(n.name for n in snap.nodes if n.name not in power) == clean_cluster.nodes
    assert all(n.gpus() == 4 for n in snap.nodes)
    # One Node per node with its own values (23.02+ sinfo --json groups them), as scontrol has them.
    for n in snap.nodes:
        if n.name in power:
            continue  # a node that never booted has no slurmd start time
        text = clean_cluster.run(["scontrol", "-o", "show", "node", n.name], check=True).stdout
        assert f"Port={n.port} " in text and f"NodeAddr={n.address} " in text and f"CPUTot={n.cpus} " in text
        assert n.slurmd_start_time is not None
    assert {p.name for p in snap.partitions} - {"cold"} == {"train", "serve"}
    assert next(p for p in snap.partitions if p.name == "train").is_default


def test_shrink_two_node_gpu_job_to_one_then_update_again(slurm: SlurmCli, clean_cluster: TestCluster) -> None:
    job_id = clean_cluster.submit(SLEEPER, "-N2", "--gres=gpu:2", "--time=30")
    clean_cluster.wait_state(job_id, {"RUNNING"})
    job = slurm.job(job_id)
    assert job is not None and len(job.nodes) == 2 and job.gpus_per_node() == 2
    assert job.batch_host in job.nodes

    slurm.shrink(job, [job.batch_host or ""])

    after = slurm.job(job_id)
    assert after is not None
    assert after.nodes == (job.batch_host,) and after.node_count == 1 and after.is_running
    freed = next(n for n in job.nodes if n != job.batch_host)
    assert next(n for n in slurm.nodes() if n.name == freed).gpus_used() == 0
    # The second update after a resize is the one that fails without slurmdbd ("DB index is being set").
    slurm.update_job(job_id, time_limit_min=20, comment="resized once")
    again = slurm.job(job_id)
    assert again is not None and again.time_limit_min == 20 and again.comment == "resized once"


def test_shrink_refuses_to_drop_the_batch_host(slurm: SlurmCli, clean_cluster: TestCluster) -> None:
    job_id = clean_cluster.submit(SLEEPER, "-N2", "--gres=gpu:1")
    clean_cluster.wait_state(job_id, {"RUNNING"})
    job = slurm.job(job_id)
    assert job is not None
    other = next(n for n in job.nodes if n != job.batch_host)
    with pytest.raises(ResizeRefusedError, match="batch host"):
        slurm.shrink(job, [other])
    still = slurm.job(job_id)
    assert still is not None and len(still.nodes) == 2


def test_submit_as_alice_runs_as_alice_in_her_account(slurm: SlurmCli, clean_cluster: TestCluster) -> None:
    out = clean_cluster.jobs_dir / "alice-%j.out"
    script = "#!/bin/bash\necho user=$(id -un) account=$SLURM_JOB_ACCOUNT gpus=$SLURM_JOB_GPUS\n"
    job_id = slurm.submit_as("alice", script, ["--chdir=/tmp", f"--output={out}", "--gres=gpu:1", "-N1"])
    clean_cluster.wait_state(job_id, {"COMPLETED"}, timeout=60)
    text = (clean_cluster.jobs_dir / f"alice-{job_id}.out").read_text()
    assert "user=alice" in text
    assert "account=nlp" in text
    assert "gpus=0" in text or "gpus=" in text and text.strip().split("gpus=")[1] != ""


def test_het_component_shrinks_through_its_raw_id(slurm: SlurmCli, clean_cluster: TestCluster) -> None:
    cp = clean_cluster.run(
        ["sbatch", "--parsable", "--chdir=/tmp", "-o", "/dev/null", "-N1", ":", "-N2", "--gres=gpu:1"],
        input_text=SLEEPER,
    )
    assert cp.returncode == 0, cp.stderr
    leader = int(cp.stdout.strip())
    clean_cluster.wait_state(leader, {"RUNNING"})
    comps = [j for j in slurm.jobs() if j.het_job_id == leader]
    assert sorted(c.het_job_offset or 0 for c in comps) == [0, 1]
    comp = next(c for c in comps if c.het_job_offset == 1)
    assert comp.display_id == f"{leader}+1" and comp.job_id != leader and len(comp.nodes) == 2
    # Slurm itself refuses the "leader+offset" form for updates: that is why the adapter uses the raw id.
    refused = clean_cluster.run(["scontrol", "update", f"JobId={leader}+1", "NumNodes=1"])
    assert refused.returncode != 0

    slurm.shrink(comp, [comp.batch_host or comp.nodes[0]])

    after = next(j for j in slurm.jobs() if j.job_id == comp.job_id)
    assert after.node_count == 1 and len(after.nodes) == 1 and after.is_running


def test_drain_and_resume_round_trip(slurm: SlurmCli, clean_cluster: TestCluster) -> None:
    slurm.drain("n3", "slurm-elastic test: drain round trip")
    try:
        n3 = next(n for n in slurm.nodes() if n.name == "n3")
        assert n3.is_drained and not n3.is_available
        assert n3.reason == "slurm-elastic test: drain round trip"
    finally:
        slurm.resume("n3")
    # Right after RESUME slurmctld flags the node NOT_RESPONDING until its next ping reply (measured: ~0.1 s).
    deadline = time.monotonic() + 30
    while True:
        n3 = next(n for n in slurm.nodes() if n.name == "n3")
        if n3.is_available or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert not n3.is_drained and n3.is_available


def test_invalid_job_id_gives_typed_error_with_slurm_message(slurm: SlurmCli) -> None:
    with pytest.raises(SlurmJobNotFoundError) as exc:
        slurm.update_job(987654, comment="nope")
    assert "Invalid job id" in exc.value.message
    with pytest.raises(SlurmJobNotFoundError):
        slurm.signal(987654, "USR1")


def test_signal_and_cancel(slurm: SlurmCli, clean_cluster: TestCluster) -> None:
    script = "#!/bin/bash\ntrap 'echo got-usr1; exit 0' USR1\necho trap-set\nwhile true; do sleep 1; done\n"
    job_id = clean_cluster.submit(script, "-N1")
    clean_cluster.wait_state(job_id, {"RUNNING"})
    # RUNNING comes before the batch step has started the script: signal once the trap is in place (a signal
    # sent earlier was lost on 24.11).
    out = clean_cluster.jobs_dir / f"{job_id}.out"
    deadline = time.monotonic() + 30
    while not (out.exists() and "trap-set" in out.read_text()):
        assert time.monotonic() < deadline, f"job {job_id}'s script never started"
        time.sleep(0.2)
    slurm.signal(job_id, "USR1", batch_only=True)
    clean_cluster.wait_state(job_id, {"COMPLETED"}, timeout=30)
    assert "got-usr1" in (clean_cluster.jobs_dir / f"{job_id}.out").read_text()

    victim = clean_cluster.submit(SLEEPER, "-N1")
    clean_cluster.wait_state(victim, {"RUNNING"})
    slurm.cancel(victim)
    assert clean_cluster.wait_state(victim, {"CANCELLED"}, timeout=30) == "CANCELLED"


def test_comment_with_shell_metacharacters_passes_unharmed(slurm: SlurmCli, clean_cluster: TestCluster) -> None:
    job_id = clean_cluster.submit(SLEEPER, "-N1")
    clean_cluster.wait_state(job_id, {"RUNNING"})
    nasty = "a;b && $(rm -rf /) `x` 'q' \"dq\" | > <"
    slurm.update_job(job_id, comment=nasty, admin_comment="elastic:v1 min=1")
    job = slurm.job(job_id)
    assert job is not None and job.comment == nasty and job.admin_comment == "elastic:v1 min=1"
    with pytest.raises(ResizeRefusedError):
        slurm.update_job(job_id, comment="two\nlines")
