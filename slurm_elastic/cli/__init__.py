"""The single ``slurm-elastic`` command line entry point.

Each verb lives in its own module under :mod:`slurm_elastic.cli` and is registered here, so that adding a
verb never touches another verb's code.
"""

from __future__ import annotations

import click

from slurm_elastic import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="slurm-elastic")
def main() -> None:
    """Elastic GPU jobs for Slurm: agents, controller, policy and admin tools."""


def _register() -> None:
    # Imported late so that a verb's heavy dependencies load only with the package, not per verb definition.
    from slurm_elastic.cli import cluster_cmd

    main.add_command(cluster_cmd.slurm_cmd)


_register()
