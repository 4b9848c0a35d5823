"""``slurm-elastic whatif``: replay the site's own accounting, read live through the adapter, on the simulator,
rigid and elastic (the running policy, or ``--policy FILE``), next to what actually happened.

What the replay cannot know is how each job's throughput scales with its size: sacct gives only GPUs and run
time. The simulator's parametric model stands in (``perfmodel/parametric.py``: speedup parameters drawn per job,
with ``--seed``, from the stored fits of the Pollux throughput model); docs/operating.md says more.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from slurm_elastic.cli.api_backend import backend_options, call
from slurm_elastic.cli.output import output_options
from slurm_elastic.cli.report_cmd import notes, read_ended_jobs, render, window_options
from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.policy import parse_config
from slurm_elastic.report import JobFacts, group_row, replay_row
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.engine import SimResult
from slurm_elastic.sim.loaders.sacct import accounting_workload
from slurm_elastic.sim.policy_adapter import make_policy
from slurm_elastic.sim.run import compare
from slurm_elastic.sim.scheduler import SCHEDULERS
from slurm_elastic.slurm.adapter import SlurmCli

#: The replay's scheduling step: Slurm starts a job when it is submitted or another ends, if it fits (its main
#: scheduler is event-driven; sacct's times are whole seconds), so the replay schedules every second, not every
#: minute, and gives no start delay (sacct's run time already holds the job's own start).
SLURM_STEP_S = 1.0
MODEL_NOTE = ("jobs' scalability is not in the accounting: the simulator's parametric speedup model stands in "
              "(drawn per job with --seed; see docs/simulator.md)")


def cluster_shape(nodes: int | None, gpus_per_node: int | None) -> tuple[int, int, list[str]]:
    """The replayed cluster: as given, else the live cluster's GPU nodes and their largest GPU count; and the GPU
    nodes Slurm's power saving has off now (counted: Slurm resumes them for a job; named in a note)."""
    if nodes is not None and gpus_per_node is not None:
        return nodes, gpus_per_node, []
    live = [n for n in SlurmCli().nodes() if n.gpus() > 0]
    if not live:
        raise click.ClickException("the cluster has no GPU nodes: give --nodes and --gpus-per-node")
    off = sorted(n.name for n in live if n.is_powered_off)
    return nodes or len(live), gpus_per_node or max(n.gpus() for n in live), off


def fidelity(actual: Mapping[str, Any], rigid: Mapping[str, Any]) -> str:
    """How close the rigid replay comes to what happened (the replay's check on itself)."""
    def pair(key: str) -> str:
        a, r = float(actual[key]), float(rigid[key])
        rel = f", {100 * (r - a) / a:+.0f}%" if a > 0 else ""
        return f"{r:.1f}s replayed vs {a:.1f}s actual ({r - a:+.1f}s{rel})"
    return f"rigid replay vs actual: mean JCT {pair('jct_mean_s')}; mean wait {pair('wait_mean_s')}"


def why_equal(facts: Sequence[JobFacts], result: SimResult | None, window_s: float) -> str | None:
    """Why the elastic replay came out as the rigid one, when it did: which jobs were elastic, and why none
    moved."""
    if result is None or any(r.result == "applied" for r in result.resizes):
        return None
    elastic = sorted(f.job_id for f in facts if f.elastic)
    real = (f"{len(elastic)} job(s) of the window were elastic ({', '.join(elastic[:10])}"
            f"{', ...' if len(elastic) > 10 else ''})" if elastic else "no job of the window was elastic")
    short = sum(1 for j in result.jobs if j.end_time - j.start_time < window_s)
    rejected: dict[str, int] = {}
    for r in result.resizes:
        rejected[r.code] = rejected.get(r.code, 0) + 1
    asked = (f"{len(result.resizes)} resize(s) asked, none applied ("
             + ", ".join(f"{c}: {n}" for c, n in sorted(rejected.items())) + ")") if rejected else "none asked"
    return (f"elastic replay = rigid: no replayed job resized ({asked}); every replayed job is elastic to the "
            f"policy, {short} of {len(result.jobs)} ran shorter than its window_s {window_s:.0f}s, which a "
            f"decision needs; {real}")


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
@click.option("--interval", "interval_s", type=click.FloatRange(min=1.0), default=SLURM_STEP_S, show_default=True,
              help="the replay's scheduling (and policy) step in seconds: Slurm starts jobs as they fit; a long "
                   "window replays faster with a coarser step")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path),
              help="write jct_cdf.png and wait_cdf.png (actual, rigid, elastic) and nodes.png (node count per job "
                   "over time, rigid and elastic) here")
@output_options
def whatif_cmd(*, url: str | None, socket_: str | None, since: str, until: str | None, starvation_threshold: float,
               progress: bool | None, policy_file: Path | None, nodes: int | None, gpus_per_node: int | None,
               seed: int, scheduler: str, interval_s: float, plot_dir: Path | None, parsable: bool, as_json: bool,
               noheader: bool) -> None:
    """Replay the jobs that ended in the window, rigid and elastic, and print them in the rows of ``report``
    next to what actually happened. Ordinary users replay their own jobs only."""
    # One usage bucket over the whole window: the replay needs only which jobs were elastic, not a series.
    ended = read_ended_jobs(url, socket_, since, until, progress=progress,
                            bucket_s=lambda span_s: max(60.0, span_s))
    jobs, skipped, down, facts, folded = ended.jobs, ended.skipped, ended.down, ended.facts, ended.folded
    kept = {f.job_id for f in facts}
    replayed = [j for j in jobs if j.spec.job_id in kept]
    n, g, off = cluster_shape(nodes, gpus_per_node)
    text: str | None = None
    if policy_file is not None:
        source = str(policy_file)
        text = policy_file.read_text()
    else:
        text, source = policy_text(url, socket_, down)
    notes(skipped, [f"{folded} extension job(s) counted in their elastic jobs" if folded else None,
                    f"replaying {len(replayed)} job(s) on {n}x{g} GPUs, policy: {source}",
                    (f"{len(off)} of them powered down now ({','.join(off)}): counted, Slurm resumes them for a "
                     f"job; --nodes {n - len(off)} leaves them out") if off else None, MODEL_NOTE])
    try:
        config = SimConfig(num_nodes=n, gpus_per_node=g, scheduler=scheduler,  # type: ignore[arg-type]
                           interval=interval_s, start_delay=0.0)
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
    window = parse_config(text or "version = 1\n", source=source).resolve("window_s").value
    window_s = float(window) if isinstance(window, int | float) else 0.0
    notes({}, [fidelity(actual, rows[1]) if facts else None, why_equal(facts, result.elastic, window_s)])
    render(rows, parsable=parsable, as_json=as_json, noheader=noheader)
    if plot_dir is not None:
        _plots(plot_dir, facts, result.baseline, result.elastic, gpus_per_node=g, ids=[j.job_id for j in workload.jobs])


def _plots(directory: Path, facts: Sequence[JobFacts], rigid: SimResult, elastic: SimResult | None,
           *, gpus_per_node: int, ids: Sequence[str]) -> None:
    from slurm_elastic.report_plots import write_cdfs, write_node_timelines

    runs = {"rigid": rigid, **({"elastic": elastic} if elastic is not None else {})}
    try:
        paths = write_cdfs({"actual": [f.jct for f in facts], **{k: [j.jct for j in r.jobs] for k, r in runs.items()}},
                           {"actual": [f.wait for f in facts],
                            **{k: [j.wait for j in r.jobs] for k, r in runs.items()}}, directory)
        paths.append(write_node_timelines({k: node_timeline(r, gpus_per_node, ids) for k, r in runs.items()},
                                          directory))
    except SlurmElasticError as e:
        raise click.ClickException(str(e)) from e
    for path in paths:
        click.echo(f"wrote {path}", err=True)


def node_timeline(result: SimResult, gpus_per_node: int, ids: Sequence[str]) -> dict[str, list[tuple[float, float,
                                                                                                   int]]]:
    """Each replayed job's (start, end, nodes) spans, from the run's usage intervals (``ids``: the workload's job
    ids, which the intervals' job index points into)."""
    out: dict[str, list[tuple[float, float, int]]] = {}
    for u in result.usage:
        name = ids[u.job] if 0 <= u.job < len(ids) else str(u.job)
        out.setdefault(name, []).append((u.start, u.end, -(-u.gpus // gpus_per_node)))
    return out
