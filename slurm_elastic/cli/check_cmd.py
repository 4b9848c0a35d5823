"""``slurm-elastic check SCRIPT``: lint the ``#ELASTIC`` directives of a batch script.

Prints one line per problem on stderr, compiler style (``SCRIPT:LINE: --option: why (allowed: range)``), the
same checks and messages as the job_submit plugin gives at sbatch time, and a warning for a batch script without
a handler for its grace signal (it would die at the first shrink). On success it prints the normalized spec(s)
that the plugin would store on the job, a ``--prewarm`` command as text (the stored form keeps it in hex). Exit
status: 0 clean (warnings allowed), 1 errors or an unreadable script, 2 usage.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from typing import Any

import click

from slurm_elastic.cli.output import spec_text
from slurm_elastic.directives import parse_script
from slurm_elastic.directives.spec import ElasticSpec

SIGNAL_NUMBERS = {s.name.removeprefix("SIG"): int(s) for s in signal.Signals}


_TRAP = re.compile(rb"^\s*trap\s+(.*)$", re.MULTILINE)
_PY_HANDLER = re.compile(rb"signal\.signal\s*\(\s*signal\.SIG(\w+)")


def grace_handler_warning(name: str, data: bytes, spec: ElasticSpec) -> str | None:
    """A warning when the batch script has no handler for the job's grace signal: the controller sends it with
    ``scancel --signal=SIG --full``, which reaches the batch shell too, and a shell without a ``trap`` for it dies
    at the first shrink (the job ends FAILED 0:10 and its extensions are cancelled as orphans). None when the
    job never shrinks or the script handles the signal (a shell ``trap`` naming it, or Python's
    ``signal.signal(signal.SIG...)``)."""
    if not spec.shrink:
        return None
    sig = spec.signal.upper().removeprefix("SIG")
    number = str(SIGNAL_NUMBERS.get(sig, ""))
    for m in _TRAP.finditer(data):  # trap ACTION SIGNAL...: the signals are the last words
        names = {w.strip("'\";").upper().removeprefix("SIG") for w in m.group(1).decode("utf-8", "replace").split()}
        if sig in names or (number and number in names):
            return None
    if any(m.group(1).decode().upper() == sig for m in _PY_HANDLER.finditer(data)):
        return None
    return (f"{name}: warning: no handler for the grace signal SIG{sig}: the controller sends it with "
            f"'scancel --signal={sig} --full' before a shrink, which kills a batch shell without one (the job "
            f"ends FAILED 0:10); add e.g. \"trap 'echo checkpoint' {sig}\" before srun "
            f"(sbatch_templates/minimal.sbatch)")


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
    pitfalls = [p for spec in result.specs if (p := grace_handler_warning(name, data, spec)) is not None]
    if as_json:
        doc: dict[str, Any] = {
            "script": name,
            "ok": result.ok,
            "elastic": result.elastic,
            "specs": [s.to_dict() for s in result.specs],
            "errors": [e.to_dict() for e in result.errors],
            "warnings": [w.to_dict() for w in result.warnings],
            "pitfalls": pitfalls,
        }
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        for w in result.warnings:
            click.echo(w.format(name), err=True)
        for text in dict.fromkeys(pitfalls):
            click.echo(text, err=True)
        for err in result.errors:
            click.echo(err.format(name), err=True)
        if result.ok:
            if result.specs:
                for spec in result.specs:  # the --prewarm command as text, not the stored hex
                    click.echo(spec_text(spec.to_normalized()))
            else:
                click.echo(f"{name}: no #ELASTIC directives: the job is not elastic")
    ctx.exit(0 if result.ok else 1)
