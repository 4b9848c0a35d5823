"""Publish a serving job's load and latency for the controller's serving rules (docs/serving.md).

Standard library only, and importing it has no side effect, like :mod:`slurm_elastic.goodput`: a router can use
it when nothing but this file's package is on ``PYTHONPATH``::

    from slurm_elastic.serving import publish
    publish(412.0, p50_ms=8.1, p99_ms=31.5, queue_depth=3, replicas=2)

Each call appends one JSON line ``{"time": <unix s>, "requests_per_s": x[, "p50_ms", "p99_ms", "queue_depth",
"replicas"]}`` (fields given as None are left out) to ``<working dir>/.slurm-elastic/serving-<job id>.jsonl``:
the job's working directory (an extension job runs in its leader's) and the *leader's* job id
(``SLURM_ELASTIC_PARENT`` in an extension job, else ``SLURM_JOB_ID``). ``SLURM_ELASTIC_SERVING_FILE``
overrides the whole path. The controller reads the file as the job's owner wrote it: a regular file owned by the
job's user (no symlink).

Latencies are those of the requests answered since the previous report (the router publishes every few
seconds); ``queue_depth`` is the requests waiting or in flight at the time of the report; ``replicas`` the
replicas taking requests. Publishing never raises on I/O errors (metrics must not kill the service): it returns
False instead. Values that make no sense (negative, not finite) raise ValueError: they are the caller's bug.
"""

from __future__ import annotations

import json
import math
import os
import time

from slurm_elastic.goodput import DIR_NAME, append_line, job_file

ENV_FILE = "SLURM_ELASTIC_SERVING_FILE"


def serving_path(work_dir: str, job_id: int | str) -> str:
    """The file the controller reads for serving job ``job_id`` (the leader's raw id)."""
    return os.path.join(work_dir, DIR_NAME, f"serving-{job_id}.jsonl")


def default_path() -> str | None:
    """``SLURM_ELASTIC_SERVING_FILE``, else the documented path under the current directory; None outside Slurm."""
    return job_file(ENV_FILE, serving_path)


def _non_negative(name: str, value: float) -> float:
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be finite and >= 0, not {value!r}")
    return v


def _count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, not {value!r}")
    return value


def report_line(requests_per_s: float, *, p50_ms: float | None = None, p99_ms: float | None = None,
                queue_depth: int | None = None, replicas: int | None = None, at: float | None = None) -> str:
    """The JSON line :func:`publish` appends."""
    record: dict[str, float | int] = {"time": round(time.time() if at is None else at, 3),
                                      "requests_per_s": _non_negative("requests_per_s", requests_per_s)}
    if p50_ms is not None:
        record["p50_ms"] = _non_negative("p50_ms", p50_ms)
    if p99_ms is not None:
        record["p99_ms"] = _non_negative("p99_ms", p99_ms)
    if p50_ms is not None and p99_ms is not None and record["p99_ms"] < record["p50_ms"]:
        raise ValueError(f"p99_ms ({p99_ms}) < p50_ms ({p50_ms})")
    if queue_depth is not None:
        record["queue_depth"] = _count("queue_depth", queue_depth, 0)
    if replicas is not None:
        record["replicas"] = _count("replicas", replicas, 0)
    return json.dumps(record, separators=(",", ":")) + "\n"


def publish(requests_per_s: float, *, p50_ms: float | None = None, p99_ms: float | None = None,
            queue_depth: int | None = None, replicas: int | None = None, at: float | None = None,
            path: str | None = None) -> bool:
    """Append one report. Call it from one process per job (the router), every few seconds.

    Returns True when the line was written; False when there is nowhere to write (not in a Slurm job and no
    ``SLURM_ELASTIC_SERVING_FILE``) or the write failed.
    """
    line = report_line(requests_per_s, p50_ms=p50_ms, p99_ms=p99_ms, queue_depth=queue_depth,
                       replicas=replicas, at=at)
    target = path or default_path()
    if target is None:
        return False
    return append_line(target, line)
