"""Merging per-node agent reports into one conservative figure per job."""

from __future__ import annotations

import pytest

from slurm_elastic.agent.payload import JobReport, NodeReport, NvmlInfo
from slurm_elastic.controller.collect import merge_job


def jr(job_id: int, mean: float | None, mx: float | None, gpus: int, used: int, samples: int,
       first: float, last: float) -> JobReport:
    return JobReport(job_id=job_id, sluid=None, user="alice", account="nlp", uid=1001, devices=(),
                     gpus_allocated=gpus, gpus_in_use=used, util_mean_percent=mean, util_max_percent=mx,
                     util_last_percent=mean, utilization_reason=None if mean is not None else "no samples",
                     memory_used_mib=0, memory_max_mib=0, sample_count=samples, util_sample_count=samples,
                     first_sample_at=first, last_sample_at=last)


def node(name: str, *jobs: JobReport) -> NodeReport:
    return NodeReport(node=name, agent_version="test", generated_at=1000.0, sampled_at=1000.0, interval_s=5.0,
                      window_s=600.0, nvml=NvmlInfo("ok", None, None), gpus=(), jobs=jobs, errors=())


def test_weighted_mean_max_and_conservative_counts() -> None:
    reports = {"n1": node("n1", jr(7, 90.0, 95.0, 4, 4, 100, 400.0, 1000.0)),
               "n2": node("n2", jr(7, 30.0, 60.0, 2, 1, 80, 500.0, 990.0))}
    m = merge_job(7, [(7, "n1"), (7, "n2")], reports)
    assert m.util_mean_percent == pytest.approx((90 * 4 + 30 * 2) / 6)
    assert m.util_max_percent == 95.0
    assert (m.gpus_allocated, m.gpus_in_use) == (6, 5)
    assert m.sample_count == 80 and m.last_sample_at == 990.0 and m.window_covered_s == 490.0
    assert m.coverage == 1.0 and m.nodes_missing == ()


def test_missing_node_lowers_coverage() -> None:
    reports = {"n1": node("n1", jr(7, 10.0, 12.0, 4, 4, 100, 0.0, 1000.0)), "n2": node("n2")}
    m = merge_job(7, [(7, "n1"), (7, "n2"), (7, "n3")], reports)
    assert m.coverage == pytest.approx(1 / 3) and m.nodes_missing == ("n2", "n3")
    assert m.util_mean_percent == 10.0


def test_idle_allocated_job_and_no_data() -> None:
    idle = merge_job(8, [(8, "n1")], {"n1": node("n1", jr(8, 0.0, 0.0, 2, 0, 10, 0.0, 50.0))})
    assert idle.util_mean_percent == 0.0 and idle.gpus_in_use == 0 and idle.gpus_allocated == 2
    none = merge_job(9, [(9, "n1")], {})
    assert none.util_mean_percent is None and none.coverage == 0.0 and none.sample_count == 0
    assert none.last_sample_at is None


def test_extension_nodes_are_read_under_the_extension_jobs_id() -> None:
    reports = {"n1": node("n1", jr(7, 90.0, 95.0, 2, 2, 10, 0.0, 100.0)),
               "n2": node("n2", jr(8, 70.0, 80.0, 2, 2, 10, 0.0, 100.0), jr(7, 0.0, 0.0, 0, 0, 1, 0.0, 1.0))}
    m = merge_job(7, [(7, "n1"), (8, "n2")], reports)
    assert m.coverage == 1.0 and m.util_mean_percent == 80.0 and m.gpus_allocated == 4
