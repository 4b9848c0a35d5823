"""Per-job GPU utilization read from the site's Prometheus with PromQL: the other metrics source of the cycle.

A :class:`PrometheusSource` is a collector like the agents' fan-out (controller/collect.py): called with the
cluster's nodes, it returns a :class:`~slurm_elastic.controller.collect.CollectResult` of per-node reports whose
jobs carry the same fields the agents report, so ``merge_job`` and the rest of the cycle do not know where the
numbers came from. Two sets of series are understood (``[metrics_source] series``):

* ``dcgm``: NVIDIA dcgm-exporter with its HPC job mapping (``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_FB_USED``
  per GPU, the Slurm job in ``hpc_job``, the node in ``Hostname``; both label names are settings). One instant
  query per figure, aggregated by (node, job) in PromQL: the mean of the GPUs' means over ``window_s``, the
  highest single value, the GPUs, the GPUs with any utilization in the window ("in use": dcgm-exporter has no
  process list), the fewest samples of any GPU, the *oldest* GPU's latest sample time, the memory used.
* ``agent``: the agents' own ``slurm_elastic_job_*`` series (scraped with the metrics token), already windowed by
  the agent: read as they are, in one query. The Slurm job id is in ``exported_job`` (Prometheus renames the
  agent's ``job`` label) or, with ``honor_labels: true``, in ``job``.

Missing data is never a number: a job without a latest-sample series is not reported (its unit's coverage drops
and the cycle stores nothing, as for a silent agent); a node with no series at all is reported as an error; a
query that fails (unreachable, timeout, HTTP or PromQL error, a reply that is not a vector) fails the whole
collection, every node as an error, so no unit gets a sample that cycle. Prometheus' staleness handling does the
rest: the series of a target that stops answering vanish from instant queries at its next failed scrape.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import aiohttp

from slurm_elastic.agent.payload import JobReport, NodeReport, NvmlInfo
from slurm_elastic.controller.collect import CollectResult
from slurm_elastic.controller.config import MetricsSourceConfig

QUERY_PATH = "/api/v1/query"
MAX_REPLY_BYTES = 256 * 1024 * 1024
#: The agents' per-job families read with series = "agent" (slurm_elastic/agent/metrics.py).
AGENT_JOB_FAMILIES = ("gpus_allocated", "gpus_in_use", "gpu_utilization_mean_percent", "gpu_utilization_max_percent",
                      "gpu_memory_used_mib", "samples", "last_sample_timestamp_seconds")
DCGM_UTIL = "DCGM_FI_DEV_GPU_UTIL"
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"


class PrometheusError(Exception):
    """A query that gave no usable answer (one line: what failed and why)."""


@dataclass(frozen=True)
class Series:
    """One element of an instant vector: its labels and value (never NaN or infinite: those are dropped)."""

    labels: Mapping[str, str]
    value: float


def parse_vector(body: bytes | str) -> list[Series]:
    """The series of a ``/api/v1/query`` reply; PrometheusError for an error reply or anything but a vector."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise PrometheusError(f"reply is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise PrometheusError("reply is not a JSON object")
    if doc.get("status") != "success":
        raise PrometheusError(f"{doc.get('errorType', 'error')}: {str(doc.get('error', 'no reason given'))[:300]}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        kind = data.get("resultType") if isinstance(data, dict) else None
        raise PrometheusError(f"expected an instant vector, got {kind!r}")
    out: list[Series] = []
    for item in data["result"]:
        metric, value = (item.get("metric"), item.get("value")) if isinstance(item, dict) else (None, None)
        if not isinstance(metric, dict) or not isinstance(value, list) or len(value) != 2:
            raise PrometheusError(f"malformed vector element: {str(item)[:200]}")
        try:
            number = float(value[1])
        except (TypeError, ValueError):
            raise PrometheusError(f"malformed sample value: {value[1]!r}") from None
        if math.isfinite(number):
            out.append(Series({str(k): str(v) for k, v in metric.items()}, number))
    return out


def _selector(metric: str, cfg: MetricsSourceConfig, *matchers: str) -> str:
    parts = [m for m in (*matchers, cfg.matchers) if m]
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def queries(cfg: MetricsSourceConfig) -> dict[str, str]:
    """The PromQL of one collection, by figure (the label names and matchers are validated in config.py)."""
    if cfg.series == "agent":
        names = "|".join(AGENT_JOB_FAMILIES)
        return {
            "jobs": _selector("", cfg, f'__name__=~"slurm_elastic_job_({names})"'),
            "nodes": _selector("slurm_elastic_agent_nvml_up", cfg),
            "gpus_per_node": "count by (node) (" + _selector(DCGM_UTIL, cfg, 'node!=""') + ")",
        }
    by = f"{cfg.node_label}, {cfg.job_label}"
    job = f'{cfg.job_label}!=""'
    util = _selector(DCGM_UTIL, cfg, job)
    window = f"[{cfg.window_s:g}s]"
    return {
        "mean": f"avg by ({by}) (avg_over_time({util}{window}))",
        "max": f"max by ({by}) (max_over_time({util}{window}))",
        "gpus": f"count by ({by}) ({util})",
        "in_use": f"count by ({by}) (max_over_time({util}{window}) > 0)",
        "samples": f"min by ({by}) (count_over_time({util}{window}))",
        "last": f"min by ({by}) (timestamp({util}))",
        "memory": f"sum by ({by}) ({_selector(DCGM_FB_USED, cfg, job)})",
        "gpus_per_node": f"count by ({cfg.node_label}) ({_selector(DCGM_UTIL, cfg)})",
    }


class _NodeNames:
    """Maps a node label's value to a Slurm node name: the name itself, else its short host name (a
    dcgm-exporter ``Hostname`` may be the fully qualified name)."""

    def __init__(self, nodes: Iterable[str]) -> None:
        self.nodes = set(nodes)

    def __call__(self, value: str | None) -> str | None:
        if not value:
            return None
        if value in self.nodes:
            return value
        short = value.split(".", 1)[0]
        return short if short in self.nodes else None


def _job_id(text: str | None) -> int | None:
    try:
        job = int(text or "")
    except ValueError:
        return None
    return job if job > 0 else None


@dataclass
class _JobGpuStats:
    gpus: int = 0
    in_use: int = 0
    mean: float | None = None
    max: float | None = None
    samples: int = 0
    last: float | None = None
    memory: float = 0.0


def _report(node: str, jobs: Mapping[int, _JobGpuStats], window_s: float, now: float) -> NodeReport:
    reports = []
    for job_id, j in sorted(jobs.items()):
        assert j.last is not None
        reports.append(JobReport(
            job_id=job_id, sluid=None, user=None, account=None, uid=None, devices=(), gpus_allocated=j.gpus,
            gpus_in_use=j.in_use, util_mean_percent=j.mean, util_max_percent=j.max if j.max is not None else j.mean,
            util_last_percent=None, utilization_reason=None if j.mean is not None else "no_series",
            memory_used_mib=int(j.memory), memory_max_mib=int(j.memory), sample_count=j.samples,
            util_sample_count=j.samples if j.mean is not None else 0,
            first_sample_at=j.last, last_sample_at=j.last))
    sampled = max((j.last for j in jobs.values() if j.last is not None), default=None)
    return NodeReport(node=node, agent_version="prometheus", generated_at=now, sampled_at=sampled, interval_s=0.0,
                      window_s=window_s, nvml=NvmlInfo("ok", None, None), gpus=(), jobs=tuple(reports), errors=())


def reports_from(cfg: MetricsSourceConfig, replies: Mapping[str, list[Series]], nodes: Iterable[str],
                 now: float) -> CollectResult:
    """Pure: the replies of :func:`queries` (by figure) as per-node reports of the cluster's ``nodes``."""
    names = _NodeNames(nodes)
    node_label = "node" if cfg.series == "agent" else cfg.node_label
    gpu_counts: dict[str, int] = {}
    for s in replies.get("gpus_per_node", ()):
        if (node := names(s.labels.get(node_label))) is not None:
            gpu_counts[node] = gpu_counts.get(node, 0) + int(s.value)
    present = set(gpu_counts)
    found: dict[str, dict[int, _JobGpuStats]] = {}
    if cfg.series == "agent":
        present |= {n for s in replies.get("nodes", ()) if (n := names(s.labels.get("node"))) is not None}
        for s in replies.get("jobs", ()):
            node = names(s.labels.get("node"))
            # The agent's job label: renamed exported_job by Prometheus, or kept as job with honor_labels.
            job_id = _job_id(s.labels["exported_job"] if "exported_job" in s.labels else s.labels.get("job"))
            if node is None or job_id is None:
                continue
            j = found.setdefault(node, {}).setdefault(job_id, _JobGpuStats())
            family = s.labels.get("__name__", "").removeprefix("slurm_elastic_job_")
            if family == "gpus_allocated":
                j.gpus = int(s.value)
            elif family == "gpus_in_use":
                j.in_use = int(s.value)
            elif family == "gpu_utilization_mean_percent":
                j.mean = s.value
            elif family == "gpu_utilization_max_percent":
                j.max = s.value
            elif family == "gpu_memory_used_mib":
                j.memory = s.value
            elif family == "samples":
                j.samples = int(s.value)
            elif family == "last_sample_timestamp_seconds":
                j.last = s.value
    else:
        fields = {"gpus": "gpus", "in_use": "in_use", "mean": "mean", "max": "max", "samples": "samples",
                  "last": "last", "memory": "memory"}
        for figure, attr in fields.items():
            for s in replies.get(figure, ()):
                node = names(s.labels.get(cfg.node_label))
                job_id = _job_id(s.labels.get(cfg.job_label))
                if node is None or job_id is None:
                    continue
                j = found.setdefault(node, {}).setdefault(job_id, _JobGpuStats())
                setattr(j, attr, int(s.value) if attr in ("gpus", "in_use", "samples") else s.value)
    # A job without its latest-sample time is missing data (its series went stale: range queries still hold
    # their old samples): left out, never reported with made-up numbers; nor does it make its node present.
    current = {node: {job_id: j for job_id, j in jobs.items() if j.last is not None} for node, jobs in found.items()}
    reports = {node: _report(node, current.get(node, {}), cfg.window_s, now)
               for node in sorted(present | {n for n, jobs in current.items() if jobs})}
    errors = {n: "no series in Prometheus for this node" for n in sorted(names.nodes - set(reports))}
    return CollectResult(reports=reports, errors=errors, via=cfg.url,
                         gpu_counts={n: gpu_counts.get(n, 0) for n in reports})


class PrometheusSource:
    """The collector for ``[metrics_source] kind = "prometheus"``: every query of :func:`queries` at once."""

    def __init__(self, cfg: MetricsSourceConfig, *, token: bytes | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.queries = queries(cfg)
        self._headers = {"Authorization": f"Bearer {token.decode()}"} if token else {}
        self._clock = clock

    async def _query(self, session: aiohttp.ClientSession, expr: str) -> list[Series]:
        url = self.cfg.url + QUERY_PATH
        try:
            async with session.post(url, data={"query": expr}, headers=self._headers, allow_redirects=False,
                                    timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s)) as resp:
                body = await resp.content.read(MAX_REPLY_BYTES + 1)
                if len(body) > MAX_REPLY_BYTES:
                    raise PrometheusError(f"reply larger than {MAX_REPLY_BYTES} bytes")
                if resp.status != 200 and not resp.content_type.endswith("json"):
                    raise PrometheusError(f"HTTP {resp.status}: {body[:200].decode(errors='replace')}")
                try:
                    return parse_vector(body)
                except PrometheusError as e:
                    raise PrometheusError(f"HTTP {resp.status}: {e}" if resp.status != 200 else str(e)) from None
        except TimeoutError:
            raise PrometheusError(f"no answer within {self.cfg.timeout_s:g} s") from None
        except aiohttp.ClientError as e:
            raise PrometheusError(f"{type(e).__name__}: {e}") from None

    async def query_all(self) -> dict[str, list[Series]]:
        """Every figure's series; PrometheusError (naming the query) if any query fails."""
        async with aiohttp.ClientSession() as session:
            names = list(self.queries)
            results = await asyncio.gather(*(self._query(session, self.queries[n]) for n in names),
                                           return_exceptions=True)
        out: dict[str, list[Series]] = {}
        for name, res in zip(names, results, strict=True):
            if isinstance(res, PrometheusError):
                raise PrometheusError(f"query {self.queries[name]!r}: {res}")
            if isinstance(res, BaseException):
                raise PrometheusError(f"query {self.queries[name]!r}: unexpected {type(res).__name__}: {res}")
            out[name] = res
        return out

    def __call__(self, agents: Mapping[str, str]) -> CollectResult:
        """The cycle's collector: ``agents`` names the cluster's nodes (their agent URLs are not used)."""
        try:
            replies = asyncio.run(self.query_all())
        except PrometheusError as e:
            reason = f"prometheus {self.cfg.url}: {e}"
            return CollectResult(reports={}, errors=dict.fromkeys(agents, reason[:500]), via=self.cfg.url)
        return reports_from(self.cfg, replies, agents, self._clock())
