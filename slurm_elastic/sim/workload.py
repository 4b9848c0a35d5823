"""What a trace says about each job, independent of the trace's format."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class JobSpec:
    """One job as submitted.

    ``num_gpus`` is the size the user asked for: a rigid job runs at exactly this size. Traces with an
    application (Pollux) set ``application`` and ``batch_size``; the others set ``duration``, the runtime the
    trace measured at ``num_gpus``.
    """

    job_id: str
    submit_time: float  # seconds on the trace's own clock
    num_gpus: int
    application: str | None = None
    batch_size: int | None = None
    duration: float | None = None
    num_nodes: int | None = None  # nodes the job asked for, where the trace says (sacct NNodes)
    time_limit: float | None = None  # the user's time limit in seconds, where the trace has one
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    min_nodes: int | None = None  # elastic bounds; None = engine default
    max_nodes: int | None = None
    line: int | None = None  # where the job came from in its file, for messages


@dataclass(frozen=True)
class Workload:
    """Jobs in submission order, plus what the loader left out and why (reason -> count)."""

    source: str
    jobs: tuple[JobSpec, ...]
    skipped: Mapping[str, int] = field(default_factory=dict)
