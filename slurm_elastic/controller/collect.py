"""Collecting agent reports and merging them into one utilization figure per elastic job.

A job spans several nodes (the leader's and its extension jobs'), each reported by its own agent. The merge is
conservative on purpose, because the policy must never shrink on weak evidence:

* utilization is the GPU-weighted mean of the per-node window means; the max is the max;
* ``sample_count`` is the *smallest* per-node count and ``last_sample_at`` the *oldest* per-node time, so one
  lagging agent makes the whole job look as stale as that agent;
* ``coverage`` is the fraction of the job's nodes that reported it; a node whose agent failed or did not mention
  the job lowers it (the policy treats incomplete coverage like missing metrics).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from slurm_elastic.agent.auth import ClientAuth
from slurm_elastic.agent.client import AgentClient
from slurm_elastic.agent.errors import AgentClientError
from slurm_elastic.agent.payload import JobReport, NodeReport


@dataclass(frozen=True)
class CollectResult:
    """What one metrics source found, by node: the agents' fan-out here, or Prometheus (controller/prometheus.py).

    A source is any callable ``{node: agent URL} -> CollectResult`` (cycle.py's ``Collector``); the cycle only
    chooses one. ``via`` names the one endpoint that answered for every node (the Prometheus server), None when
    each node's agent answered itself; ``gpu_counts`` is the GPUs per node where the reports list no devices."""

    reports: Mapping[str, NodeReport]
    errors: Mapping[str, str]  # node -> one-line reason (unreachable, 401, bad payload, timeout)
    via: str | None = None
    gpu_counts: Mapping[str, int] = field(default_factory=dict)

    def url(self, node: str, agents: Mapping[str, str]) -> str:
        """Where ``node``'s metrics came from (or were asked for)."""
        return self.via or agents.get(node, "")

    def gpu_count(self, node: str) -> int:
        if node in self.gpu_counts:
            return self.gpu_counts[node]
        report = self.reports.get(node)
        return sum(1 for g in report.gpus if g.kind == "gpu") if report is not None else 0


@dataclass(frozen=True)
class MergedJobMetrics:
    job_id: int
    util_mean_percent: float | None
    util_max_percent: float | None
    gpus_allocated: int
    gpus_in_use: int
    sample_count: int
    last_sample_at: float | None
    window_covered_s: float
    coverage: float  # reporting nodes / job nodes
    nodes_missing: tuple[str, ...]


async def collect(agents: Mapping[str, str], auth: bytes | ClientAuth, timeout_s: float = 5.0) -> CollectResult:
    """Ask every agent (node -> base URL) at once; one agent's failure never fails the others. ``auth``: the
    shared key or a scheme's client side (:func:`~slurm_elastic.agent.client.client_auth`)."""
    async with AgentClient(auth, timeout_s=timeout_s) as client:
        results = await client.fetch_many(agents)
    reports: dict[str, NodeReport] = {}
    errors: dict[str, str] = {}
    for node, res in results.items():
        if isinstance(res, AgentClientError):
            errors[node] = str(res)
        else:
            reports[node] = res
    return CollectResult(reports=reports, errors=errors)


def collect_sync(agents: Mapping[str, str], auth: bytes | ClientAuth, timeout_s: float = 5.0) -> CollectResult:
    return asyncio.run(collect(agents, auth, timeout_s))


def merge_job(job_id: int, parts: Iterable[tuple[int, str]], reports: Mapping[str, NodeReport]) -> MergedJobMetrics:
    """One elastic unit's metrics over all its nodes (see the module docstring for why each rule is
    conservative). ``parts`` are (Slurm job id, node) pairs: the leader's id on its own nodes, each extension
    job's id on the extension's nodes -- agents report the Slurm job that holds the GPUs."""
    part_list = list(dict.fromkeys(parts))
    node_list = [node for _, node in part_list]
    per_node: list[JobReport] = []
    missing: list[str] = []
    for slurm_id, node in part_list:
        report = reports.get(node)
        jr = next((j for j in report.jobs if j.job_id == slurm_id), None) if report else None
        if jr is None:
            missing.append(node)
        else:
            per_node.append(jr)
    with_util = [j for j in per_node if j.util_mean_percent is not None]
    weight = sum(max(j.gpus_allocated, 1) for j in with_util)
    mean = (sum((j.util_mean_percent or 0.0) * max(j.gpus_allocated, 1) for j in with_util) / weight
            if with_util else None)
    maxima = [j.util_max_percent for j in with_util if j.util_max_percent is not None]
    return MergedJobMetrics(
        job_id=job_id,
        util_mean_percent=mean,
        util_max_percent=max(maxima) if maxima else None,
        gpus_allocated=sum(j.gpus_allocated for j in per_node),
        gpus_in_use=sum(j.gpus_in_use for j in per_node),
        sample_count=min((j.util_sample_count for j in per_node), default=0),
        last_sample_at=min((j.last_sample_at for j in per_node), default=None),
        window_covered_s=min((j.last_sample_at - j.first_sample_at for j in per_node), default=0.0),
        coverage=(len(per_node) / len(node_list)) if node_list else 0.0,
        nodes_missing=tuple(missing),
    )
