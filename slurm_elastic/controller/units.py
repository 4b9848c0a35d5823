"""From a Slurm snapshot to the policy's elastic units.

A running job is elastic when it carries a spec: the normalized ``[elastic:v1 …]`` segment that
plugins/job_submit.lua stored in its admin_comment, or, where the plugin is not installed, the ``#ELASTIC``
lines of its batch script, read once per job (the read is the caller's ``read_script`` callback: the adapter's
``scontrol write batch_script``). A job with invalid directives is not elastic; the reason is returned so that
the controller records it and ``explain`` shows it. Extension jobs are never units themselves; they are
attached to their leader only when they pass :func:`~slurm_elastic.controller.extension.trusted_extensions`.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field

from slurm_elastic.controller.extension import parse_tag, trusted_extensions
from slurm_elastic.directives.admin_comment import extract, spec_from_admin_comment
from slurm_elastic.directives.batch_script import JobDirectives, directives_for_job
from slurm_elastic.directives.spec import ElasticSpec, SpecError
from slurm_elastic.policy import ElasticUnit, ExtensionJob
from slurm_elastic.slurm.model import ClusterSnapshot, Job

SpecSource = str  # "admin_comment" | "script"


#: Distinct admin_comment specs kept parsed; past this many (hostile or very varied input) the memory starts over.
MAX_COMMENTS = 100_000
Reading = tuple[ElasticSpec | None, SpecSource | None, str | None]  # spec, where from, why not elastic


@dataclass
class SpecCache:
    """Per-job directives already read (scripts are read once per job, not once per cycle), and each distinct
    admin_comment spec parsed once (a cycle at 51k jobs parsed 11,580 specs, 0.2 s of its CPU, though few of
    them differ or change from one cycle to the next)."""

    by_job: MutableMapping[int, JobDirectives] = field(default_factory=dict)
    by_comment: dict[str, Reading] = field(default_factory=dict)


@dataclass(frozen=True)
class UnitsResult:
    units: tuple[ElasticUnit, ...]
    sources: dict[int, SpecSource]
    not_elastic: dict[int, str]  # job id -> reason (invalid directives, unreadable script, …)
    #: Elastic leaders Slurm is still starting (CONFIGURING: their powered-down nodes boot): no units yet (the
    #: policy never resizes a job that has not started), but ``jobs`` shows them.
    booting: tuple[ElasticUnit, ...] = ()


def _from_comment(comment: str) -> Reading:
    try:
        spec = spec_from_admin_comment(comment)
    except SpecError as e:
        return None, None, f"invalid elastic spec in admin_comment: {e}"
    return spec, "admin_comment", None if spec else "elasticity switched off in admin_comment"


def _spec_for(job: Job, read_script: Callable[[int], str | None], cache: SpecCache) -> Reading:
    if extract(job.admin_comment) is not None:
        reading = cache.by_comment.get(job.admin_comment)
        if reading is None:  # specs are immutable: one parsed spec serves every job and cycle that carries it
            if len(cache.by_comment) >= MAX_COMMENTS:
                cache.by_comment.clear()
            reading = cache.by_comment[job.admin_comment] = _from_comment(job.admin_comment)
        return reading
    if job.job_id not in cache.by_job:
        # For a het component the script is the leader's (Slurm keeps it on component 0).
        script_owner = job.het_job_id if job.het_job_id is not None else job.job_id
        cache.by_job[job.job_id] = directives_for_job(read_script(script_owner), job.het_job_offset)
    d = cache.by_job[job.job_id]
    if d.spec is None:
        return None, None, d.reason if d.status == "invalid" else None
    return d.spec, "script", None


def spec_for(job: Job, read_script: Callable[[int], str | None], cache: SpecCache) -> Reading:
    """A job's spec, where it came from, and why it is not elastic (None when it simply has no directives);
    the same reading the units get (moldable start reads waiting jobs' directives with it)."""
    return _spec_for(job, read_script, cache)


def build_units(
    snap: ClusterSnapshot,
    *,
    read_script: Callable[[int], str | None],
    is_known_key: Callable[[int, str], bool],
    cache: SpecCache,
) -> UnitsResult:
    candidates = [j for j in snap.jobs if j.is_running and parse_tag(j.comment) is None]
    units: list[ElasticUnit] = []
    sources: dict[int, SpecSource] = {}
    not_elastic: dict[int, str] = {}
    specs: dict[int, ElasticSpec] = {}
    for job in candidates:
        spec, source, problem = _spec_for(job, read_script, cache)
        if spec is None:
            if problem:
                not_elastic[job.job_id] = problem
            continue
        specs[job.job_id] = spec
        sources[job.job_id] = source or "script"
    leaders = {j.job_id: j for j in candidates if j.job_id in specs}
    exts = trusted_extensions(snap.jobs, leaders, is_known_key)
    for job_id, leader in sorted(leaders.items()):
        ext_jobs = tuple(
            ExtensionJob(job_id=e.job_id, state=e.state, nodes=e.nodes, node_count=e.node_count,
                         submit_time=e.submit_time, start_time=e.start_time, batch_host=e.batch_host)
            for e in sorted(exts.get(job_id, []), key=lambda e: e.job_id)
        )
        units.append(ElasticUnit(job=leader, spec=specs[job_id], extensions=ext_jobs))
    booting: list[ElasticUnit] = []
    for job in snap.jobs:
        if job.state == "CONFIGURING" and parse_tag(job.comment) is None:
            spec, source, _ = _spec_for(job, read_script, cache)
            if spec is not None:
                booting.append(ElasticUnit(job=job, spec=spec))
                sources[job.job_id] = source or "script"
    return UnitsResult(units=tuple(units), sources=sources, not_elastic=not_elastic, booting=tuple(booting))
