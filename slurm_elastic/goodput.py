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

**Adaptive batch size** (opt-in; docs/goodput.md, "Adaptive batch size"): a job that calls :func:`opt_in` with
its batch limits and publishes its gradient statistics with :func:`publish_grad_stats` (estimated by
:class:`~slurm_elastic.batchsize.GradNoiseEstimator`) reads at every (re)start the batch to use at its size
from :func:`batch_plan`: per-replica batch, accumulation steps and learning-rate factor, chosen by the model
the policy ranks it by (:mod:`slurm_elastic.batchsize`, standard library only like this file). Those lines go
to ``<working dir>/.slurm-elastic/gradstats-<job id>.jsonl`` (``SLURM_ELASTIC_GRADSTATS_FILE`` overrides it).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from slurm_elastic.batchsize import (
    LR_RULES,
    AdaptiveState,
    BatchLimits,
    BatchModelError,
    GradStats,
    LinearStepModel,
    choose_plan,
    lr_factor,
    read_state,
)

__all__ = ["AdaptiveBatch", "AdaptiveState", "batch_plan", "opt_in", "plan_for", "publish", "publish_grad_stats",
           "read_state"]

ENV_FILE = "SLURM_ELASTIC_GOODPUT_FILE"
ENV_GRADSTATS_FILE = "SLURM_ELASTIC_GRADSTATS_FILE"
DIR_NAME = ".slurm-elastic"
_TAIL_BYTES = 65536  # batch_plan reads at most the file's last 64 KiB


def goodput_path(work_dir: str, job_id: int | str) -> str:
    """The file the controller reads for job ``job_id`` (the leader's, or a het component's, raw id)."""
    return os.path.join(work_dir, DIR_NAME, f"goodput-{job_id}.jsonl")


def job_file(env_var: str, path_for: Callable[[str, str], str]) -> str | None:
    """The path in ``env_var``, else ``path_for(current directory, leader's job id)``; None outside Slurm.
    Shared by the files a job publishes (goodput, gradient statistics, serving load)."""
    override = os.environ.get(env_var)
    if override:
        return override
    job_id = os.environ.get("SLURM_ELASTIC_PARENT") or os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    return path_for(os.getcwd(), job_id)


def append_line(target: str, line: str) -> bool:
    """Append one short line to ``target`` (created 0644, never through a symlink); False on any OSError."""
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


def default_path() -> str | None:
    """``SLURM_ELASTIC_GOODPUT_FILE``, else the documented path under the current directory; None outside Slurm."""
    return job_file(ENV_FILE, goodput_path)


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
    return append_line(target, line)


# --- adaptive batch size ----------------------------------------------------------------------------------------
def gradstats_path(work_dir: str, job_id: int | str) -> str:
    """The adaptive-batch file of job ``job_id`` (the leader's raw id), beside its goodput file."""
    return os.path.join(work_dir, DIR_NAME, f"gradstats-{job_id}.jsonl")


def default_gradstats_path() -> str | None:
    """``SLURM_ELASTIC_GRADSTATS_FILE``, else the documented path under the current directory; None outside Slurm."""
    return job_file(ENV_GRADSTATS_FILE, gradstats_path)


def _append(record: Mapping[str, Any], path: str | None) -> bool:
    target = path or default_gradstats_path()
    if target is None:
        return False
    return append_line(target, json.dumps(record, separators=(",", ":")) + "\n")


def opt_in(*, init_batch: int, max_batch: int, max_local_batch: int, min_local_batch: int = 1,
           lr_rule: str = "sqrt", at: float | None = None, path: str | None = None) -> bool:
    """Let slurm-elastic choose this job's batch size for its size. ``init_batch``: the global batch the
    hyper-parameters were tuned at (never goes below it); ``max_batch``: the largest global batch allowed;
    ``max_local_batch``: the most samples one GPU fits in memory (per micro-step); ``lr_rule``: ``sqrt`` or
    ``adascale``. Invalid limits raise ValueError (a programming error); False when nothing could be written."""
    limits = BatchLimits(init_batch, max_batch, max_local_batch, min_local_batch)
    if lr_rule not in LR_RULES:
        raise BatchModelError(f"lr_rule must be one of {', '.join(LR_RULES)}, not {lr_rule!r}")
    record = {"time": round(time.time() if at is None else at, 3),
              "opt_in": {"init_batch": limits.init_batch, "max_batch": limits.max_batch,
                         "max_local_batch": limits.max_local_batch, "min_local_batch": limits.min_local_batch,
                         "lr_rule": lr_rule}}
    return _append(record, path)


def publish_grad_stats(stats: GradStats, *, nodes: int, gpus_per_node: int, local_batch: int, accum_steps: int,
                       compute_s: float, step_s: float, at: float | None = None, path: str | None = None) -> bool:
    """Publish the smoothed gradient statistics and how long one optimizer step took at the plan the job runs:
    ``compute_s`` = seconds one replica computed (forward/backward of all its micro-steps), ``step_s`` = the whole
    optimizer step (with the all-reduce). From rank 0, every few seconds to minutes; False instead of raising."""
    values = (stats.grad_sqr, stats.grad_var, compute_s, step_s)
    if not all(math.isfinite(v) for v in values) or compute_s <= 0 or step_s < compute_s:
        return False
    if nodes < 1 or gpus_per_node < 1 or local_batch < 1 or accum_steps < 0:
        raise BatchModelError("nodes, gpus_per_node and local_batch must be >= 1, accum_steps >= 0")
    record = {"time": round(time.time() if at is None else at, 3), "grad_sqr": stats.grad_sqr,
              "grad_var": stats.grad_var, "init_batch": stats.init_batch, "nodes": nodes,
              "gpus_per_node": gpus_per_node, "local_batch": local_batch, "accum_steps": accum_steps,
              "compute_s": compute_s, "step_s": step_s}
    return _append(record, path)


@dataclass(frozen=True)
class AdaptiveBatch:
    """What a job runs at its size: per-replica micro-batch, extra accumulation steps, the global batch and the
    learning-rate factor (against the lr tuned at ``init_batch``), and why."""

    local_batch: int
    accum_steps: int
    global_batch: int
    lr_factor: float
    efficiency: float
    goodput: float  # model samples/s x efficiency (0 without a step-time fit)
    basis: str  # "goodput": statistics and step times known; "initial batch": not yet, init_batch kept


def plan_for(state: AdaptiveState, nodes: int, gpus_per_node: int) -> AdaptiveBatch | None:
    """The batch to run on ``nodes`` x ``gpus_per_node`` GPUs (None: no plan fits the limits there)."""
    replicas = nodes * gpus_per_node
    if state.stats is not None and state.step_model is not None:
        plan = choose_plan(replicas, state.stats, state.limits, state.step_model)
        basis = "goodput"
    else:  # nothing measured yet: the smallest batch at or above init_batch (all samples equally efficient)
        plan = choose_plan(replicas, None, state.limits, LinearStepModel(1.0, 0.0, gpus_per_node))
        basis = "initial batch"
    if plan is None:
        return None
    factor = lr_factor(state.lr_rule, plan.global_batch, state.stats, state.limits.init_batch)
    goodput = plan.goodput if basis == "goodput" else 0.0
    return AdaptiveBatch(plan.local_batch, plan.accum_steps, plan.global_batch, factor, plan.efficiency, goodput,
                         basis)


def parse_records(data: bytes) -> list[dict[str, Any]]:
    """JSON objects of the complete lines in ``data`` (a first partial line, from reading a tail, is dropped)."""
    out: list[dict[str, Any]] = []
    for raw in data.split(b"\n")[:-1]:
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def batch_plan(nodes: int | None = None, gpus_per_node: int | None = None, *,
               path: str | None = None) -> AdaptiveBatch | None:
    """The batch this job should run at its current size, read at every (re)start. ``nodes``/``gpus_per_node``
    default to torchrun's (``WORLD_SIZE / LOCAL_WORLD_SIZE``, ``LOCAL_WORLD_SIZE``). None when the job has not
    opted in, the file can not be read, or no plan fits (then keep your own batch)."""
    if gpus_per_node is None:
        try:
            gpus_per_node = int(os.environ["LOCAL_WORLD_SIZE"])
        except (KeyError, ValueError):
            gpus_per_node = 1
    nodes = nodes if nodes is not None else nodes_from_env() or 1
    if nodes < 1 or gpus_per_node < 1:
        raise BatchModelError("nodes and gpus_per_node must be >= 1")
    target = path or default_gradstats_path()
    if target is None:
        return None
    try:
        with open(target, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - _TAIL_BYTES))
            data = handle.read()
    except OSError:
        return None
    records = parse_records(data if size <= _TAIL_BYTES else data[data.find(b"\n") + 1:])
    state = read_state(records, gpus_per_node)
    return plan_for(state, nodes, gpus_per_node) if state is not None else None
