"""The adapter's view of replies RECORDED on live clusters (scripts/record-slurm-replies, one folder per release)
against scontrol's own text of the same moment: every job and node field the controller reads."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurm_elastic.controller.extension import leader_file
from slurm_elastic.slurm.accounting import parse_sacct_states
from slurm_elastic.slurm.decode import parse_nodes, parse_squeue
from slurm_elastic.slurm.errors import SlurmInvalidNodeError, SlurmJobNotFoundError
from slurm_elastic.slurm.model import Job, Node
from slurm_elastic.slurm.runner import CommandResult, classify

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
RELEASES = sorted(p.parent.parent.name for p in FIX.glob("*/recorded/squeue.json"))


def rec(release: str, name: str) -> Path:
    return FIX / release / "recorded" / name


def text_records(path: Path, key: str) -> dict[str, dict[str, str]]:
    """``scontrol -o show nodes|jobs`` -> {id: {Key: value}}; ``Reason=`` (last, with spaces) kept whole."""
    out: dict[str, dict[str, str]] = {}
    for line in path.read_text().splitlines():
        if not line.startswith(f"{key}="):
            continue
        head, _, reason = line.partition(" Reason=") if key == "NodeName" else (line, "", "")
        kv = dict(m.groups() for m in re.finditer(r"([\w/:]+)=(\S*)", head))
        if reason:
            kv["Reason"] = reason.strip()
        out[kv[key]] = kv
    return out


def adapter_nodes(release: str) -> tuple[Node, ...]:
    """What SlurmCli.nodes() reads on this release: scontrol's JSON where it has one (23.02+), else sinfo's."""
    path = rec(release, "scontrol-nodes.json")
    return parse_nodes(json.loads((path if path.exists() else rec(release, "sinfo.json")).read_text()))[1]


def adapter_jobs(release: str) -> dict[int, Job]:
    return {j.job_id: j for j in parse_squeue(json.loads(rec(release, "squeue.json").read_text()))[1]}


def text_time(value: str) -> datetime | None:
    if value in {"Unknown", "None", "N/A", "(null)"}:
        return None
    return datetime.fromisoformat(value).replace(tzinfo=UTC)  # recorded with TZ=UTC


def text_minutes(value: str) -> int | None:
    """``UNLIMITED``, ``MM:SS``, ``HH:MM:SS`` or ``D-HH:MM:SS`` -> minutes."""
    if value in {"UNLIMITED", "NONE", "Partition_Limit"}:
        return None
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    hours, minutes = (parts[0], parts[1]) if len(parts) == 3 else (0, parts[0])
    return int(days or 0) * 1440 + hours * 60 + minutes


def alloc_gpus(kv: dict[str, str]) -> int:
    m = re.search(r"gres/gpu=(\d+)", kv.get("AllocTRES", ""))
    return int(m.group(1)) if m else 0


@pytest.mark.parametrize("release", RELEASES)
def test_every_node_field_agrees_with_scontrol(release: str) -> None:
    text = text_records(rec(release, "scontrol-nodes.txt"), "NodeName")
    nodes = {n.name: n for n in adapter_nodes(release)}
    assert sorted(nodes) == sorted(text) and len(nodes) >= 4
    for name, kv in text.items():
        n = nodes[name]
        base, *flags = kv["State"].split("+")
        assert (n.state, "DRAIN" in n.state_flags) == (base, "DRAIN" in flags), name
        assert (n.cpus, n.alloc_cpus) == (int(kv["CPUTot"]), int(kv["CPUAlloc"])), name
        assert ",".join(str(g) for g in n.gres) == kv["Gres"], name
        assert n.gpus_used() == alloc_gpus(kv), name
        assert (n.address, n.port) == (kv["NodeAddr"], int(kv["Port"])), name
        assert n.reason == (re.sub(r" \[[^]]*\]$", "", kv["Reason"]) if "Reason" in kv else None), name
        assert n.slurmd_start_time == text_time(kv["SlurmdStartTime"]), name
        assert n.partitions == tuple(kv["Partitions"].split(",")), name
    drained = nodes["n4"]
    assert drained.is_drained and not drained.is_available and drained.reason == "recorded drain reason"


@pytest.mark.parametrize("release", RELEASES)
def test_every_job_field_agrees_with_scontrol(release: str) -> None:
    text = text_records(rec(release, "scontrol-jobs.txt"), "JobId")
    jobs = adapter_jobs(release)
    for raw_id, kv in text.items():
        job_id = int(raw_id)
        if job_id not in jobs:  # finished: 23.02+ squeue leaves it out (test below)
            assert kv["JobState"] in {"COMPLETED", "FAILED", "CANCELLED"}, (release, kv["JobState"])
            continue
        j = jobs[job_id]
        assert j.state == kv["JobState"], job_id
        assert (j.user, j.account, j.partition, j.qos) == (
            kv["UserId"].split("(")[0], kv["Account"], kv["Partition"], kv["QOS"]), job_id
        assert j.time_limit_min == text_minutes(kv["TimeLimit"]), job_id
        assert j.het_job_id == (int(kv["HetJobId"]) if "HetJobId" in kv else None), job_id
        assert j.het_job_offset == (int(kv["HetJobOffset"]) if "HetJobOffset" in kv else None), job_id
        assert j.array_job_id == (int(kv["ArrayJobId"]) if "ArrayJobId" in kv else None), job_id
        assert j.array_task_id == (int(kv["ArrayTaskId"]) if "ArrayTaskId" in kv else None), job_id
        assert j.working_dir == kv["WorkDir"], job_id
        if j.is_pending:
            assert j.nodes == () and j.start_time is None and j.end_time is None, job_id
            continue
        assert ",".join(j.nodes) == ",".join(_expand(kv["NodeList"])), job_id
        assert (j.batch_host, j.node_count) == (kv["BatchHost"], int(kv["NumNodes"])), job_id
        assert j.start_time == text_time(kv["StartTime"]), job_id
        assert j.end_time == text_time(kv["EndTime"]), job_id
        if j.standard_output is not None and j.array_job_id is None:
            # The extension job appends to this file: the leader's own. %N stays for Slurm to fill in per node
            # (26.05's scontrol shows it filled in with the batch host, 22.05's and 24.11's do not).
            host = j.batch_host or ""
            assert leader_file(j.standard_output, j).replace("%N", host) == kv["StdOut"].replace("%N", host), job_id


def _expand(expr: str) -> tuple[str, ...]:
    from slurm_elastic.slurm.hostlist import expand
    return expand(expr)


def by_name(release: str) -> dict[str, Job]:
    return {j.name: j for j in adapter_jobs(release).values()}


@pytest.mark.parametrize("release", RELEASES)
def test_recorded_scenario(release: str) -> None:
    jobs = by_name(release)
    gpu = jobs["multi-gpu"]
    assert gpu.is_running and gpu.node_count == 1 and gpu.nodes == (gpu.batch_host,)  # after the shrink
    assert gpu.gpus_per_node() == 2 and gpu.time_limit_min == 40
    het = [j for j in adapter_jobs(release).values() if j.name == "het"]
    assert sorted((j.het_job_offset, len(j.nodes)) for j in het) == [(0, 1), (1, 2)]
    assert jobs["held"].is_pending and jobs["pending"].is_pending
    unlimited = jobs["no-limit"]
    if unlimited.time_limit_min is None:  # 23.02+: UNLIMITED, and no end (Slurm says a year out)
        assert unlimited.end_time is None and unlimited.remaining_seconds(datetime.now(tz=UTC)) is None
    else:  # with no --time, the partition's INFINITE MaxTime becomes a 365-day limit, in scontrol too
        assert unlimited.time_limit_min == 365 * 1440
    if "unlimited" in jobs:  # --time=UNLIMITED: no limit and no end (23.02+ say a year out; scontrol: Unknown)
        assert jobs["unlimited"].time_limit_min is None and jobs["unlimited"].end_time is None


@pytest.mark.parametrize("release", RELEASES)
def test_finished_job_state_comes_from_sacct(release: str) -> None:
    prov = rec(release, "PROVENANCE.md").read_text()
    finished = int(re.search(r"(\d+) finished", prov).group(1))  # type: ignore[union-attr]
    assert parse_sacct_states(rec(release, "sacct.txt").read_text())[finished] == "COMPLETED"
    in_squeue = adapter_jobs(release).get(finished)
    assert in_squeue is None or in_squeue.state == "COMPLETED"


@pytest.mark.parametrize("release", RELEASES)
def test_update_errors_are_classified(release: str) -> None:
    def err(name: str) -> Exception:
        stderr = rec(release, name).read_text()
        return classify(CommandResult(("scontrol", "update"), 1, "", stderr.rsplit("exit", 1)[0]))

    assert isinstance(err("update-unknown-job.txt.stderr"), SlurmJobNotFoundError)
    bad_list = err("update-bad-nodelist.txt.stderr")  # the job exists; the node list is not a subset
    assert isinstance(bad_list, SlurmInvalidNodeError) and not isinstance(bad_list, SlurmJobNotFoundError)
    assert isinstance(err("update-unknown-node.txt.stderr"), SlurmInvalidNodeError)
