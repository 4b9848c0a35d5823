"""The /metrics exposition, parsed back with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from slurm_elastic.agent.aggregate import JobHistory
from slurm_elastic.agent.attribution import attribute
from slurm_elastic.agent.metrics import AgentCounters, ReportCollector, make_registry, render
from slurm_elastic.agent.model import DeviceReading, GpuAllocation, JobRef, ProcessReading
from slurm_elastic.agent.payload import NodeReport, NvmlInfo

Samples = dict[str, list[tuple[dict[str, str], float]]]


def node_report(history: JobHistory, t: float, running: bool) -> NodeReport:
    devices = [
        DeviceReading("0", "gpu", 0, "GPU-0", "NVIDIA A100", 0, 1000 if running else 0, 40960,
                      90.0 if running else 0.0, None, processes=(ProcessReading(5, 1000, 90.0),) if running else ()),
        DeviceReading("1", "gpu", 1, "GPU-1", "NVIDIA A100", 1, 0, 40960, None, "mig_enabled", mig_enabled=True),
        DeviceReading("1/1/0", "mig", 1, "MIG-1", "NVIDIA A100 MIG 3g.20gb", None, 10, 19968, None,
                      "mig_no_utilization", parent_uuid="GPU-1", gpu_instance_id=1, compute_instance_id=0,
                      profile="3g.20gb"),
    ]
    allocations = {0: GpuAllocation(0, 42, 1001, "alice", "nlp")} if running else {}
    gpus, points = attribute(devices, allocations, {5: JobRef(42, "cgroup")} if running else {})
    history.add(t, points)
    return NodeReport(node="n1", agent_version="0.1.0", generated_at=t, sampled_at=t, interval_s=5.0, window_s=60.0,
                      nvml=NvmlInfo("ok", "550", None), gpus=gpus, jobs=history.jobs(t), errors=())


def scrape(collector: ReportCollector) -> Samples:
    text = render(make_registry(collector)).decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_device_and_job_metrics_with_labels_and_finished_jobs_vanish() -> None:
    history = JobHistory(60.0)
    state = {"report": node_report(history, 100.0, running=True)}
    counters = AgentCounters(samples_total=3, sample_errors_total={"gpu_is_lost": 2}, last_sample_duration_s=0.01)
    collector = ReportCollector("n1", lambda: (state["report"], counters))

    m = scrape(collector)
    ((labels, value),) = m["DCGM_FI_DEV_GPU_UTIL"]
    assert value == 90.0
    assert labels == {"node": "n1", "gpu": "0", "uuid": "GPU-0", "device": "0", "model": "NVIDIA A100", "profile": "",
                      "job": "42", "user": "alice", "account": "nlp"}
    unavailable = {lbl["device"]: lbl["reason"] for lbl, _ in m["slurm_elastic_gpu_utilization_unavailable"]}
    assert unavailable == {"1": "mig_enabled", "1/1/0": "mig_no_utilization"}  # no fake 0 for these
    assert [v for lbl, v in m["DCGM_FI_DEV_FB_USED"] if lbl["device"] == "1/1/0"] == [10.0]
    assert [v for lbl, v in m["DCGM_FI_DEV_FB_FREE"] if lbl["device"] == "0"] == [39960.0]
    job = {"node": "n1", "job": "42", "user": "alice", "account": "nlp"}
    assert m["slurm_elastic_job_gpus_allocated"] == [(job, 1.0)]
    assert m["slurm_elastic_job_gpus_in_use"] == [(job, 1.0)]
    assert m["slurm_elastic_job_gpu_utilization_mean_percent"] == [(job, 90.0)]
    assert m["slurm_elastic_job_gpu_memory_used_mib"] == [(job, 1000.0)]
    assert m["slurm_elastic_agent_samples_total"] == [({"node": "n1"}, 3.0)]
    assert m["slurm_elastic_agent_sample_errors_total"] == [({"node": "n1", "code": "gpu_is_lost"}, 2.0)]
    assert m["slurm_elastic_agent_nvml_up"] == [({"node": "n1"}, 1.0)]

    state["report"] = node_report(history, 105.0, running=False)  # the job ended
    m = scrape(collector)
    assert "slurm_elastic_job_gpus_allocated" not in m
    assert all(lbl["job"] == "" for lbl, _ in m["DCGM_FI_DEV_GPU_UTIL"])


def test_before_the_first_sample_and_own_registry() -> None:
    collector = ReportCollector("n1", lambda: (None, AgentCounters()))
    m = scrape(collector)
    assert m["slurm_elastic_agent_nvml_up"] == [({"node": "n1"}, 0.0)]
    assert "DCGM_FI_DEV_GPU_UTIL" not in m
    assert REGISTRY.get_sample_value("slurm_elastic_agent_nvml_up", {"node": "n1"}) is None  # global untouched
