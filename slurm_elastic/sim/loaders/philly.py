"""Microsoft Philly trace (``philly.csv``): ``timestamp,duration,num_gpus,gpu_time,cluster``.

``PATH#CLUSTER`` keeps one virtual cluster's jobs (e.g. ``philly.csv#6214e9``). Submission times become
seconds after the earliest kept job; ``duration`` is the job's measured runtime at ``num_gpus``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from slurm_elastic.sim.errors import TraceFormatError
from slurm_elastic.sim.loaders.common import csv_rows, integer, number, open_text, split_selector
from slurm_elastic.sim.workload import JobSpec, Workload

COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def load_philly(workload: str) -> Workload:
    path, cluster = split_selector(workload)
    raw: list[tuple[int, float, float, int, str]] = []
    clusters: set[str] = set()
    with open_text(path) as handle:
        for line, row in csv_rows(path, handle, COLUMNS):
            name = row["cluster"].strip()
            clusters.add(name)
            stamp = row["timestamp"].strip()
            try:
                # Read as UTC: the trace has no zone, and the host's zone (DST) must not change durations.
                submitted = datetime.strptime(stamp, _TIME_FORMAT).replace(tzinfo=UTC).timestamp()
            except ValueError:
                raise TraceFormatError(path, line, f"timestamp={stamp!r} is not YYYY-MM-DD HH:MM:SS") from None
            duration = number(path, line, row, "duration")
            if duration <= 0:
                raise TraceFormatError(path, line, f"duration={row['duration']!r} must be > 0")
            gpus = integer(path, line, row, "num_gpus", minimum=1)
            if cluster is None or name == cluster:
                raw.append((line, submitted, duration, gpus, name))
    if not raw:
        known = ", ".join(sorted(clusters)) or "none"
        raise TraceFormatError(path, None, f"no jobs for cluster {cluster!r} (clusters: {known})")
    origin = min(r[1] for r in raw)
    jobs = tuple(
        JobSpec(
            job_id=f"philly-{line}",
            submit_time=submitted - origin,
            num_gpus=gpus,
            duration=duration,
            partition=name,
            line=line,
        )
        for line, submitted, duration, gpus, name in raw
    )
    return Workload(source=workload, jobs=jobs)
