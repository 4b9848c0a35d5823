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
    from slurm_elastic.cli.mig_cmd import mig_cmd
    main.add_command(mig_cmd)
    from slurm_elastic.cli import mig_workflow_cmd  # noqa: F401, I001 - adds plan/apply/suggest to `mig`
    from slurm_elastic.cli.simulate_cmd import simulate_cmd; main.add_command(simulate_cmd)  # noqa: E702, I001
    from slurm_elastic.cli.check_cmd import check_cmd; main.add_command(check_cmd)  # noqa: E702, I001
    from slurm_elastic.cli.agent_cmd import agent_cmd; main.add_command(agent_cmd)  # noqa: E702, I001
    from slurm_elastic.cli.db_cmd import db_cmd; main.add_command(db_cmd)  # noqa: E702, I001
    from slurm_elastic.cli.controller_cmd import controller_cmd; main.add_command(controller_cmd)  # noqa: E702, I001
    from slurm_elastic.cli.decisions_cmd import decisions_cmd, jobs_cmd  # noqa: I001
    main.add_command(decisions_cmd)
    main.add_command(jobs_cmd)
    from slurm_elastic.cli.decisions_cmd import explain_cmd; main.add_command(explain_cmd)  # noqa: E702, I001
    from slurm_elastic.cli.status_cmd import agents_cmd, status_cmd  # noqa: I001
    main.add_command(status_cmd)
    main.add_command(agents_cmd)
    from slurm_elastic.cli.policy_cmd import pause_cmd, policy_cmd, resume_cmd  # noqa: I001
    main.add_command(policy_cmd)
    main.add_command(pause_cmd)
    main.add_command(resume_cmd)
    from slurm_elastic.cli.report_cmd import report_cmd; main.add_command(report_cmd)  # noqa: E702, I001
    from slurm_elastic.cli.whatif_cmd import whatif_cmd; main.add_command(whatif_cmd)  # noqa: E702, I001


_register()
