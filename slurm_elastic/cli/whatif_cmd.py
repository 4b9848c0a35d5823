"""``slurm-elastic whatif``: replay the site's own accounting, read live through the adapter, on the simulator,
rigid and elastic (the running policy, or ``--policy FILE``), next to what actually happened.

What the replay cannot know is how each job's throughput scales with its size: sacct gives only GPUs and run
time. The simulator's parametric model stands in (``perfmodel/parametric.py``: speedup parameters drawn per job,
with ``--seed``, from the stored fits of the Pollux throughput model); docs/operating.md says more.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from slurm_elastic.cli.api_backend import backend_options, call
from slurm_elastic.cli.output import output_options
from slurm_elastic.cli.report_cmd import notes, read_ended_jobs, render, window_options
from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.report import group_row, replay_row
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.loaders.sacct import accounting_workload
from slurm_elastic.sim.policy_adapter import make_policy
from slurm_elastic.sim.run import compare
from slurm_elastic.sim.scheduler import SCHEDULERS
from slurm_elastic.slurm.adapter import SlurmCli

MODEL_NOTE = ("jobs' scalability is not in the accounting: the simulator's parametric speedup model stands in "
              "(drawn per job with --seed; see docs/simulator.md)")


def cluster_shape(nodes: int | None, gpus_per_node: int | None) -> tuple[int, int]:
    """The replayed cluster: as given, else the live cluster's GPU nodes and their largest GPU count."""
    if nodes is not None and gpus_per_node is not None:
        return nodes, gpus_per_node
    gpu_nodes = [n.gpus() for n in SlurmCli().nodes() if n.gpus() > 0]
    if not gpu_nodes:
        raise click.ClickException("the cluster has no GPU nodes: give --nodes and --gpus-per-node")
    return nodes or len(gpu_nodes), gpus_per_node or max(gpu_nodes)


def policy_text(url: str | None, socket_: str | None, down: str | None) -> tuple[str | None, str]:
    """(the running policy's TOML, where it came from); None: the packaged defaults (no controller)."""
    if down is not None:
        return None, "packaged defaults (controller not reachable)"
    shown = call(url, socket_, "policy.show")
    return str(shown["text"]), str(shown["source"])


@click.command("whatif")
@backend_options
@window_options("30d")
@click.option("--policy", "policy_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="a proposed policy (TOML) [default: the controller's running policy]")
@click.option("--nodes", type=click.IntRange(min=1), help="nodes to replay on [default: the cluster's GPU nodes]")
@click.option("--gpus-per-node", type=click.IntRange(min=1), help="[default: the cluster's largest]")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the parametric speedup draws")
@click.option("--scheduler", type=click.Choice(SCHEDULERS), default="backfill", show_default=True)
@output_options
def whatif_cmd(*, url: str | None, socket_: str | None, since: str, until: str | None, starvation_threshold: float,
               progress: bool | None, policy_file: Path | None, nodes: int | None, gpus_per_node: int | None,
               seed: int, scheduler: str, parsable: bool, as_json: bool, noheader: bool) -> None:
    """Replay the jobs that ended in the window, rigid and elastic, and print them in the rows of ``report``
    next to what actually happened. Ordinary users replay their own jobs only."""
    # One usage bucket over the whole window: the replay needs only which jobs were elastic, not a series.
    ended = read_ended_jobs(url, socket_, since, until, progress=progress,
                            bucket_s=lambda span_s: max(60.0, span_s))
    jobs, skipped, down, facts, folded = ended.jobs, ended.skipped, ended.down, ended.facts, ended.folded
    kept = {f.job_id for f in facts}
    replayed = [j for j in jobs if j.spec.job_id in kept]
    n, g = cluster_shape(nodes, gpus_per_node)
    if policy_file is not None:
        source = str(policy_file)
    else:
        text, source = policy_text(url, socket_, down)
    notes(skipped, [f"{folded} extension job(s) counted in their elastic jobs" if folded else None,
                    f"replaying {len(replayed)} job(s) on {n}x{g} GPUs, policy: {source}", MODEL_NOTE])
    try:
        config = SimConfig(num_nodes=n, gpus_per_node=g, scheduler=scheduler)  # type: ignore[arg-type]
        workload = accounting_workload("sacct", replayed, dict(skipped))
        if policy_file is None and text is not None:
            with tempfile.NamedTemporaryFile("w", suffix=".toml", prefix="whatif-policy-") as tmp:
                tmp.write(text)
                tmp.flush()
                policy = make_policy(Path(tmp.name), config)
        else:
            policy = make_policy(policy_file, config)
        result = compare(workload, config, seed, policy=policy)
    except SlurmElasticError as e:
        raise click.ClickException(str(e)) from e
    actual = group_row("actual", "all", facts, starvation_threshold)
    rows = [actual, replay_row("rigid", result.baseline, starvation_threshold)]
    if result.elastic is not None:
        rows.append(replay_row("elastic", result.elastic, starvation_threshold))
    render(rows, parsable=parsable, as_json=as_json, noheader=noheader)
