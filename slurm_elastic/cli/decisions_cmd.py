"""``slurm-elastic jobs``, ``explain JOBID`` and ``decisions list``: what the controller decided, and why.

They ask the controller's API socket (ordinary users see only their own jobs), or with ``--url`` read the state
DB directly (root/SlurmUser). See docs/operating.md.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from slurm_elastic.cli.api_backend import backend_options, call
from slurm_elastic.cli.explain_plan import plan_rows
from slurm_elastic.cli.output import age, emit, output_options, spec_text, value_text

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


def _time(iso: str) -> str:
    return datetime.fromisoformat(iso).strftime("%Y-%m-%dT%H:%M:%S")


def _nodes(d: dict[str, Any]) -> str:
    return f"{d['current_nodes']}->{d['target_nodes']}"


def _inputs(d: dict[str, Any]) -> str:
    return " ".join(f"{k}={value_text(v)}" for k, v in sorted(d.get("inputs", {}).items()) if k != "basis")


def _based_on(d: dict[str, Any]) -> str:
    """The measured signal the decision rests on (utilization, throughput, queue, reserve, bounds, none)."""
    return str(d.get("inputs", {}).get("basis", ""))


@click.group("decisions")
def decisions_cmd() -> None:
    """The controller's decisions with their reasons: every grow and shrink, and each hold when it changes (and
    every hold_heartbeat_s while it does not)."""


@decisions_cmd.command("list")
@backend_options
@click.option("-j", "--job", type=int, help="only this job (raw job id of the elastic unit)")
@click.option("--since", help="only newer than this: 30m, 2h, 1d, or an ISO time")
@click.option("--action", type=click.Choice(["grow", "shrink", "hold"]))
@click.option("--reason", help="only this reason code, e.g. UNDERUTILIZED")
@click.option("--limit", type=click.IntRange(1, 100000), default=50, show_default=True)
@output_options
def list_cmd(*, url: str | None, socket_: str | None, job: int | None, since: str | None, action: str | None,
             reason: str | None, limit: int, parsable: bool, as_json: bool, noheader: bool) -> None:
    """Newest first. Ordinary users see decisions about their own jobs only."""
    start = parse_since(since, datetime.now(tz=UTC))
    args = {"job": job, "since": start.isoformat() if start else None, "action": action,
            "reason": reason.upper() if reason else None, "limit": limit}
    rows = sorted(call(url, socket_, "decisions", args)["decisions"], key=lambda d: d["id"], reverse=True)
    emit(["time", "job", "action", "nodes", "reason", "based_on", "message"],
         [(_time(d["time"]), d["job"], d["action"] + (" (dry-run)" if d["dry_run"] else ""), _nodes(d),
           d["reason"], _based_on(d), d["message"]) for d in rows],
         parsable=parsable, as_json=as_json, noheader=noheader, json_rows=rows)


def _job_note(j: dict[str, Any]) -> str:
    """An ended job's size is history: say what it ended with, and when (its cur column shows "-")."""
    ended = (f"ended {_time(j['ended_at'])} with {j['ended_nodes']} node{'' if j['ended_nodes'] == 1 else 's'}"
             if j.get("ended_at") else "")
    return "; ".join(x for x in (ended, j["note"] or "") if x)


@click.command("jobs")
@backend_options
@click.option("-a", "--all", "show_all", is_flag=True, help="include ended jobs")
@output_options
def jobs_cmd(*, url: str | None, socket_: str | None, show_all: bool, parsable: bool, as_json: bool,
             noheader: bool) -> None:
    """Elastic jobs: min/current/max nodes, utilization, state, and the last decision with its age.
    Ordinary users see their own jobs only."""
    jobs = call(url, socket_, "jobs", {"all": show_all})["jobs"]
    rows = [(j["job"], j["user"], j["account"] or "", j["partition"], j["state"] + (" (paused)" if j["paused"]
                                                                                       else ""),
             j["min_nodes"], "-" if j["current_nodes"] is None else j["current_nodes"], j["max_nodes"],
             "" if j["util_10m"] is None else f"{j['util_10m']:.0f}%",
             f"{j['last_action']}:{j['last_reason']}" if j["last_action"] else "",
             age(j["last_age_s"]) if j["last_age_s"] is not None else "", _job_note(j)) for j in jobs]
    emit(["jobid", "user", "account", "partition", "state", "min", "cur", "max", "util(10m)", "last", "age",
          "note"], rows, parsable=parsable, as_json=as_json, noheader=noheader, json_rows=jobs)


@click.command("explain")
@backend_options
@click.argument("job_id", type=int)
@click.option("--last", type=click.IntRange(1, 1000), default=10, show_default=True, help="decisions to show")
@output_options
def explain_cmd(*, url: str | None, socket_: str | None, job_id: int, last: int, parsable: bool, as_json: bool,
                noheader: bool) -> None:
    """Why JOB_ID is at its size: its directives, the effective policy values with where each came from
    (default, global, partition, account, qos, profile or directive), and its last decisions with their inputs."""
    r = call(url, socket_, "explain", {"job": job_id, "last": last})
    if as_json:
        click.echo(json.dumps(r, indent=2, default=str))
        return
    n = r["nodes"]
    head = [("job", r["job"]), ("user", r["user"]), ("account", r["account"] or ""),
            ("partition", r["partition"]), ("qos", r["qos"] or ""), ("state", r["state"]),
            ("nodes", f"min {n['min']} current {n['current']} max {n['max']}"
                      + (f" (ended {_time(n['ended'])}, last size {n['last']})" if n.get("ended") else "")),
            ("directives", spec_text(r["directives"]) or "(none)"), ("directives_from", r["directives_source"]),
            ("policy", r["policy_source"]), ("profile_now", r.get("profile_now") or "(none)")]
    if r["directives_error"]:
        head.append(("directives_error", r["directives_error"]))
    if h := r.get("hold"):  # holds are stored when they change, and every hold_heartbeat_s while unchanged
        head.append(("hold", f"{h['reason']} unchanged since {_time(h['since'])}, last stored {_time(h['recorded'])}"
                     + (f", last cycle {_time(h['last_cycle'])}" if h["last_cycle"] else "")))
    if b := r.get("grow_backoff"):  # failed grows: no grow before this (policy/holds.py, GROW_BACKOFF)
        head.append(("grow_backoff", f"until {_time(b['until'])} ({b['failed_grows']} failed grow(s) in the last "
                                     f"hour, last {_time(b['last_at'])}: {b['last']})"))
    head += plan_rows(r["decisions"])  # allocator: the planned size, rho and what it rests on, a waiting share
    if r["paused_by"]:
        p = r["paused_by"]
        head.append(("paused", f"{p['scope']} {p['target']} by {p['who']} {p['reason']}".strip()))
    emit(["field", "value"], head, parsable=parsable, as_json=False, noheader=noheader)
    click.echo()
    emit(["setting", "value", "source"], [(s["key"], s["value"], s["source"]) for s in r["settings"]],
         parsable=parsable, as_json=False, noheader=noheader)
    click.echo()
    # reason is the rule that decided; based_on the signal it read; profile the config profile in force.
    emit(["time", "action", "nodes", "reason", "based_on", "profile", "message", "inputs"],
         [(_time(d["time"]), d["action"], _nodes(d), d["reason"], _based_on(d), d.get("profile") or "-",
           d["message"], _inputs(d)) for d in r["decisions"]], parsable=parsable, as_json=False, noheader=noheader)
