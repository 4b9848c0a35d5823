"""Prometheus exposition of the latest report, on the agent's own registry (never the global one).

Device metrics follow dcgm-exporter's names (``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_DEV_FB_USED``, ...), job and
agent metrics are ``slurm_elastic_*``. Every family is rebuilt from the latest report at each scrape, so the
series of a finished job vanish with it (the same effect as resetting each vector per scrape, without a window
where a scrape sees a half-filled vector). A device whose utilization is unknown gets no ``DCGM_FI_DEV_GPU_UTIL``
sample at all, and one ``slurm_elastic_gpu_utilization_unavailable{reason=...}`` instead: never a fake 0.

A collector built with ``per_job=False`` is the view for scrapers without the metrics token: the device series
without their job, user and account labels, and no ``slurm_elastic_job_*`` families at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from slurm_elastic.agent.payload import GpuReport, NodeReport

DEVICE_LABELS = ("node", "gpu", "uuid", "device", "model", "profile", "job", "user", "account")
_PUBLIC_DEVICE_LABELS = DEVICE_LABELS[:6]  # without job, user, account
JOB_LABELS = ("node", "job", "user", "account")
CONTENT_TYPE = CONTENT_TYPE_LATEST


@dataclass
class AgentCounters:
    """Cumulative counters of the agent process (reported as Prometheus counters)."""

    samples_total: int = 0
    sample_errors_total: dict[str, int] = field(default_factory=dict)
    last_sample_duration_s: float | None = None


def _s(value: object) -> str:
    return "" if value is None else str(value)


def _device_labels(node: str, g: GpuReport, per_job: bool) -> list[str]:
    labels = [node, str(g.index), _s(g.uuid), g.id, _s(g.name), _s(g.profile)]
    return [*labels, _s(g.job_id), _s(g.user), _s(g.account)] if per_job else labels


class ReportCollector(Collector):
    def __init__(self, node: str, snapshot: Callable[[], tuple[NodeReport | None, AgentCounters]], *,
                 per_job: bool = True) -> None:
        self.node = node
        self._snapshot = snapshot
        self.per_job = per_job

    def collect(self) -> Iterable[Metric]:
        report, counters = self._snapshot()
        node = self.node
        device_labels = DEVICE_LABELS if self.per_job else _PUBLIC_DEVICE_LABELS

        def dev(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=device_labels)

        util = dev("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).")
        fb_used = dev("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).")
        fb_free = dev("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).")
        procs = dev("slurm_elastic_gpu_processes", "Compute processes running on the device.")
        unavailable = GaugeMetricFamily(
            "slurm_elastic_gpu_utilization_unavailable",
            "1 for a device whose utilization is unknown, with the reason (e.g. mig_no_utilization).",
            labels=(*device_labels, "reason"),
        )
        jl = {n: GaugeMetricFamily(f"slurm_elastic_job_{n}", doc, labels=JOB_LABELS) for n, doc in (
            ("gpus_allocated", "GPUs the job holds on this node."),
            ("gpus_in_use", "GPUs on this node running at least one of the job's processes."),
            ("gpu_utilization_mean_percent", "Mean GPU utilization of the job's GPUs over the window (in %)."),
            ("gpu_utilization_max_percent", "Highest single-GPU utilization of the job over the window (in %)."),
            ("gpu_utilization_last_percent", "Mean GPU utilization of the job's GPUs, latest sample (in %)."),
            ("gpu_memory_used_mib", "GPU memory used by the job's processes, latest sample (in MiB)."),
            ("samples", "Samples in the window that saw the job."),
            ("last_sample_timestamp_seconds", "Time of the latest sample that saw the job."),
        )}
        if report is not None:
            for g in report.gpus:
                labels = _device_labels(node, g, self.per_job)
                if g.utilization_percent is not None:
                    util.add_metric(labels, g.utilization_percent)
                else:
                    unavailable.add_metric([*labels, _s(g.utilization_reason)], 1.0)
                if g.memory_used_mib is not None:
                    fb_used.add_metric(labels, g.memory_used_mib)
                    if g.memory_total_mib is not None:
                        fb_free.add_metric(labels, g.memory_total_mib - g.memory_used_mib)
                if g.error is None:
                    procs.add_metric(labels, len(g.processes))
            for j in report.jobs if self.per_job else ():
                labels = [node, str(j.job_id), _s(j.user), _s(j.account)]
                jl["gpus_allocated"].add_metric(labels, j.gpus_allocated)
                jl["gpus_in_use"].add_metric(labels, j.gpus_in_use)
                for key, value in (("gpu_utilization_mean_percent", j.util_mean_percent),
                                   ("gpu_utilization_max_percent", j.util_max_percent),
                                   ("gpu_utilization_last_percent", j.util_last_percent)):
                    if value is not None:
                        jl[key].add_metric(labels, value)
                jl["gpu_memory_used_mib"].add_metric(labels, j.memory_used_mib)
                jl["samples"].add_metric(labels, j.sample_count)
                jl["last_sample_timestamp_seconds"].add_metric(labels, j.last_sample_at)
        yield from (util, fb_used, fb_free, procs, unavailable, *(jl.values() if self.per_job else ()))

        up = GaugeMetricFamily("slurm_elastic_agent_nvml_up", "1 when the latest NVML sample succeeded.",
                               labels=("node",))
        up.add_metric([node], 1.0 if report is not None and report.nvml.status == "ok" else 0.0)
        samples = CounterMetricFamily("slurm_elastic_agent_samples", "Samples taken.", labels=("node",))
        samples.add_metric([node], counters.samples_total)
        errors = CounterMetricFamily("slurm_elastic_agent_sample_errors", "Problems met while sampling, by code.",
                                     labels=("node", "code"))
        for code, n in sorted(counters.sample_errors_total.items()):
            errors.add_metric([node, code], n)
        last = GaugeMetricFamily("slurm_elastic_agent_last_sample_timestamp_seconds", "Time of the latest sample.",
                                 labels=("node",))
        if report is not None and report.sampled_at is not None:
            last.add_metric([node], report.sampled_at)
        duration = GaugeMetricFamily("slurm_elastic_agent_sample_duration_seconds",
                                     "Wall time of the latest sample.", labels=("node",))
        if counters.last_sample_duration_s is not None:
            duration.add_metric([node], counters.last_sample_duration_s)
        yield from (up, samples, errors, last, duration)


def make_registry(collector: ReportCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
