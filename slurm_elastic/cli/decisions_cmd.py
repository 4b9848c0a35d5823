"""``slurm-elastic decisions list`` and ``slurm-elastic jobs``: what the controller decided, and why.

Both read the state DB (``--url``, else ``$SLURM_ELASTIC_DB_URL``, else the default SQLite file). The DB file is
readable by root/SlurmUser only; ordinary users' access goes through the controller (issue "Operating it").
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import click

from slurm_elastic.cli.output import age, emit, output_options
from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.store import DEFAULT_DB_URL, SqlStore
from slurm_elastic.store.records import DecisionFilter

_url = click.option("--url", envvar="SLURM_ELASTIC_DB_URL", default=DEFAULT_DB_URL, show_default=True,
                    help="SQLAlchemy URL of the state DB (env SLURM_ELASTIC_DB_URL).")
_DURATION = re.compile(r"^(\d+)([smhd])$")


def parse_since(text: str | None, now: datetime) -> datetime | None:
    """``30m``, ``2h``, ``1d`` (ago) or an ISO time (UTC if no zone)."""
    if not text:
        return None
    m = _DURATION.match(text)
    if m:
        mult = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return now - timedelta(seconds=int(m.group(1)) * mult)
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: use 30m, 2h, 1d or an ISO time like 2026-11-29T12:00") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _open(url: str) -> SqlStore:
    return SqlStore.open(url, create=False)


@click.group("decisions")
def decisions_cmd() -> None:
    """The controller's decisions, holds included, with their reasons."""


@decisions_cmd.command("list")
@_url
@click.option("-j", "--job", type=int, help="only this job (raw job id of the elastic unit)")
@click.option("--since", help="only newer than this: 30m, 2h, 1d, or an ISO time")
@click.option("--action", type=click.Choice(["grow", "shrink", "hold"]))
@click.option("--reason", help="only this reason code, e.g. UNDERUTILIZED")
@click.option("--limit", type=click.IntRange(1, 100000), default=50, show_default=True)
@output_options
def list_cmd(*, url: str, job: int | None, since: str | None, action: str | None, reason: str | None, limit: int,
             parsable: bool, as_json: bool, noheader: bool) -> None:
    """Newest first."""
    now = datetime.now(tz=UTC)
    flt = DecisionFilter(job_id=job, since=parse_since(since, now), action=action,
                         reason=reason.upper() if reason else None, limit=limit)
    try:
        store = _open(url)
        try:
            rows = store.decisions.list_decisions(flt)
        finally:
            store.close()
    except SlurmElasticError as e:
        raise click.ClickException(str(e)) from e
    rows = sorted(rows, key=lambda d: d.id, reverse=True)
    emit(["time", "job", "action", "nodes", "reason", "message"],
         [(d.time.strftime("%Y-%m-%dT%H:%M:%S"), d.job_id, d.action + (" (dry-run)" if d.dry_run else ""),
           f"{d.current_nodes}->{d.target_nodes}", d.reason, d.message) for d in rows],
         parsable=parsable, as_json=as_json, noheader=noheader,
         json_rows=[{"id": d.id, "time": d.time.isoformat(), "cycle": d.cycle_id, "job": d.job_id,
                     "action": d.action, "reason": d.reason, "message": d.message, "inputs": d.inputs,
                     "current_nodes": d.current_nodes, "target_nodes": d.target_nodes, "signal": d.signal,
                     "profile": d.profile, "paused": d.paused, "dry_run": d.dry_run} for d in rows])


@click.command("jobs")
@_url
@click.option("-a", "--all", "show_all", is_flag=True, help="include ended jobs")
@output_options
def jobs_cmd(*, url: str, show_all: bool, parsable: bool, as_json: bool, noheader: bool) -> None:
    """Elastic jobs: min/current/max nodes, utilization, state, and the last decision with its age."""
    now = datetime.now(tz=UTC)
    try:
        store = _open(url)
        try:
            jobs = store.jobs.list_jobs(active_only=not show_all)
            last = {job_id: ds[0] for job_id, ds in
                    store.decisions.last_decisions_per_job(1, [j.job_id for j in jobs]).items() if ds}
            util = {}
            for j in jobs:
                s = store.samples.samples(j.job_id, since=now - timedelta(minutes=10))
                util[j.job_id] = f"{sum(x.util_mean for x in s) / len(s):.0f}%" if s else ""
        finally:
            store.close()
    except SlurmElasticError as e:
        raise click.ClickException(str(e)) from e
    rows = []
    for j in sorted(jobs, key=lambda r: r.job_id):
        d = last.get(j.job_id)
        rows.append((j.job_id, j.user, j.account or "", j.partition, j.state, j.min_nodes, j.current_nodes,
                     j.max_nodes, util[j.job_id], f"{d.action}:{d.reason}" if d else "",
                     age((now - d.time).total_seconds()) if d else "", j.spec_error or ""))
    emit(["jobid", "user", "account", "partition", "state", "min", "cur", "max", "util(10m)", "last", "age",
          "note"], rows, parsable=parsable, as_json=as_json, noheader=noheader)
