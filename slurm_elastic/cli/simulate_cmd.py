"""``slurm-elastic simulate``: replay a trace on a simulated cluster, rigid baseline against elastic mode.

Contract (external checks rely on it)::

    slurm-elastic simulate WORKLOAD --format pollux|philly|itp|sacct --nodes N --gpus-per-node G
        [--policy FILE] [--seed S] [--json] [--plot DIR] [--scheduler fifo|backfill]

``--json`` prints one object ``{"baseline": {...}, "elastic": {...} | null, "per_job": {...} | null}``; each side
holds avg_jct, p50_jct, p99_jct, jct_std, makespan, avg_wait, gpu_util, starvation, resizes, jobs (plus
effective_gpu_util); ``per_job`` compares each job's elastic JCT with its rigid one (sim/metrics.py, Slowdown).
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.elastic import ElasticPolicy
from slurm_elastic.sim.loaders import FORMATS, load_workload
from slurm_elastic.sim.metrics import DEFAULT_STARVATION_THRESHOLD, Metrics, slowdown, summarize
from slurm_elastic.sim.run import compare
from slurm_elastic.sim.scheduler import SCHEDULERS

ELASTIC_UNAVAILABLE = "elastic mode needs slurm_elastic.sim.policy_adapter and slurm_elastic.policy (not installed)"
# The adapter from the simulator's hook to the production policy; it provides
# ``make_policy(policy_file: Path | None, config: SimConfig) -> ElasticPolicy``.
_ADAPTER_MODULE = "slurm_elastic.sim.policy_adapter"
_ROWS: tuple[tuple[str, str, str], ...] = (
    ("jobs", "jobs", "{:.0f}"),
    ("avg_jct", "avg JCT (s)", "{:.0f}"),
    ("p50_jct", "p50 JCT (s)", "{:.0f}"),
    ("p99_jct", "p99 JCT (s)", "{:.0f}"),
    ("jct_std", "JCT std (s)", "{:.0f}"),
    ("makespan", "makespan (s)", "{:.0f}"),
    ("avg_wait", "avg queue wait (s)", "{:.0f}"),
    ("gpu_util", "GPU util, allocated", "{:.1%}"),
    ("effective_gpu_util", "GPU util, effective", "{:.1%}"),
    ("starvation", "starved jobs", "{:.0f}"),
    ("resizes", "resizes per job", "{:.2f}"),
    ("partial_free_gpus", "GPUs free, part nodes", "{:.2f}"),
    ("stranded_gpus", "GPUs stranded", "{:.2f}"),
)


def _load_policy(policy_file: Path | None, config: SimConfig) -> ElasticPolicy | None:
    """The elastic policy, or None while the production policy (or its adapter) does not exist yet."""
    try:
        adapter = importlib.import_module(_ADAPTER_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name in (_ADAPTER_MODULE, "slurm_elastic.policy"):
            return None
        raise
    policy: ElasticPolicy = adapter.make_policy(policy_file, config)
    return policy


def _progress_factory(enabled: bool) -> Callable[[str, int], Callable[[int, int], None] | None] | None:
    if not enabled:
        return None
    from tqdm import tqdm

    def factory(label: str, total: int) -> Callable[[int, int], None]:
        bar = tqdm(total=total, desc=label, unit="job", file=sys.stderr, leave=False)

        def update(done: int, _total: int) -> None:
            bar.update(done - bar.n)
            if done >= _total:
                bar.close()

        return update

    return factory


def _table(baseline: Metrics, elastic: Metrics | None) -> str:
    lines = [f"{'':<22}{'baseline':>14}{'elastic':>14}"]
    for key, label, fmt in _ROWS:
        left = fmt.format(getattr(baseline, key))
        right = fmt.format(getattr(elastic, key)) if elastic is not None else "-"
        lines.append(f"{label:<22}{left:>14}{right:>14}")
    return "\n".join(lines)


@click.command("simulate")
@click.argument("workload")
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True, help="Trace format of WORKLOAD.")
@click.option("--nodes", type=click.IntRange(min=1), required=True, help="Nodes in the simulated cluster.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), required=True, help="GPUs per node.")
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Policy configuration for the elastic mode.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the parametric speedup draws.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path), help="Write PNG plots here.")
@click.option(
    "--scheduler",
    type=click.Choice(SCHEDULERS),
    default="backfill",
    show_default=True,
    help="Base scheduler: strict FIFO, FIFO with greedy backfill (the Pollux artifact's), or EASY backfill.",
)
@click.option(
    "--placement",
    type=click.Choice(["spread", "pack"]),
    default="spread",
    show_default=True,
    help="GPU placement: most-free node first (the artifact's) or best fit (Slurm-like).",
)
@click.option("--interval", type=click.FloatRange(min=1), default=60.0, show_default=True, help="Cycle (s).")
@click.option("--resize-cost", type=click.FloatRange(min=0), default=60.0, show_default=True, help="Lost s/resize.")
@click.option(
    "--walltime-factor",
    type=click.FloatRange(min=0.01),
    default=1.0,
    show_default=True,
    help="Time limit backfill trusts = factor x modelled runtime (traces without limits).",
)
@click.option(
    "--starvation-threshold",
    type=click.FloatRange(min=0),
    default=DEFAULT_STARVATION_THRESHOLD,
    show_default=True,
    help="A job waiting longer than this (s) counts as starved.",
)
@click.option(
    "--moldable-start",
    is_flag=True,
    help="Elastic mode: a waiting job the base scheduler does not start begins on the free whole nodes (>= its min).",
)
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr (default: on a TTY).")
def simulate_cmd(  # noqa: PLR0917 - click passes every option by keyword
    workload: str,
    fmt: str,
    nodes: int,
    gpus_per_node: int,
    policy_file: Path | None,
    seed: int,
    as_json: bool,
    plot_dir: Path | None,
    scheduler: str,
    placement: str,
    interval: float,
    resize_cost: float,
    walltime_factor: float,
    starvation_threshold: float,
    moldable_start: bool,
    progress: bool | None,
) -> None:
    """Replay WORKLOAD on NODES x GPUS-PER-NODE GPUs: rigid baseline vs elastic mode.

    WORKLOAD is a file, or FILE#SELECTOR: an archive member for itp (raw-traces.tar.gz#cluster04), a virtual
    cluster for philly (philly.csv#6214e9).
    """
    try:
        config = SimConfig(
            num_nodes=nodes,
            gpus_per_node=gpus_per_node,
            scheduler=scheduler,  # type: ignore[arg-type]  # click.Choice guarantees the literal
            placement=placement,  # type: ignore[arg-type]
            interval=interval,
            resize_cost=resize_cost,
            walltime_factor=walltime_factor,
            moldable_start=moldable_start,
        )
        loaded = load_workload(workload, fmt)  # type: ignore[arg-type]
        policy = _load_policy(policy_file, config)
        if policy is None:
            click.echo(f"note: {ELASTIC_UNAVAILABLE}", err=True)
        for reason, count in sorted(loaded.skipped.items()):
            click.echo(f"note: skipped {count} job(s): {reason}", err=True)
        show_progress = progress if progress is not None else sys.stderr.isatty()
        result = compare(loaded, config, seed, policy=policy, progress=_progress_factory(show_progress))
        baseline = summarize(result.baseline, starvation_threshold)
        elastic = summarize(result.elastic, starvation_threshold) if result.elastic is not None else None
        per_job = slowdown(result.baseline, result.elastic) if result.elastic is not None else None
        if plot_dir is not None:
            from slurm_elastic.sim.plots import write_plots

            runs = {"baseline": result.baseline}
            if result.elastic is not None:
                runs["elastic"] = result.elastic
            for path in write_plots(runs, plot_dir):
                click.echo(f"wrote {path}", err=True)
    except SlurmElasticError as exc:
        click.echo(f"slurm-elastic simulate: {exc}", err=True)
        sys.exit(1)
    if as_json:
        payload: dict[str, Any] = {
            "baseline": baseline.as_dict(),
            "elastic": elastic.as_dict() if elastic is not None else None,
            "per_job": per_job.as_dict() if per_job is not None else None,
        }
        click.echo(json.dumps(payload))
        return
    click.echo(
        f"{loaded.source}: {len(loaded.jobs)} jobs on {nodes}x{gpus_per_node} GPUs, "
        f"scheduler {scheduler}, placement {placement}, seed {seed}"
    )
    click.echo(_table(baseline, elastic))
    if per_job is not None:
        click.echo(
            f"per job, elastic JCT / rigid JCT (both at least {per_job.floor_s:.0f}s): later {per_job.later:.1%}, "
            f"> 1.25x {per_job.later_125:.1%}, > 2x {per_job.later_2:.1%}, worst {per_job.worst:.2f}x "
            f"({per_job.worst_job})"
        )
