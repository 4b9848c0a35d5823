"""Pollux artifact workload CSV: ``name,time,application,num_replicas,batch_size``."""

from __future__ import annotations

from slurm_elastic.sim.errors import TraceFormatError
from slurm_elastic.sim.loaders.common import csv_rows, integer, number, open_text
from slurm_elastic.sim.perfmodel.pollux import APP_EPOCHS
from slurm_elastic.sim.workload import JobSpec, Workload

COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


def load_pollux(path: str) -> Workload:
    """One job per row: submitted at ``time``, asking ``num_replicas`` GPUs at global ``batch_size``."""
    jobs: list[JobSpec] = []
    seen: dict[str, int] = {}
    with open_text(path) as handle:
        for line, row in csv_rows(path, handle, COLUMNS):
            name = row["name"].strip()
            if not name:
                raise TraceFormatError(path, line, "empty job name")
            if name in seen:
                raise TraceFormatError(path, line, f"job name {name!r} already used on line {seen[name]}")
            seen[name] = line
            app = row["application"].strip()
            if app not in APP_EPOCHS:
                raise TraceFormatError(path, line, f"application={app!r} is not one of {', '.join(sorted(APP_EPOCHS))}")
            jobs.append(
                JobSpec(
                    job_id=name,
                    submit_time=number(path, line, row, "time"),
                    num_gpus=integer(path, line, row, "num_replicas", minimum=1),
                    application=app,
                    batch_size=integer(path, line, row, "batch_size", minimum=1),
                    line=line,
                )
            )
    return Workload(source=path, jobs=tuple(jobs))
