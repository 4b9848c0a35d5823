"""Pick and build the performance model of every job in a workload."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from slurm_elastic.sim.errors import PerfModelError, WorkloadError
from slurm_elastic.sim.perfmodel.adaptive import AdaptiveBatchJobPerf
from slurm_elastic.sim.perfmodel.appdata import load_app
from slurm_elastic.sim.perfmodel.base import JobPerf
from slurm_elastic.sim.perfmodel.parametric import ParametricJobPerf, SpeedupParams, draw_params
from slurm_elastic.sim.perfmodel.pollux import PolluxApplication, PolluxJobPerf
from slurm_elastic.sim.perfmodel.speedup_table import SPEEDUP_TABLE
from slurm_elastic.sim.traces import pollux_app_dir, traces_dir
from slurm_elastic.sim.workload import JobSpec, Workload


def build_models(
    workload: Workload,
    gpus_per_node: int,
    rng: random.Random,
    traces_root: Path | None = None,
    table: Sequence[SpeedupParams] = SPEEDUP_TABLE,
    *,
    adaptive_batch: bool = False,
) -> dict[str, JobPerf]:
    """job id -> model. Jobs with an application use its measurements (read from ``traces_root``, default
    :func:`~slurm_elastic.sim.traces.traces_dir`); the others draw parametric speedup parameters from ``rng``,
    in workload order, so a seed fixes every draw. ``adaptive_batch``: every application job opts in to
    adaptive batch size (:mod:`.adaptive`) instead of keeping its submitted global batch."""
    apps: dict[str, PolluxApplication] = {}
    models: dict[str, JobPerf] = {}
    for job in workload.jobs:
        models[job.job_id] = _model(
            job, apps, gpus_per_node=gpus_per_node, rng=rng, traces_root=traces_root, table=table,
            adaptive_batch=adaptive_batch,
        )
    return models


def _model(
    job: JobSpec,
    apps: dict[str, PolluxApplication],
    *,
    gpus_per_node: int,
    rng: random.Random,
    traces_root: Path | None,
    table: Sequence[SpeedupParams],
    adaptive_batch: bool,
) -> JobPerf:
    if job.application is not None:
        if job.batch_size is None:
            raise WorkloadError(f"job {job.job_id}: application {job.application} without a batch size")
        app = apps.get(job.application)
        if app is None:
            root = traces_root if traces_root is not None else traces_dir()
            app = PolluxApplication(load_app(pollux_app_dir(root, job.application)))
            apps[job.application] = app
        try:
            if adaptive_batch:
                return AdaptiveBatchJobPerf(app, job.batch_size)
            return PolluxJobPerf(app, job.batch_size)
        except PerfModelError as exc:
            raise WorkloadError(f"job {job.job_id}: {exc}") from exc
    if job.duration is None:
        raise WorkloadError(f"job {job.job_id}: neither an application nor a duration")
    return ParametricJobPerf(draw_params(table, rng), job.duration, job.num_gpus, gpus_per_node)
