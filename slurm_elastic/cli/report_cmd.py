"""``slurm-elastic report``: what the jobs that ran did, from Slurm's accounting (sacct, through the adapter) and
the controller's journal and samples (through its API socket, or the DB with ``--url``).

Ordinary users see their own jobs only: sacct is asked for the caller's jobs, and the controller answers about
the caller's elastic jobs (the rule of ``explain``). The figures are defined in :mod:`slurm_elastic.report`.
"""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from slurm_elastic.cli.api_backend import backend_options, call
from slurm_elastic.cli.decisions_cmd import parse_since
from slurm_elastic.cli.output import age, emit, output_options
from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.report import (
    COLUMNS,
    GROUP_KEYS,
    JobFacts,
    in_window,
    job_facts,
    report_rows,
    utilization_series,
)
from slurm_elastic.sim.loaders.sacct import AccountingJob, parse_accounting
from slurm_elastic.sim.metrics import DEFAULT_STARVATION_THRESHOLD
from slurm_elastic.slurm.adapter import SlurmCli

#: Utilization is downsampled to this many buckets over the window (at least a minute each).
_BUCKETS = 400


def _report_bucket_s(span_s: float) -> float:
    """About _BUCKETS utilization points over the window, never finer than a minute."""
    return max(60.0, span_s / _BUCKETS)
_SECONDS = {c for c in COLUMNS if c.endswith("_s")}


def caller_scope(url: str | None, socket_: str | None) -> tuple[str | None, str | None]:
    """(user whose jobs to read, or None for everyone's; a note when the controller did not answer)."""
    try:
        me = call(url, socket_, "whoami")
        return (None if me["admin"] else str(me["user"])), None
    except click.ClickException as e:
        uid = os.getuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        return (None if uid == 0 else name), f"controller not reachable ({e.message})"


def read_accounting(since: datetime, until: datetime, user: str | None, progress: bool | None
                    ) -> tuple[list[AccountingJob], dict[str, int]]:
    """Finished GPU jobs of the window from sacct (a progress bar on a TTY: one step per day read)."""
    show = progress if progress is not None else sys.stderr.isatty()
    bar: Any = None
    on_chunk: Callable[[int, int], None] | None = None
    if show:
        from tqdm import tqdm

        def on_chunk(done: int, total: int) -> None:
            nonlocal bar
            if bar is None:
                bar = tqdm(total=total, desc="sacct", unit="day", file=sys.stderr, leave=False)
            bar.update(done - bar.n)

    try:
        text = SlurmCli().accounting_export(since, until, user=user, on_chunk=on_chunk)
    finally:
        if bar is not None:
            bar.close()
    return parse_accounting("sacct", text)


def render(rows: Sequence[dict[str, Any]], *, parsable: bool, as_json: bool, noheader: bool) -> None:
    """The report table: durations as Slurm elapsed times and utilization in percent, except with -P/--json."""
    if parsable or as_json:
        emit(COLUMNS, [[r[c] for c in COLUMNS] for r in rows], parsable=parsable, as_json=as_json,
             noheader=noheader, json_rows=rows)
        return

    def cell(column: str, value: Any) -> Any:
        if value is None:
            return "-"
        if column in _SECONDS:
            return age(value)
        if column.startswith("util_mean"):
            return f"{value:.1%}"
        return value

    emit(COLUMNS, [[cell(c, r[c]) for c in COLUMNS] for r in rows], parsable=False, as_json=False,
         noheader=noheader)


def notes(skipped: dict[str, int], extra: Sequence[str | None] = ()) -> None:
    for note in extra:
        if note:
            click.echo(f"note: {note}", err=True)
    for reason, count in sorted(skipped.items()):
        click.echo(f"note: left out {count} job(s): {reason}", err=True)


def window_options(default_since: str) -> Callable[[Any], Any]:
    def wrap(f: Any) -> Any:
        f = click.option("--until", help="end of the window: 30m, 2h, 1d (ago) or an ISO time [default: now]")(f)
        f = click.option("--since", default=default_since, show_default=True,
                         help="start of the window: 30m, 2h, 7d (ago) or an ISO time")(f)
        f = click.option("--starvation-threshold", type=click.FloatRange(min=0),
                         default=DEFAULT_STARVATION_THRESHOLD, show_default=True,
                         help="a job waiting longer than this (s) counts as starved")(f)
        return click.option("--progress/--no-progress", default=None,
                            help="progress bar on stderr while sacct is read (default: on a TTY)")(f)
    return wrap


def window(since: str, until: str | None) -> tuple[datetime, datetime]:
    now = datetime.now(tz=UTC)
    start = parse_since(since, now)
    end = parse_since(until, now) or now
    assert start is not None  # since has a default
    if end <= start:
        raise click.BadParameter(f"the window ends ({end.isoformat()}) before it starts ({start.isoformat()})")
    return start, end


@dataclass(frozen=True)
class EndedJobs:
    """The jobs that ended in a window, read from sacct and (when it answers) the controller's journal."""
    start: datetime
    end: datetime
    jobs: list[AccountingJob]
    skipped: dict[str, int]  # sacct rows left out, by why
    down: str | None  # why the controller could not be asked, or None
    facts: list[JobFacts]
    folded: int  # extension jobs counted in their elastic jobs


def read_ended_jobs(url: str | None, socket_: str | None, since: str, until: str | None, *, progress: bool | None,
                    bucket_s: Callable[[float], float]) -> EndedJobs:
    """What report and whatif both start from; ``bucket_s`` maps the window's length to the usage sample bucket."""
    start, end = window(since, until)
    user, down = caller_scope(url, socket_)
    try:
        jobs, skipped = read_accounting(start, end, user, progress)
    except SlurmElasticError as e:
        raise click.ClickException(f"reading accounting: {e}") from e
    usage: dict[str, Any] | None = None
    if down is None:
        usage = call(url, socket_, "usage", {"since": start.isoformat(), "until": end.isoformat(),
                                             "bucket_s": bucket_s((end - start).total_seconds())})
    facts, folded = job_facts(jobs, usage)
    return EndedJobs(start, end, jobs, skipped, down, in_window(facts, start, end), folded)


@click.command("report")
@backend_options
@window_options("7d")
@click.option("--by", type=click.Choice(GROUP_KEYS), help="one group of rows per account, partition, qos or user")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path),
              help="write jct_cdf.png, wait_cdf.png and utilization.png here")
@output_options
def report_cmd(*, url: str | None, socket_: str | None, since: str, until: str | None, starvation_threshold: float,
               progress: bool | None, by: str | None, plot_dir: Path | None, parsable: bool, as_json: bool,
               noheader: bool) -> None:
    """Jobs that ended in the window: elastic, rigid and all side by side. Completed jobs, GPU-hours, JCT and
    queue wait (mean, std, p50, p99), starved jobs, GPU utilization (mean and variance, where the controller
    sampled), GPU-hours allocated vs used, resizes and the node-hours they moved. Ordinary users see their own
    jobs only."""
    ended = read_ended_jobs(url, socket_, since, until, progress=progress, bucket_s=_report_bucket_s)
    facts = ended.facts
    notes(ended.skipped, [f"{ended.down}: no job counts as elastic, no utilization" if ended.down else None,
                          f"{ended.folded} extension job(s) counted in their elastic jobs" if ended.folded else None])
    rows = report_rows(facts, by, starvation_threshold)
    render(rows, parsable=parsable, as_json=as_json, noheader=noheader)
    if plot_dir is not None:
        from slurm_elastic.report_plots import write_cdfs, write_utilization

        kinds = {"elastic": [f for f in facts if f.elastic], "rigid": [f for f in facts if not f.elastic]}
        span_s = (ended.end - ended.start).total_seconds()
        series = utilization_series(facts, _report_bucket_s(span_s), ended.start.timestamp())
        try:
            paths = write_cdfs({k: [f.jct for f in v] for k, v in kinds.items()},
                               {k: [f.wait for f in v] for k, v in kinds.items()}, plot_dir)
            if series:
                paths.append(write_utilization(series, plot_dir))
        except SlurmElasticError as e:
            raise click.ClickException(str(e)) from e
        for path in paths:
            click.echo(f"wrote {path}", err=True)
