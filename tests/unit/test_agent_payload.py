"""The v1 JSON payload: what the agent sends round-trips, and the controller's parser refuses what is wrong."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from slurm_elastic.agent.aggregate import JobHistory
from slurm_elastic.agent.attribution import attribute
from slurm_elastic.agent.errors import PayloadError
from slurm_elastic.agent.model import DeviceReading, GpuAllocation, JobRef, ProcessReading
from slurm_elastic.agent.payload import (
    SCHEMA,
    ErrorReport,
    NodeReport,
    NvmlInfo,
    parse_payload,
    parse_payload_bytes,
    to_dict,
    to_json_bytes,
)


def sample_report() -> NodeReport:
    devices = [
        DeviceReading("0", "gpu", 0, "GPU-0", "A100", 0, 1000, 40960, 90.0, None,
                      processes=(ProcessReading(100, 1000, 90.0),)),
        DeviceReading("1", "gpu", 1, "GPU-1", "A100", 1, 0, 40960, 0.0, None),
        DeviceReading("2", "gpu", 2, "GPU-2", "A100", 2, 0, 40960, None, "mig_enabled", mig_enabled=True),
        DeviceReading("2/1/0", "mig", 2, "MIG-2", "A100 MIG 3g.20gb", None, 0, 19968, None, "mig_no_utilization",
                      parent_uuid="GPU-2", gpu_instance_id=1, compute_instance_id=0, profile="3g.20gb"),
    ]
    gpus, points = attribute(devices, {0: GpuAllocation(0, 7, 0, "root", "root"),
                                       1: GpuAllocation(1, 7, 0, "root", "root")}, {100: JobRef(7, "cgroup")})
    history = JobHistory(60.0)
    history.add(1000.0, points)
    return NodeReport(node="n1", agent_version="0.1.0", generated_at=1000.0, sampled_at=1000.0, interval_s=5.0,
                      window_s=60.0, nvml=NvmlInfo("ok", "550.54.15", None), gpus=gpus, jobs=history.jobs(1000.0),
                      errors=(ErrorReport("gpu_map_invalid", "n1/3: garbage", "3"),))


def test_round_trip_through_json() -> None:
    report = sample_report()
    assert parse_payload_bytes(to_json_bytes(report)) == report
    assert to_dict(report)["schema"] == SCHEMA


def test_the_example_job() -> None:
    (job,) = sample_report().jobs
    assert (job.job_id, job.gpus_allocated, job.gpus_in_use, job.util_mean_percent) == (7, 2, 1, 45.0)


def mutate(fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    d = copy.deepcopy(to_dict(sample_report()))
    fn(d)
    return d


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    def apply(d: dict[str, Any]) -> None:
        *head, last = path.split(".")
        cur: Any = d
        for part in head:
            cur = cur[int(part)] if part.isdigit() else cur[part]
        if value is _DELETE:
            del cur[last]
        else:
            cur[int(last) if last.isdigit() else last] = value
    return apply


_DELETE = object()

BAD = [
    ("schema", "slurm-elastic/agent-node/v2", "schema"),
    ("node", 5, "node"),
    ("node", _DELETE, "node: missing"),
    ("nvml.status", "fine", "nvml.status"),
    ("gpus.0.utilization_percent", 101, "gpus[0].utilization_percent"),
    ("gpus.0.utilization_percent", -1, "gpus[0].utilization_percent"),
    ("gpus.0.utilization_percent", "90", "gpus[0].utilization_percent"),
    ("gpus.0.utilization_percent", float("nan"), "gpus[0].utilization_percent"),
    ("gpus.1.utilization_percent", None, "gpus[1].utilization_reason"),  # null without a reason
    ("gpus.3.utilization_percent", 0.0, "gpus[3].utilization_percent"),  # MIG with a made-up 0
    ("gpus.3.parent_uuid", None, "gpus[3]"),
    ("gpus.0.index", True, "gpus[0].index"),  # a bool is not an integer
    ("gpus.0.memory_used_mib", 50000, "gpus[0].memory_used_mib"),
    ("gpus.0.processes.0.pid", 0, "gpus[0].processes[0].pid"),
    ("gpus.0.processes.0.job_source", "guess", "gpus[0].processes[0].job_source"),
    ("gpus.0.owner_source", None, "gpus[0].owner_source"),
    ("gpus.0.processes", {}, "gpus[0].processes"),
    ("jobs.0.job_id", 0, "jobs[0].job_id"),
    ("jobs.0.gpus_allocated", 3, "jobs[0]"),
    ("jobs.0.sample_count", 0, "jobs[0].sample_count"),
    ("jobs.0.util_mean_percent", None, "jobs[0].utilization_reason"),
    ("jobs.0.first_sample_at", 2000.0, "jobs[0].first_sample_at"),
    ("interval_s", 0, "interval_s"),
    ("errors.0.code", None, "errors[0].code"),
]


@pytest.mark.parametrize(("path", "value", "where"), BAD, ids=[f"{p}={v!r}" for p, v, _ in BAD])
def test_bad_payloads_are_refused_naming_the_field(path: str, value: object, where: str) -> None:
    with pytest.raises(PayloadError) as info:
        parse_payload(mutate(_set(path, value)))
    assert str(info.value).startswith(where)


def test_duplicates_are_refused() -> None:
    with pytest.raises(PayloadError, match="duplicate device ids"):
        parse_payload(mutate(lambda d: d["gpus"].append(d["gpus"][0])))
    with pytest.raises(PayloadError, match="duplicate job ids"):
        parse_payload(mutate(lambda d: d["jobs"].append(d["jobs"][0])))


def test_unknown_keys_are_ignored_within_v1() -> None:
    d = mutate(lambda d: d.update(future_field=1))
    d["gpus"][0]["temperature_c"] = 40
    assert parse_payload(d) == sample_report()


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b"null", "\u00e9".encode("latin-1")])
def test_not_json_or_not_an_object(data: bytes) -> None:
    with pytest.raises(PayloadError):
        parse_payload_bytes(data)


def test_the_agent_cannot_build_an_invalid_payload() -> None:
    report = sample_report()
    bad = NodeReport(**{**report.__dict__, "interval_s": -1.0})
    with pytest.raises(PayloadError):
        to_json_bytes(bad)


def test_json_is_compact_and_strict() -> None:
    body = to_json_bytes(sample_report())
    assert b"NaN" not in body and b'", "' not in body
    assert body.startswith(b'{"schema":"slurm-elastic/agent-node/v1",')
    assert json.loads(body)["jobs"][0]["devices"] == ["0", "1"]
