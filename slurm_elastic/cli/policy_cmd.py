"""``slurm-elastic policy show|set|validate|diff|history|rollback`` and ``pause``/``resume``.

Changing verbs go through the controller's API (root, SlurmUser or the operators group only); every stored policy
version records who and when, and is validated before it is stored. The controller picks up the newest version
at its next cycle (or at once on SIGHUP).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from slurm_elastic.cli.api_backend import backend_options, call
from slurm_elastic.cli.output import emit, output_options
from slurm_elastic.errors import ConfigError


@click.group("policy")
def policy_cmd() -> None:
    """The controller's policy, versioned in the state DB."""


@policy_cmd.command("show")
@backend_options
@click.option("--version", "version", type=int, help="an older version (default: the one in force)")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
def show_cmd(*, url: str | None, socket_: str | None, version: int | None, as_json: bool) -> None:
    """The policy text in force (or VERSION), with its version, author and time."""
    r = call(url, socket_, "policy.show", {"version": version})
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    if r["version"] is not None:
        click.echo(f"# policy version {r['version']} by {r['author']} at {r['created_at']}")
    else:
        click.echo(f"# {r['source']} (no version stored yet)")
    click.echo(r["text"], nl=not r["text"].endswith("\n"))


@policy_cmd.command("set")
@backend_options
@click.argument("assignments", nargs=-1, required=True)
@click.option("-m", "--comment", default="", help="why (stored with the version)")
def set_cmd(*, url: str | None, socket_: str | None, assignments: tuple[str, ...], comment: str) -> None:
    """Store a new version with KEY=VALUE changes (dotted keys for tables: partition.gpu.grace_s=60).
    Validated before anything is stored."""
    r = call(url, socket_, "policy.set", {"assignments": list(assignments), "comment": comment or None})
    click.echo(f"policy version {r['version']} stored by {r['author']}")


@policy_cmd.command("validate")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def validate_cmd(*, file: Path) -> None:
    """Check a policy file without storing it (local: needs no controller)."""
    from slurm_elastic.policy import parse_config

    try:
        parse_config(file.read_text(), source=str(file))
    except OSError as e:
        raise click.ClickException(f"{file}: cannot read: {e.strerror}") from e
    except ConfigError as e:
        click.echo(str(e), err=True)
        raise SystemExit(1) from e
    click.echo(f"{file}: valid")


@policy_cmd.command("diff")
@backend_options
@click.option("--from", "from_", type=int, help="older version (default: the one before --to)")
@click.option("--to", type=int, help="newer version (default: the newest)")
def diff_cmd(*, url: str | None, socket_: str | None, from_: int | None, to: int | None) -> None:
    """Unified diff between two stored versions (the first version is compared with the policy file)."""
    r = call(url, socket_, "policy.diff", {"from": from_, "to": to})
    if r["to"] is None:
        click.echo("no policy version stored yet")
        return
    click.echo(r["diff"] or f"no difference between {r['from']} and {r['to']}", nl=not r["diff"])


@policy_cmd.command("history")
@backend_options
@click.option("--limit", type=click.IntRange(1, 100000), default=20, show_default=True)
@output_options
def history_cmd(*, url: str | None, socket_: str | None, limit: int, parsable: bool, as_json: bool,
                noheader: bool) -> None:
    """Stored versions, newest first, with who and when."""
    versions = call(url, socket_, "policy.history", {"limit": limit})["versions"]
    emit(["version", "time", "author", "rollback_of", "comment"],
         [(v["version"], v["created_at"][:19], v["author"], v["rollback_of"] or "", v["comment"]) for v in versions],
         parsable=parsable, as_json=as_json, noheader=noheader, json_rows=versions)


@policy_cmd.command("rollback")
@backend_options
@click.argument("version", type=int)
def rollback_cmd(*, url: str | None, socket_: str | None, version: int) -> None:
    """Store VERSION's text again as the newest version (history only grows)."""
    r = call(url, socket_, "policy.rollback", {"version": version})
    click.echo(f"policy version {r['version']} stored by {r['author']} (rollback to {version})")


def _scope(job: int | None, partition: str | None, everything: bool) -> tuple[str, str | None]:
    given = [x for x in (job is not None, partition is not None, everything) if x]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --job JOBID, --partition NAME or --all")
    if job is not None:
        return "job", str(job)
    if partition is not None:
        return "partition", partition
    return "global", None


def _scope_options(f: click.decorators.FC) -> click.decorators.FC:
    f = click.option("--all", "everything", is_flag=True, help="everything the controller manages")(f)
    f = click.option("-p", "--partition", help="every elastic job in this partition")(f)
    f = click.option("-j", "--job", type=int, help="one elastic job")(f)
    return f


@click.command("pause")
@backend_options
@_scope_options
@click.option("-r", "--reason", default="", help="why (shown by status and explain)")
def pause_cmd(*, url: str | None, socket_: str | None, job: int | None, partition: str | None, everything: bool,
              reason: str) -> None:
    """Stop acting on a job, a partition or everything; decisions are still recorded, as holds (PAUSED)."""
    scope, target = _scope(job, partition, everything)
    r = call(url, socket_, "pause", {"scope": scope, "target": target, "reason": reason})
    click.echo(f"paused {r['scope']} {r['target']}".rstrip() + f" (by {r['who']} since {r['since'][:19]})")


@click.command("resume")
@backend_options
@_scope_options
def resume_cmd(*, url: str | None, socket_: str | None, job: int | None, partition: str | None,
               everything: bool) -> None:
    """Lift a pause."""
    scope, target = _scope(job, partition, everything)
    r = call(url, socket_, "resume", {"scope": scope, "target": target})
    what = f"{r['scope']} {r['target'] or ''}".rstrip()
    click.echo(f"resumed {what}" if r["resumed"] else f"{what} was not paused")
