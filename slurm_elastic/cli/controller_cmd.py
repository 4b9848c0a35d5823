"""``slurm-elastic controller``: run the elastic controller (systemd runs this on the Slurm head node)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from slurm_elastic.controller.config import DEFAULT_CONFIG_PATH
from slurm_elastic.errors import SlurmElasticError


@click.command("controller")
@click.option("-c", "--config", "config_path", type=click.Path(path_type=Path), default=DEFAULT_CONFIG_PATH,
              show_default=True, help="controller TOML config")
@click.option("--once", is_flag=True, help="reconcile, run one cycle, exit (status 1 if the cycle failed)")
@click.option("--dry-run/--no-dry-run", default=None, help="override the config: record decisions, never act")
@click.option("-v", "--verbose", is_flag=True, help="debug logging")
def controller_cmd(config_path: Path, once: bool, dry_run: bool | None, verbose: bool) -> None:
    """Poll the agents, snapshot Slurm, decide, and grow or shrink elastic jobs through Slurm."""
    from slurm_elastic.controller.daemon import run

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("apscheduler", "asyncio"):  # one line per job run is noise in journald
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        sys.exit(run(config_path, once=once, dry_run=dry_run))
    except SlurmElasticError as e:
        click.echo(f"slurm-elastic controller: {e}", err=True)
        sys.exit(1)
