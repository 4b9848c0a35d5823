"""``slurm-elastic check SCRIPT``: lint the ``#ELASTIC`` directives of a batch script.

Prints one line per problem on stderr, compiler style (``SCRIPT:LINE: --option: why (allowed: range)``), the
same checks and messages as the job_submit plugin gives at sbatch time, and a warning for a batch script without
a handler for its grace signal (it would die at the first shrink). On success it prints the normalized spec(s)
that the plugin would store on the job, a ``--prewarm`` command as text (the stored form keeps it in hex). Exit
status: 0 clean (warnings allowed), 1 errors or an unreadable script, 2 usage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from slurm_elastic.cli.check_pitfalls import grace_handler_warning
from slurm_elastic.cli.check_policy import effective_band, sbatch_scope
from slurm_elastic.cli.output import spec_text
from slurm_elastic.directives import parse_script
from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.sim.policy_adapter import load_policy_config


def _read(script: str) -> bytes:
    if script == "-":
        return sys.stdin.buffer.read()
    with open(script, "rb") as f:
        return f.read()


@click.command("check")
@click.argument("script", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON document on stdout.")
@click.option("--policy", "policy_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The site's policy file to compare a threshold set alone with (default: the packaged defaults).")
@click.option("--partition", help="The job's partition (default: the script's #SBATCH -p, else none).")
@click.option("--account", help="The job's account (default: the script's #SBATCH -A, else none).")
@click.pass_context
def check_cmd(  # noqa: PLR0917 - click passes every option by keyword
    ctx: click.Context, script: str, as_json: bool, policy_file: Path | None, partition: str | None,
    account: str | None,
) -> None:
    """Check the #ELASTIC directives of batch script SCRIPT ('-' reads stdin).

    Directives are read like sbatch reads #SBATCH: only in the comment block before the first command.
    See docs/directives.md for the options, their defaults and allowed ranges. A utilization threshold set
    alone is compared with the policy's other one for the job's partition and account (--policy).
    """
    name = "stdin" if script == "-" else script
    try:
        data = _read(script)
        cfg = load_policy_config(policy_file)
    except OSError as exc:
        click.echo(f"slurm-elastic check: error: cannot read {name}: {exc.strerror or exc}", err=True)
        ctx.exit(1)
    except SlurmElasticError as exc:
        click.echo(f"slurm-elastic check: error: {exc}", err=True)
        ctx.exit(1)
    result = parse_script(data)
    pitfalls = [p for spec in result.specs if (p := grace_handler_warning(name, data, spec)) is not None]
    in_script = sbatch_scope(data)
    bands = [effective_band(spec, cfg, partition or in_script[0], account or in_script[1]) for spec in result.specs]
    band_errors = [f"{name}: {p}" for b in bands if (p := b.problem()) is not None]
    if as_json:
        doc: dict[str, Any] = {
            "script": name,
            "ok": result.ok,
            "elastic": result.elastic,
            "specs": [s.to_dict() for s in result.specs],
            "errors": [e.to_dict() for e in result.errors],
            "warnings": [w.to_dict() for w in result.warnings],
            "pitfalls": pitfalls,
            "bands": [b.to_dict() for b in bands],
            "policy_errors": band_errors,
        }
        if band_errors:
            doc["ok"] = False
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        for w in result.warnings:
            click.echo(w.format(name), err=True)
        for text in dict.fromkeys(pitfalls):
            click.echo(text, err=True)
        for err in result.errors:
            click.echo(err.format(name), err=True)
        for text in band_errors:
            click.echo(text, err=True)
        if result.ok:
            if result.specs:
                for spec, band in zip(result.specs, bands, strict=True):
                    click.echo(spec_text(spec.to_normalized()))  # --prewarm as text, not the stored hex
                    one_given = (band.up_source == "script") != (band.down_source == "script")
                    if band.ok and one_given:
                        click.echo(f"  band {band.down}..{band.up}%: scale_down_below {band.down} "
                                   f"({band.down_source}), scale_up_above {band.up} ({band.up_source}); {band.scope}")
            else:
                click.echo(f"{name}: no #ELASTIC directives: the job is not elastic")
    ctx.exit(0 if result.ok and not band_errors else 1)
