"""Concise builders of policy inputs for the policy tests (not a test module). No I/O; a fixed NOW."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from slurm_elastic.directives.spec import ElasticSpec
from slurm_elastic.policy import (
    Action,
    ElasticUnit,
    ExtensionJob,
    JobUtilization,
    Outcome,
    PolicyConfig,
    PolicyInput,
    ResizeRecord,
    ThroughputSample,
    config_from_mapping,
)
from slurm_elastic.slurm.model import ClusterSnapshot, GresCount, Job, Node, Partition

NOW = datetime(2025, 6, 2, 12, 0, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def gpu(count: int, gtype: str | None = None) -> tuple[GresCount, ...]:
    return (GresCount("gpu", gtype, count),) if count else ()


def node(
    name: str,
    *,
    gpus: int = 4,
    used: int = 0,
    state: str | None = None,
    partitions: tuple[str, ...] = ("gpu",),
    flags: tuple[str, ...] = (),
    gpu_type: str | None = None,
) -> Node:
    if state is None:
        state = "IDLE" if used == 0 else ("ALLOCATED" if used >= gpus else "MIXED")
    return Node(
        name=name, state=state, state_flags=flags, partitions=partitions, cpus=64, alloc_cpus=0,
        gres=gpu(gpus, gpu_type), gres_used=gpu(used, gpu_type),
    )


def nodes(count: int, *, busy: Iterable[str] = (), prefix: str = "n", **kw: Any) -> list[Node]:
    """``n1..nCOUNT``; the names in ``busy`` have all their GPUs allocated."""
    busy_set = set(busy)
    gpus = kw.pop("gpus", 4)
    return [
        node(f"{prefix}{i}", gpus=gpus, used=gpus if f"{prefix}{i}" in busy_set else 0, **kw)
        for i in range(1, count + 1)
    ]


def job(
    job_id: int,
    *,
    nodes: tuple[str, ...] = ("n1",),
    state: str = "RUNNING",
    partition: str = "gpu",
    priority: int = 1000,
    gpus: int = 4,
    gpu_type: str | None = None,
    account: str | None = "acct",
    qos: str | None = "normal",
    user: str = "alice",
    started_ago: float | None = 3600,
    time_limit_min: int | None = None,
    batch_host: str | None = None,
    node_count: int | None = None,
    reason: str | None = None,
    het_job_id: int | None = None,
    het_job_offset: int | None = None,
) -> Job:
    running = state == "RUNNING"
    return Job(
        job_id=job_id, name=f"job{job_id}", user=user, account=account, partition=partition, qos=qos,
        priority=priority, state=state, state_reason=reason, nodes=nodes if running else (),
        batch_host=(batch_host or (nodes[0] if nodes else None)) if running else None,
        node_count=node_count if node_count is not None else len(nodes),
        tres_per_node=f"gres:gpu:{gpus}" if gpus else None, gres_per_node=gpu(gpus, gpu_type),
        time_limit_min=time_limit_min, submit_time=ago(7200),
        start_time=ago(started_ago) if running and started_ago is not None else None, end_time=None,
        comment="", admin_comment="", het_job_id=het_job_id, het_job_offset=het_job_offset,
    )


def pending(
    job_id: int,
    *,
    count: int = 1,
    gpus: int = 4,
    priority: int = 2000,
    partition: str = "gpu",
    reason: str | None = "Resources",
    **kw: Any,
) -> Job:
    return job(job_id, nodes=(), state="PENDING", node_count=count, gpus=gpus, priority=priority,
               partition=partition, reason=reason, **kw)


def spec(**kw: Any) -> ElasticSpec:
    """An ElasticSpec whose given fields count as set by directives (None: not set)."""
    given = {k: v for k, v in kw.items() if v is not None}
    return ElasticSpec(explicit=frozenset(k for k in given if k != "het_group"), **given)


def ext(
    job_id: int,
    ext_nodes: tuple[str, ...],
    *,
    started_ago: float | None = 1800,
    state: str = "RUNNING",
    count: int | None = None,
) -> ExtensionJob:
    running = state == "RUNNING"
    return ExtensionJob(
        job_id=job_id, state=state, nodes=ext_nodes, node_count=count if count is not None else len(ext_nodes),
        submit_time=ago(started_ago + 5) if started_ago is not None else None,
        start_time=ago(started_ago) if running and started_ago is not None else None,
        batch_host=ext_nodes[0] if running and ext_nodes else None,
    )


def unit(
    the_job: Job,
    *,
    exts: Iterable[ExtensionJob] = (),
    submitted: int | None = None,
    **spec_kw: Any,
) -> ElasticUnit:
    spec_kw.setdefault("min_nodes", 1)
    spec_kw.setdefault("max_nodes", 4)
    return ElasticUnit(job=the_job, spec=spec(**spec_kw), extensions=tuple(exts), submitted_nodes=submitted)


def util(
    unit_id: int,
    mean: float | None,
    *,
    peak: float | None = None,
    window: float = 600,
    samples: int = 120,
    age: float | None = 10,
    throughput: Iterable[ThroughputSample] = (),
    restart: float | None = None,
    gpus: int = 4,
) -> JobUtilization:
    return JobUtilization(
        unit_id=unit_id, mean_util=mean, max_util=peak if peak is not None else mean, window_s=window,
        samples=samples, last_sample_at=ago(age) if age is not None else None, gpus_allocated=gpus,
        gpus_in_use=gpus, throughput=tuple(throughput), restart_s=restart,
    )


def tput(nodes_at: int, value: float, *, count: int = 5, age: float = 10) -> list[ThroughputSample]:
    """``count`` throughput samples of ``value`` at ``nodes_at`` nodes, the newest ``age`` seconds old."""
    return [ThroughputSample(ago(age + 30 * i), nodes_at, value) for i in range(count)]


def record(
    unit_id: int,
    seconds_ago: float,
    action: Action = Action.GROW,
    *,
    from_nodes: int = 1,
    to_nodes: int = 2,
    outcome: Outcome = Outcome.APPLIED,
    reason: str = "OVERUTILIZED",
    for_job: int | None = None,
) -> ResizeRecord:
    return ResizeRecord(ago(seconds_ago), unit_id, action, from_nodes, to_nodes, outcome, reason, for_job)


def snapshot(jobs: Iterable[Job], all_nodes: Iterable[Node]) -> ClusterSnapshot:
    node_list = tuple(all_nodes)
    parts = sorted({p for n in node_list for p in n.partitions})
    partitions = tuple(
        Partition(p, tuple(n.name for n in node_list if p in n.partitions)) for p in parts
    )
    return ClusterSnapshot(taken_at=NOW, jobs=tuple(jobs), nodes=node_list, partitions=partitions)


def make_input(
    units: Iterable[ElasticUnit],
    all_nodes: Iterable[Node],
    *,
    pending_jobs: Iterable[Job] = (),
    other_jobs: Iterable[Job] = (),
    utils: Iterable[JobUtilization] = (),
    history: Iterable[ResizeRecord] = (),
    shares: Mapping[str, float] | None = None,
) -> PolicyInput:
    unit_list = tuple(units)
    jobs = [u.job for u in unit_list] + list(other_jobs) + list(pending_jobs)
    return PolicyInput(
        snapshot=snapshot(jobs, all_nodes),
        units=unit_list,
        utilization={u.unit_id: u for u in utils},
        history=tuple(history),
        account_shares=dict(shares or {}),
    )


#: What the rule tests were written against, set explicitly so that a change of the packaged defaults does not
#: change what they test: the 40..80 band, no shrink-to-admit, no moldable start (tests of a rule switch it on).
RULE_TEST_BASE: dict[str, Any] = {"scale_up_above": 80, "scale_down_below": 40, "shrink_to_admit": False,
                                   "moldable_start": False}


def cfg(**values: Any) -> PolicyConfig:
    """A config with the given global values over :data:`RULE_TEST_BASE`; ``partition=``/``account=``/``qos=``/
    ``profile=`` tables pass through."""
    return config_from_mapping({"version": 1, **RULE_TEST_BASE, **values}, source="<test>")
