"""Checks every run must pass.

A violation is a bug in the engine or in a policy, never a property of a trace.
"""

from __future__ import annotations

from collections import Counter

from slurm_elastic.sim.engine import SimResult


def check_invariants(result: SimResult, expected_jobs: int) -> list[str]:
    """Problems found, empty when the run is sound:

    * every submitted job completed, exactly once;
    * GPUs held never exceed the cluster's at any instant;
    * submit <= first start <= completion for every job;
    * a job never ran above its model's GPU limit; every resize landed within the job's node bounds; a job
      that was never resized ran once, at exactly the GPUs it asked for (rigid); a molded start is on whole
      nodes, at least the job's min and fewer GPUs than it asked for;
    * the resize count of each job matches the applied resizes.
    """
    problems: list[str] = []
    if result.unfinished:
        problems.append(f"{len(result.unfinished)} job(s) never completed: {', '.join(result.unfinished[:5])}")
    if len(result.jobs) + len(result.unfinished) != expected_jobs:
        problems.append(f"{len(result.jobs)} completed + {len(result.unfinished)} unfinished != {expected_jobs} jobs")
    ids = Counter(j.job_id for j in result.jobs)
    problems.extend(f"job {job_id} completed {n} times" for job_id, n in ids.items() if n > 1)

    total = result.config.total_gpus
    edges = sorted([(u.end, -u.gpus) for u in result.usage] + [(u.start, u.gpus) for u in result.usage])
    held = peak = 0
    peak_at = 0.0
    for time, delta in edges:  # at equal times releases (negative) sort first
        held += delta
        if held > peak:
            peak, peak_at = held, time
    if peak > total:
        problems.append(f"{peak} GPUs in use at t={peak_at:g}, cluster has {total}")

    applied = Counter(o.job_id for o in result.resizes if o.result == "applied")
    for job in result.jobs:
        if not job.submit_time <= job.start_time <= job.end_time:
            problems.append(
                f"job {job.job_id}: submit {job.submit_time:g}, start {job.start_time:g}, end {job.end_time:g}"
            )
        if any(g > job.max_gpus for g in job.gpus_seen):
            problems.append(f"job {job.job_id} ran on {max(job.gpus_seen)} GPUs, model limit {job.max_gpus}")
        if any(not job.min_nodes <= n <= job.max_nodes for n in job.nodes_seen[1:]):
            problems.append(
                f"job {job.job_id} resized to {job.nodes_seen[1:]} nodes, bounds {job.min_nodes}..{job.max_nodes}"
            )
        g = result.config.gpus_per_node
        if job.molded:
            start = job.gpus_seen[0] if job.gpus_seen else 0
            if not (start % g == 0 and job.min_nodes * g <= start < job.requested_gpus):
                problems.append(f"molded job {job.job_id} started at {start} GPUs, asked {job.requested_gpus}, "
                                f"min {job.min_nodes} nodes")
        elif job.resizes == 0 and job.gpus_seen != (job.requested_gpus,):
            problems.append(f"rigid job {job.job_id} ran at {job.gpus_seen} GPUs, asked {job.requested_gpus}")
        if job.resizes != applied.get(job.job_id, 0) or len(job.gpus_seen) != job.resizes + 1:
            problems.append(f"job {job.job_id}: {job.resizes} resizes recorded, {applied.get(job.job_id, 0)} applied")
    return problems
