"""``slurm-elastic status`` and ``slurm-elastic agents``: is the controller working, and can it see the nodes."""

from __future__ import annotations

import json
from typing import Any

import click

from slurm_elastic.cli.api_backend import backend_options, call
from slurm_elastic.cli.output import age, emit, output_options


@click.command("status")
@backend_options
@output_options
def status_cmd(*, url: str | None, socket_: str | None, parsable: bool, as_json: bool, noheader: bool) -> None:
    """Controller up/stale/down (from the lease holder's heartbeat), last cycle, managed jobs, GPUs moved today,
    agents."""
    s = call(url, socket_, "status")
    if as_json:
        click.echo(json.dumps(s, indent=2, default=str))
        return
    dur = s["last_cycle_duration_s"]
    heartbeat = s["heartbeat_age_s"]
    process = f"pid {s['lease_pid']} on {s['lease_host']}" if s["lease_pid"] is not None else ""
    answered = s["answered_by"] and f"{s['answered_by']}{' (standby)' if s['standby'] else ''}"
    rows: list[tuple[str, Any]] = [
        # The state stays one word (scripts read `-P`); why it is not up goes in its own row.
        ("controller", s["controller"]), ("controller_detail", s["controller_detail"] or ""),
        ("lease_holder", s["lease_holder"] or "(none)"), ("lease_process", process),
        ("heartbeat_age", "" if heartbeat is None else age(heartbeat)), ("answered_by", answered or ""),
        ("last_cycle", s["last_cycle"] or "(never)"), ("last_cycle_duration", "" if dur is None else f"{dur:.2f}s"),
        ("last_cycle_error", s["last_cycle_error"] or ""), ("managed_jobs", s["managed_jobs"]),
        ("gpus_granted_today", s["gpus_granted_today"]), ("gpus_reclaimed_today", s["gpus_reclaimed_today"]),
        ("agents_reachable", f"{s['agents_reachable']}/{s['agents']}"),
        ("agents_stale", ",".join(s["agents_stale"])),
        ("agents_powered_down", ",".join(s.get("agents_powered_down") or [])),
        ("pauses", ",".join(f"{p['scope']}:{p['target']}".rstrip(":") for p in s["pauses"])),
    ]
    emit(["item", "value"], rows, parsable=parsable, as_json=False, noheader=noheader)


@click.command("agents")
@backend_options
@output_options
def agents_cmd(*, url: str | None, socket_: str | None, parsable: bool, as_json: bool, noheader: bool) -> None:
    """Per node: reachability, last successful sample and its age, agent version, GPU count, last error."""
    agents = call(url, socket_, "agents")["agents"]
    # reachable: yes, no, or "powered down" (Slurm's power saving has the node off or booting: not asked)
    emit(["node", "reachable", "last_seen", "age", "version", "gpus", "error"],
         [(a["node"], "powered down" if a.get("state") == "powered down" else "yes" if a["reachable"] else "no",
           a["last_seen"] or "", "" if a["age_s"] is None else age(a["age_s"]), a["version"] or "",
           "" if a["gpus"] is None else a["gpus"], (a["error"] or a.get("note") or "")[:80]) for a in agents],
         parsable=parsable, as_json=as_json, noheader=noheader, json_rows=agents)
