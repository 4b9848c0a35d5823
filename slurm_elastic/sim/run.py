"""One comparison run: the rigid baseline and, when a policy is given, the elastic mode on the same models."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.elastic import ElasticPolicy
from slurm_elastic.sim.engine import SimResult, Simulation
from slurm_elastic.sim.errors import InvariantViolation
from slurm_elastic.sim.invariants import check_invariants
from slurm_elastic.sim.perfmodel.base import JobPerf
from slurm_elastic.sim.perfmodel.factory import build_models
from slurm_elastic.sim.workload import Workload

ProgressFactory = Callable[[str, int], Callable[[int, int], None] | None]


@dataclass(frozen=True)
class Comparison:
    baseline: SimResult
    elastic: SimResult | None


def simulate_one(
    workload: Workload,
    config: SimConfig,
    models: dict[str, JobPerf],
    *,
    policy: ElasticPolicy | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Run once and check the invariants; a violation raises :class:`InvariantViolation`."""
    result = Simulation(config, workload.jobs, models, policy=policy, on_progress=on_progress).run()
    problems = check_invariants(result, len(workload.jobs))
    if problems:
        raise InvariantViolation(problems)
    return result


def compare(
    workload: Workload,
    config: SimConfig,
    seed: int,
    *,
    policy: ElasticPolicy | None = None,
    traces_root: Path | None = None,
    progress: ProgressFactory | None = None,
) -> Comparison:
    """Baseline (no policy) and elastic (same scheduler plus ``policy``) on the same seeded models."""
    models = build_models(workload, config.gpus_per_node, random.Random(seed), traces_root)
    total = len(workload.jobs)
    baseline_bar = progress("baseline", total) if progress else None
    baseline = simulate_one(workload, config, models, on_progress=baseline_bar)
    elastic = None
    if policy is not None:
        elastic_bar = progress("elastic", total) if progress else None
        elastic = simulate_one(workload, config, models, policy=policy, on_progress=elastic_bar)
    return Comparison(baseline=baseline, elastic=elastic)
