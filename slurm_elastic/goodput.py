"""Publish a training job's throughput for the controller's goodput rules (docs/goodput.md).

Standard library only, and importing it has no side effect, so a training script can use it when nothing but
this file's package is on ``PYTHONPATH``::

    from slurm_elastic.goodput import publish
    publish(samples_per_s=1234.5)                      # or: publish(steps_per_s=2.1, global_batch=512)

Each call appends one JSON line ``{"time": <unix s>, "samples_per_s": x[, "nodes": n]}`` to
``<working dir>/.slurm-elastic/goodput-<job id>.jsonl``: the job's working directory (where Slurm starts the
batch script, ``--chdir``, the submit directory by default; extension jobs run in their leader's) and the
*leader's* job id (``SLURM_ELASTIC_PARENT`` in an extension job, else ``SLURM_JOB_ID``).
``SLURM_ELASTIC_GOODPUT_FILE`` overrides the whole path (the templates set it at the top of the batch script,
where ``$PWD`` is still the working directory). The controller reads the file as the job's owner wrote it: it
must be a regular file owned by the job's user (no symlink).

``nodes`` is the size the job ran at when it measured (torchrun: ``WORLD_SIZE // LOCAL_WORLD_SIZE``, which
:func:`nodes_from_env` reads); without it the controller attributes the report to the job's size at that time.
Publishing never raises on I/O errors (metrics must not kill training): it returns False instead.
"""

from __future__ import annotations

import json
import math
import os
import time

ENV_FILE = "SLURM_ELASTIC_GOODPUT_FILE"
DIR_NAME = ".slurm-elastic"


def goodput_path(work_dir: str, job_id: int | str) -> str:
    """The file the controller reads for job ``job_id`` (the leader's, or a het component's, raw id)."""
    return os.path.join(work_dir, DIR_NAME, f"goodput-{job_id}.jsonl")


def default_path() -> str | None:
    """``SLURM_ELASTIC_GOODPUT_FILE``, else the documented path under the current directory; None outside Slurm."""
    override = os.environ.get(ENV_FILE)
    if override:
        return override
    job_id = os.environ.get("SLURM_ELASTIC_PARENT") or os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    return goodput_path(os.getcwd(), job_id)


def nodes_from_env() -> int | None:
    """The job's current size in nodes as torchrun tells its workers (WORLD_SIZE / LOCAL_WORLD_SIZE)."""
    try:
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    if world <= 0 or local <= 0 or world % local:
        return None
    return world // local


def report_line(*, samples_per_s: float | None = None, steps_per_s: float | None = None,
                global_batch: int | None = None, nodes: int | None = None, at: float | None = None) -> str | None:
    """The JSON line :func:`publish` appends, or None when the value is not finite and positive."""
    if (samples_per_s is None) == (steps_per_s is None):
        raise ValueError("give samples_per_s, or steps_per_s with global_batch")
    if steps_per_s is not None and global_batch is None:
        raise ValueError("steps_per_s needs global_batch")
    record: dict[str, float | int] = {"time": round(time.time() if at is None else at, 3)}
    if samples_per_s is not None:
        value = float(samples_per_s)
        record["samples_per_s"] = value
    else:
        assert steps_per_s is not None and global_batch is not None
        value = float(steps_per_s) * float(global_batch)
        record["steps_per_s"] = float(steps_per_s)
        record["global_batch"] = int(global_batch)
    if not math.isfinite(value) or value <= 0:
        return None
    if nodes is not None:
        if int(nodes) < 1:
            raise ValueError("nodes must be >= 1")
        record["nodes"] = int(nodes)
    return json.dumps(record, separators=(",", ":")) + "\n"


def publish(samples_per_s: float | None = None, *, steps_per_s: float | None = None,
            global_batch: int | None = None, nodes: int | None = None, at: float | None = None,
            path: str | None = None) -> bool:
    """Append one report. Call it from one process per job (e.g. rank 0), every few seconds to minutes.

    Returns True when the line was written; False when there is nowhere to write (not in a Slurm job and no
    ``SLURM_ELASTIC_GOODPUT_FILE``), the value is not finite and positive, or the write failed.
    """
    line = report_line(samples_per_s=samples_per_s, steps_per_s=steps_per_s, global_batch=global_batch,
                       nodes=nodes, at=at)
    target = path or default_path()
    if line is None or target is None:
        return False
    try:
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line.encode())  # one write of a short line: appends never interleave mid-line
        finally:
            os.close(fd)
    except OSError:
        return False
    return True
