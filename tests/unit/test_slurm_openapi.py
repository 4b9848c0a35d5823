"""squeue/sinfo JSON parsers on recorded replies (22.05, 24.11, 26.05; v0.0.40 constructed) and bad input."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurm_elastic.slurm.decode import parse_nodes, parse_squeue
from slurm_elastic.slurm.errors import SlurmParseError
from slurm_elastic.slurm.model import GresCount, Job
from slurm_elastic.slurm.openapi import num, parse_meta

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def load(rel: str) -> object:
    return json.loads((FIX / rel).read_text())


def test_2205_squeue_captured() -> None:
    meta, jobs = parse_squeue(load("22.05/squeue.json"))
    assert meta.data_parser == "v0.0.38" and meta.slurm_release == "22.05.8" and meta.known
    by_id = {j.job_id: j for j in jobs}
    bob = by_id[2]
    assert (bob.user, bob.account, bob.state, bob.nodes, bob.batch_host) == (
        "bob",
        "vision",
        "RUNNING",
        ("n2",),
        "n2",
    )
    assert bob.name == "odd name;$x" and bob.comment == 'hello "world"' and bob.time_limit_min == 30
    assert bob.gres_per_node == (GresCount("gpu", None, 1),) and bob.gpus_per_node() == 1
    assert bob.start_time == datetime.fromtimestamp(1795988961, tz=UTC)
    # het components: leader 3 (+0) and raw id 4 (+1)
    assert (by_id[3].het_job_id, by_id[3].het_job_offset, by_id[3].display_id) == (3, 0, "3+0")
    assert (by_id[4].het_job_id, by_id[4].het_job_offset, by_id[4].display_id) == (3, 1, "3+1")
    # a non-het job reports het_job_offset 0 in v0.0.38: it must not look like a het component
    assert not bob.is_het_component and bob.het_job_offset is None
    # array task 5_0 has raw id 7
    assert (by_id[7].array_job_id, by_id[7].array_task_id, by_id[7].display_id) == (5, 0, "5_0")
    pending = by_id[6]
    assert (
        pending.is_pending and pending.nodes == () and pending.start_time is None and pending.node_count == 4
    )
    assert by_id[1].time_limit_min is None  # not set -> partition limit (UNLIMITED)


def test_2205_sinfo_captured() -> None:
    meta, nodes = parse_nodes(load("22.05/sinfo.json"))
    assert meta.data_parser == "v0.0.38"
    assert [n.name for n in nodes] == ["n1", "n2", "n3", "n4"]
    n1 = nodes[0]
    assert n1.state == "MIXED" and n1.partitions == ("train", "serve") and n1.port == 17001
    assert n1.gpus() == 4 and n1.gpus_used() == 4
    assert GresCount("mps", None, 400) in n1.gres
    assert nodes[1].gpus_used() == 1


@pytest.mark.parametrize(
    "release,version,first",
    [("24.11", ("v0.0.42", "24.11.5"), 25), ("26.05", ("v0.0.45", "26.05.5"), 1)],
)
def test_recorded_squeue_and_grouped_sinfo(release: str, version: tuple[str, str], first: int) -> None:
    """Replies recorded on the release clusters (scripts/record-slurm-replies); every field against scontrol's
    text is in test_slurm_recorded.py, this is the shape: het and array ids, pending jobs, grouped sinfo."""
    meta, jobs = parse_squeue(load(f"{release}/recorded/squeue.json"))
    assert (meta.data_parser, meta.slurm_release) == version and meta.known
    by_name: dict[str, list[Job]] = {}
    for j in jobs:
        by_name.setdefault(j.name, []).append(j)
    (gpu,) = by_name["multi-gpu"]
    assert gpu.job_id == first and gpu.state == "RUNNING" and gpu.gpus_per_node() == 2 and gpu.time_limit_min == 40
    het = sorted(by_name["het"], key=lambda j: j.het_job_offset or 0)
    assert [(j.display_id, len(j.nodes)) for j in het] == [(f"{first + 1}+0", 1), (f"{first + 1}+1", 2)]
    assert sorted(j.display_id for j in by_name["array"]) == [f"{first + 3}_0", f"{first + 3}_1"]
    (pending,) = by_name["pending"]
    assert pending.is_pending and pending.nodes == () and pending.node_count == 4 and pending.gpus_per_node() == 4
    assert by_name["unlimited"][0].time_limit_min is None

    # sinfo --json groups nodes of equal state; the parser gives one node each, partitions merged.
    _, nodes = parse_nodes(load(f"{release}/recorded/sinfo.json"))
    by = {n.name: n for n in nodes}
    assert sorted(by) == ["n1", "n2", "n3", "n4"]
    assert all(n.partitions == ("train", "serve") and n.gpus() == 4 for n in nodes)
    assert by["n4"].is_drained and by["n4"].reason == "recorded drain reason"
    assert [by[n].port for n in ("n1", "n2", "n3", "n4")] == [by["n1"].port + i for i in range(4)]


def test_state_flags_from_a_job_state_list() -> None:
    """24.11+ give job_state as a list: the first entry is the state, the rest are flags."""
    doc = load("24.11/recorded/squeue.json")
    assert isinstance(doc, dict)
    doc["jobs"] = [dict(doc["jobs"][0], job_state=["RUNNING", "COMPLETING"])]
    (job,) = parse_squeue(doc)[1]
    assert job.state == "RUNNING" and job.state_flags == ("COMPLETING",)


def test_v0040_constructed() -> None:
    """23.11's data_parser: no release cluster runs it here, so this one reply is still hand-written."""
    meta, jobs = parse_squeue(load("constructed/squeue-v0.0.40.json"))
    assert meta.data_parser == "v0.0.40" and meta.known
    assert len(jobs) == 1


def test_num_unwraps_and_rejects() -> None:
    assert num(5) == 5 and num({"set": True, "infinite": False, "number": 7}) == 7
    assert (
        num({"set": False, "number": 7}) is None and num({"set": True, "infinite": True, "number": 0}) is None
    )
    assert num(None) is None and num(4294967294) is None
    with pytest.raises(SlurmParseError):
        num("seven")


@pytest.mark.parametrize(
    "doc,match",
    [
        ([], "expected a JSON object"),
        ({"jobs": {}}, "'jobs' is missing or not a list"),
        ({}, "'jobs' is missing"),
        ({"jobs": [{"name": "x"}]}, "without job_id"),
        ({"jobs": [{"job_id": "abc"}]}, "expected a number"),
        ({"jobs": [{"job_id": 1, "job_state": 5}]}, "bad state"),
        ({"jobs": [{"job_id": 1, "job_state": "RUNNING", "nodes": "n[1-"}]}, "unbalanced"),
        ({"jobs": [{"job_id": 1, "tres_per_node": "gres:gpu:x"}]}, "bad GRES count"),
        (
            {"errors": [{"description": "Unable to contact slurm controller"}], "jobs": []},
            "Unable to contact",
        ),
        ({"meta": [], "jobs": []}, "'meta' is not an object"),
    ],
)
def test_malformed_squeue_gives_clear_error(doc: object, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_squeue(doc)


@pytest.mark.parametrize(
    "doc,match",
    [
        ({"nodes": [{"state": "idle"}]}, "without a name"),
        ({"neither": 1}, "neither 'nodes' nor 'sinfo'"),
        ({"nodes": ["n1"]}, "expected a JSON object"),
        ({"sinfo": [3]}, "expected a JSON object"),
    ],
)
def test_malformed_sinfo_gives_clear_error(doc: object, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_nodes(doc)


def test_partial_job_tolerated() -> None:
    _, (job,) = parse_squeue({"jobs": [{"job_id": 9}]})
    assert job.job_id == 9 and job.state == "UNKNOWN" and job.nodes == () and job.account is None


def test_meta_without_version() -> None:
    meta = parse_meta({"jobs": []})
    assert meta.data_parser is None and not meta.known
