"""Trace loaders: good input parses; every malformed row is a TraceFormatError naming file and line."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.sim.errors import TraceFormatError
from slurm_elastic.sim.loaders import TraceFormat, load_workload
from slurm_elastic.sim.traces import TRACES_ENV, traces_dir

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sacct"


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _error(workload: str, fmt: TraceFormat) -> TraceFormatError:
    with pytest.raises(TraceFormatError) as info:
        load_workload(workload, fmt)
    assert isinstance(info.value, SlurmElasticError)
    return info.value


# ---------------------------------------------------------------------------- pollux


def test_pollux_workload_from_the_shared_traces() -> None:
    workload = load_workload(str(traces_dir() / "pollux" / "workloads" / "workload-6.csv"), "pollux")
    assert len(workload.jobs) == 160
    first = workload.jobs[0]
    assert (first.job_id, first.submit_time, first.application, first.num_gpus, first.batch_size) == (
        "cifar10-0",
        53.0,
        "cifar10",
        6,
        2048,
    )


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("b,10,cifar10,x,2048", "num_replicas='x' is not an integer"),
        ("b,10,cifar10,0,2048", "num_replicas='0' must be >= 1"),
        ("b,-5,cifar10,1,2048", "time='-5' must be a finite number >= 0"),
        ("b,10,gpt,1,2048", "application='gpt' is not one of"),
        ("b,10,cifar10,1", "expected 5 fields"),
        ("a,10,cifar10,1,2048", "job name 'a' already used on line 2"),
    ],
)
def test_pollux_rejects_malformed_rows_with_line(tmp_path: Path, row: str, message: str) -> None:
    path = _write(tmp_path, "w.csv", f"name,time,application,num_replicas,batch_size\na,0,cifar10,1,128\n{row}\n")
    err = _error(path, "pollux")
    assert (err.path, err.line) == (path, 3)
    assert message in str(err) and str(err).startswith(f"{path}:3: ")


def test_pollux_missing_column(tmp_path: Path) -> None:
    err = _error(_write(tmp_path, "w.csv", "name,time,application\na,0,cifar10\n"), "pollux")
    assert err.line == 1 and "num_replicas" in err.reason


# ---------------------------------------------------------------------------- philly


def test_philly_selects_a_virtual_cluster_and_rebases_time(tmp_path: Path) -> None:
    text = (
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,aa\n"
        "2017-10-09 06:13:03,2951.0,8,23608.0,bb\n"
        "2017-10-09 07:00:00,100.0,2,200.0,bb\n"
    )
    path = _write(tmp_path, "philly.csv", text)
    workload = load_workload(f"{path}#bb", "philly")
    assert [(j.job_id, j.submit_time, j.num_gpus, j.duration) for j in workload.jobs] == [
        ("philly-3", 0.0, 8, 2951.0),
        ("philly-4", 2817.0, 2, 100.0),
    ]
    assert len(load_workload(path, "philly").jobs) == 3
    assert "clusters: aa, bb" in str(_error(f"{path}#zz", "philly"))


def test_philly_rejects_bad_timestamp(tmp_path: Path) -> None:
    text = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66,1,66,a\nyesterday,1,1,1,a\n"
    err = _error(_write(tmp_path, "p.csv", text), "philly")
    assert err.line == 3 and "timestamp='yesterday'" in err.reason


def test_philly_shared_trace_loads() -> None:
    workload = load_workload(str(traces_dir() / "pollux" / "traces" / "philly.csv") + "#6214e9", "philly")
    assert len(workload.jobs) == 41226


# ---------------------------------------------------------------------------- itp


def _tarball(tmp_path: Path, members: dict[str, str]) -> str:
    path = tmp_path / "raw-traces.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return str(path)


def test_itp_reads_a_member_of_the_archive_in_place(tmp_path: Path) -> None:
    good = "job_id,submission_time,duration,num_gpu\nj1,100,600,8\nj2,160,700,1\n"
    path = _tarball(tmp_path, {"cluster01.csv": good, "cluster02.csv": good, "LICENSE": "MIT"})
    for selector in ("cluster02", "cluster02.csv"):
        workload = load_workload(f"{path}#{selector}", "itp")
        assert [(j.job_id, j.submit_time, j.num_gpus, j.duration) for j in workload.jobs] == [
            ("j1", 100.0, 8, 600.0),
            ("j2", 160.0, 1, 700.0),
        ]
    assert "pick one member with #NAME: cluster01.csv, cluster02.csv" in str(_error(path, "itp"))
    assert "no member cluster09.csv" in str(_error(f"{path}#cluster09", "itp"))


def test_itp_malformed_row_names_the_member_and_line(tmp_path: Path) -> None:
    bad = "job_id,submission_time,duration,num_gpu\nj1,100,600,8\nj2,160,-1,1\n"
    path = _tarball(tmp_path, {"cluster03.csv": bad})
    err = _error(f"{path}#cluster03", "itp")
    assert err.path == f"{path}#cluster03.csv" and err.line == 3 and "duration" in err.reason


def test_itp_shared_archive_loads() -> None:
    workload = load_workload(str(traces_dir() / "itp" / "raw-traces.tar.gz") + "#cluster10", "itp")
    assert len(workload.jobs) == 260


# ---------------------------------------------------------------------------- sacct


def test_sacct_captured_parsable_export() -> None:
    workload = load_workload(str(FIXTURES / "captured-22.05.8-parsable.txt"), "sacct")
    jobs = {j.job_id: j for j in workload.jobs}
    assert len(jobs) == 34
    assert workload.skipped == {"never started": 4, "no GPUs": 7}
    assert (jobs["2"].submit_time, jobs["2"].num_gpus, jobs["2"].duration, jobs["2"].time_limit) == (0, 1, 106, 1800)
    assert (jobs["2"].user, jobs["2"].account, jobs["2"].partition) == ("bob", "vision", "train")
    # Resized: two records (RESIZING 4 GPUs on 2 nodes, then 2 GPUs on 1) with overlapping spans -> one job,
    # at the size it started with, for the time it ran once.
    assert (jobs["9"].num_gpus, jobs["9"].num_nodes, jobs["9"].duration) == (4, 2, 1.0)
    assert jobs["21"].duration == 1.0
    assert "5_0" in jobs and "12+1" in jobs and "12+0" not in jobs  # array task; het component without GPUs
    assert jobs["11"].time_limit == 365 * 86400.0


def test_sacct_captured_json_export() -> None:
    workload = load_workload(str(FIXTURES / "captured-22.05.8.json"), "sacct")
    jobs = {j.job_id: j for j in workload.jobs}
    assert len(jobs) == 35
    assert workload.skipped == {"never started": 3, "no GPUs": 7}
    # The preempted first run of job 1 is only in --json (-P without -D shows the last record).
    assert (jobs["1"].num_gpus, jobs["1"].duration) == (4, 6.0)
    parsable = {j.job_id: j for j in load_workload(str(FIXTURES / "captured-22.05.8-parsable.txt"), "sacct").jobs}
    assert set(jobs) - set(parsable) == {"1"}
    shift = jobs["2"].submit_time - parsable["2"].submit_time  # job 1 moves the JSON's origin
    for job_id, job in parsable.items():
        other = jobs[job_id]
        assert (other.submit_time - shift, other.num_gpus, other.duration, other.num_nodes, other.time_limit) == (
            job.submit_time,
            job.num_gpus,
            job.duration,
            job.num_nodes,
            job.time_limit,
        ), job_id


def test_sacct_synthetic_edge_cases() -> None:
    parsable = load_workload(str(FIXTURES / "synthetic-22.05-parsable.txt"), "sacct")
    jobs = {j.job_id: j for j in parsable.jobs}
    assert list(jobs) == ["2", "3", "5", "10_1", "12+0", "12+1"]
    assert (jobs["3"].num_gpus, jobs["3"].num_nodes, jobs["3"].duration, jobs["3"].time_limit) == (8, 2, 4800, 86400)
    assert parsable.skipped == {"never started": 3, "not finished": 1, "no GPUs": 1}
    from_json = load_workload(str(FIXTURES / "synthetic-22.05.json"), "sacct")
    assert [j.job_id for j in from_json.jobs] == ["2", "3", "10_1", "12+1"]
    assert from_json.skipped == {"never started": 1, "no GPUs": 1}
    for job in from_json.jobs:
        other = jobs[job.job_id]
        assert (job.submit_time, job.num_gpus, job.duration, job.num_nodes) == (
            other.submit_time,
            other.num_gpus,
            other.duration,
            other.num_nodes,
        )


def test_sacct_requeued_runs_count_once_each(tmp_path: Path) -> None:
    text = _HEADER + (
        "7|2024-01-01T00:00:00|2024-01-01T00:01:00|2024-01-01T00:11:00|00:10:00|gres/gpu=2||1|PREEMPTED|g|a|u\n"
        "7|2024-01-01T00:11:00|2024-01-01T01:00:00|2024-01-01T01:05:00|00:05:00|gres/gpu=2||1|COMPLETED|g|a|u\n"
    )
    (job,) = load_workload(_write(tmp_path, "requeue.txt", text), "sacct").jobs
    assert (job.submit_time, job.duration, job.line) == (0.0, 900.0, 2)


_HEADER = "JobID|Submit|Start|End|Elapsed|AllocTRES|ReqTRES|NNodes|State|Partition|Account|User\n"
_GOOD = (
    "2|2024-11-29T21:40:01|2024-11-29T21:40:02|2024-11-29T21:45:02|00:05:00|"
    + "cpu=1,gres/gpu=2|cpu=1|1|COMPLETED|gpu|a|u\n"
)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            "3|yesterday|2024-11-29T21:40:02|2024-11-29T21:45:02|00:05:00|gres/gpu=1||1|COMPLETED|g|a|u",
            "time 'yesterday'",
        ),
        (
            "3|2024-11-29T21:40:01|2024-11-29T21:40:02|2024-11-29T21:45:02|5 min|gres/gpu=1||1|COMPLETED|g|a|u",
            "Elapsed",
        ),
        (
            "3|2024-11-29T21:40:01|2024-11-29T21:40:02|2024-11-29T21:45:02|00:05:00|gres/gpu=two||1|COMPLETED|g|a|u",
            "gres/gpu",
        ),
        (
            "3|2024-11-29T21:40:01|2024-11-29T21:40:02|2024-11-29T21:45:02|00:05:00|gres/gpu=1||x|COMPLETED|g|a|u",
            "NNodes",
        ),
        (
            "3|2024-11-29T21:40:01|2024-11-29T21:40:02|2024-11-29T21:45:02|00:05:00|gres/gpu=1",
            "expected 12 fields",
        ),
        (
            "job3|2024-11-29T21:40:01|2024-11-29T21:40:02|2024-11-29T21:45:02|00:05:00|gres/gpu=1||1|X|g|a|u",
            "JobID",
        ),
        (
            "3|2024-11-29T21:40:01|2024-11-29T21:40:02|2024-11-29T21:30:00|00:05:00|gres/gpu=1||1|X|g|a|u",
            "End before Start",
        ),
    ],
)
def test_sacct_parsable_rejects_malformed_rows(tmp_path: Path, row: str, message: str) -> None:
    path = _write(tmp_path, "acct.txt", _HEADER + _GOOD + row + "\n")
    err = _error(path, "sacct")
    assert err.line == 3 and message in err.reason


def test_sacct_parsable_accepts_trailing_separator_and_needs_columns(tmp_path: Path) -> None:
    trailing = _HEADER.replace("\n", "|\n") + _GOOD.replace("\n", "|\n")
    assert [j.job_id for j in load_workload(_write(tmp_path, "p.txt", trailing), "sacct").jobs] == ["2"]
    err = _error(_write(tmp_path, "q.txt", "JobID|State\n2|COMPLETED\n"), "sacct")
    assert err.line == 1 and "missing column(s) Submit, Start, End, AllocTRES or ReqTRES" in err.reason


def test_sacct_json_errors_name_the_line(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "synthetic-22.05.json").read_text())
    doc["jobs"][1]["job_id"] = "three"
    text = json.dumps(doc, indent=2)
    line = text.splitlines().index("    {", text.splitlines().index("    {") + 1) + 1  # second job's '{'
    err = _error(_write(tmp_path, "bad.json", text), "sacct")
    assert err.line == line and "job_id='three'" in err.reason
    err = _error(_write(tmp_path, "broken.json", '{"jobs": [\n  {"job_id": 1,\n}\n'), "sacct")
    assert err.line == 3 and "invalid JSON" in err.reason
    err = _error(_write(tmp_path, "nojobs.json", '{"meta": {}}'), "sacct")
    assert "no top-level 'jobs'" in err.reason


def test_sacct_json_later_shapes(tmp_path: Path) -> None:
    # 23.02+: state.current is a list and numbers are {"set", "infinite", "number"} objects.
    def num(n: int) -> dict[str, object]:
        return {"set": True, "infinite": False, "number": n}

    job = {
        "job_id": 5,
        "state": {"current": ["COMPLETED"]},
        "time": {"submission": num(1000), "start": num(1010), "end": num(1610), "limit": num(30)},
        "tres": {"allocated": [{"type": "gres", "name": "gpu", "id": 1001, "count": 4}]},
        "allocation_nodes": 1,
    }
    workload = load_workload(_write(tmp_path, "new.json", json.dumps({"jobs": [job]})), "sacct")
    (spec,) = workload.jobs
    assert (spec.job_id, spec.num_gpus, spec.duration, spec.time_limit) == ("5", 4, 600.0, 1800.0)


def test_traces_dir_env_override(tmp_path: Path) -> None:
    assert traces_dir({TRACES_ENV: str(tmp_path)}) == tmp_path
    with pytest.raises(SlurmElasticError, match="not a directory"):
        traces_dir({TRACES_ENV: str(tmp_path / "missing")})
