"""``slurm-elastic check SCRIPT``: lint the ``#ELASTIC`` directives of a batch script.

Prints one line per problem on stderr, compiler style (``SCRIPT:LINE: --option: why (allowed: range)``), the
same checks and messages as the job_submit plugin gives at sbatch time. On success it prints the normalized
spec(s) that the plugin would store on the job. Exit status: 0 clean (warnings allowed), 1 errors or an
unreadable script, 2 usage.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from slurm_elastic.directives import parse_script


def _read(script: str) -> bytes:
    if script == "-":
        return sys.stdin.buffer.read()
    with open(script, "rb") as f:
        return f.read()


@click.command("check")
@click.argument("script", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON document on stdout.")
@click.pass_context
def check_cmd(ctx: click.Context, script: str, as_json: bool) -> None:
    """Check the #ELASTIC directives of batch script SCRIPT ('-' reads stdin).

    Directives are read like sbatch reads #SBATCH: only in the comment block before the first command.
    See docs/directives.md for the options, their defaults and allowed ranges.
    """
    name = "stdin" if script == "-" else script
    try:
        data = _read(script)
    except OSError as exc:
        click.echo(f"slurm-elastic check: error: cannot read {name}: {exc.strerror or exc}", err=True)
        ctx.exit(1)
    result = parse_script(data)
    if as_json:
        doc: dict[str, Any] = {
            "script": name,
            "ok": result.ok,
            "elastic": result.elastic,
            "specs": [s.to_dict() for s in result.specs],
            "errors": [e.to_dict() for e in result.errors],
            "warnings": [w.to_dict() for w in result.warnings],
        }
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        for w in result.warnings:
            click.echo(w.format(name), err=True)
        for err in result.errors:
            click.echo(err.format(name), err=True)
        if result.ok:
            if result.specs:
                for spec in result.specs:
                    click.echo(spec.to_normalized())
            else:
                click.echo(f"{name}: no #ELASTIC directives: the job is not elastic")
    ctx.exit(0 if result.ok else 1)
