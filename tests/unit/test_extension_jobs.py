"""Extension-job requests, tags, and the anti-forgery rule (pure)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from slurm_elastic.controller.extension import (
    ExtensionTag,
    build_request,
    orphaned_extensions,
    parse_tag,
    rendezvous_endpoint,
    trusted_extensions,
)
from slurm_elastic.slurm.model import GresCount, Job

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def job(job_id: int, user: str = "alice", comment: str = "", state: str = "RUNNING", **kw: object) -> Job:
    base = Job(job_id=job_id, name="train", user=user, account="nlp", partition="train", qos="normal",
               priority=100, state=state, state_reason=None, nodes=("n1", "n2"), batch_host="n1", node_count=2,
               tres_per_node="gres:gpu:4", gres_per_node=(GresCount("gpu", None, 4),), time_limit_min=60,
               submit_time=NOW - timedelta(minutes=20), start_time=NOW - timedelta(minutes=15), end_time=None,
               comment=comment, admin_comment="", working_dir="/home/alice/run",
               standard_output="/home/alice/run/%j.out")
    return replace(base, **kw)  # type: ignore[arg-type]


def test_request_mirrors_the_leader() -> None:
    leader = job(42)
    req = build_request(leader, ["n3", "n4"], "grow:42:7:1", NOW, rendezvous="10.0.0.1:29542",
                        base_env={"PATH": "/usr/bin"})
    args = dict(a.split("=", 1) for a in req.sbatch_args if "=" in a)
    assert req.user == "alice"
    assert args["--partition"] == "train" and args["--account"] == "nlp" and args["--qos"] == "normal"
    assert args["--gres"] == "gpu:4" and args["--nodes"] == "2" and args["--nodelist"] == "n[3-4]"
    assert args["--time"] == "45"  # 60 min limit, 15 min used: never outlive the leader
    assert args["--job-name"] == "elastic-ext-42" and args["--chdir"] == "/home/alice/run"
    assert parse_tag(args["--comment"]) == ExtensionTag(42, "grow:42:7:1")
    assert "--no-kill" in req.sbatch_args
    assert args["--output"] == "/home/alice/run/42.out" and args["--open-mode"] == "append"
    assert req.env["SLURM_ELASTIC_ROLE"] == "extension" and req.env["SLURM_ELASTIC_PARENT"] == "42"
    assert req.env["SLURM_ELASTIC_RDZV_ENDPOINT"] == "10.0.0.1:29542" and req.env["PATH"] == "/usr/bin"


def test_a_gpu_granular_grow_asks_the_plans_gpus_on_a_shared_node() -> None:
    """gpu_granular_growth: the plan's gpu:2, not the leader's gpu:4 per node (one worker per GPU it gets)."""
    req = build_request(job(42), ["n3"], "grow:42:7:1", NOW, rendezvous="10.0.0.1:29542",
                        gres=(GresCount("gpu", None, 2),))
    args = dict(a.split("=", 1) for a in req.sbatch_args if "=" in a)
    assert args["--gres"] == "gpu:2" and args["--nodes"] == "1" and args["--nodelist"] == "n3"
    assert "--exclusive" not in req.sbatch_args


def test_request_without_time_limit_and_no_nodes() -> None:
    req = build_request(job(1, time_limit_min=None), ["n3"], "k", NOW, rendezvous="h:1")
    assert not any(a.startswith("--time") for a in req.sbatch_args)
    with pytest.raises(ValueError):
        build_request(job(1), [], "k", NOW, rendezvous="h:1")


def test_rendezvous_endpoint() -> None:
    assert rendezvous_endpoint(job(1234), "127.0.0.1") == "127.0.0.1:29734"
    assert rendezvous_endpoint(job(7), None) == "n1:29507"


def test_forged_tags_are_not_trusted() -> None:
    bob_leader = job(10, user="bob")
    alice_leader = job(20, user="alice")
    leaders = {10: bob_leader, 20: alice_leader}
    journal = {(10, "grow:10:1:1"), (20, "grow:20:3:1")}
    known = lambda parent, key: (parent, key) in journal  # noqa: E731
    real = job(11, user="bob", comment=ExtensionTag(10, "grow:10:1:1").render())
    forged_cross_user = job(12, user="alice", comment=ExtensionTag(10, "grow:10:1:1").render())
    forged_unknown_key = job(13, user="alice", comment=ExtensionTag(20, "grow:20:999:1").render())
    plain = job(14, user="alice", comment="just a comment")
    out = trusted_extensions([real, forged_cross_user, forged_unknown_key, plain], leaders, known)
    assert {k: [j.job_id for j in v] for k, v in out.items()} == {10: [11]}


def test_orphans_are_our_extensions_whose_leader_is_gone() -> None:
    known = lambda parent, key: key.startswith("grow:")  # noqa: E731
    ours = job(31, comment=ExtensionTag(30, "grow:30:1:1").render())
    finished = job(32, comment=ExtensionTag(30, "grow:30:2:1").render(), state="COMPLETED")
    not_ours = job(33, comment=ExtensionTag(30, "forged").render())
    assert [j.job_id for j in orphaned_extensions([ours, finished, not_ours], set(), known)] == [31]
    assert orphaned_extensions([ours], {30}, known) == []
