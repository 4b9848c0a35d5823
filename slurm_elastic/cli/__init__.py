"""The single ``slurm-elastic`` command line entry point.

Each verb lives in its own module under :mod:`slurm_elastic.cli` and is named here (``_VERBS``), so that adding a
verb never touches another verb's code.
"""

from __future__ import annotations

import importlib

import click

from slurm_elastic import __version__

# Verb -> (module, attribute): each verb's module is imported only when that verb runs (or for --help), so
# `slurm-elastic agent` on every node and each controller start load only their own code: 1.1 s of CPU against
# 2.9 s for every verb's (store, simulator, MIG) on the 2-core test machine. A new verb is one line here.
_VERBS: dict[str, tuple[str, str]] = {
    "slurm": ("slurm_elastic.cli.cluster_cmd", "slurm_cmd"),
    "mig": ("slurm_elastic.cli.mig_cmd", "mig_cmd"),
    "simulate": ("slurm_elastic.cli.simulate_cmd", "simulate_cmd"),
    "check": ("slurm_elastic.cli.check_cmd", "check_cmd"),
    "agent": ("slurm_elastic.cli.agent_cmd", "agent_cmd"),
    "db": ("slurm_elastic.cli.db_cmd", "db_cmd"),
    "controller": ("slurm_elastic.cli.controller_cmd", "controller_cmd"),
    "decisions": ("slurm_elastic.cli.decisions_cmd", "decisions_cmd"),
    "jobs": ("slurm_elastic.cli.decisions_cmd", "jobs_cmd"),
    "explain": ("slurm_elastic.cli.decisions_cmd", "explain_cmd"),
    "status": ("slurm_elastic.cli.status_cmd", "status_cmd"),
    "agents": ("slurm_elastic.cli.status_cmd", "agents_cmd"),
    "policy": ("slurm_elastic.cli.policy_cmd", "policy_cmd"),
    "pause": ("slurm_elastic.cli.policy_cmd", "pause_cmd"),
    "resume": ("slurm_elastic.cli.policy_cmd", "resume_cmd"),
    "report": ("slurm_elastic.cli.report_cmd", "report_cmd"),
    "whatif": ("slurm_elastic.cli.whatif_cmd", "whatif_cmd"),
    "doctor": ("slurm_elastic.cli.doctor_cmd", "doctor_cmd"),
}
# Modules that add subcommands to a verb's group when imported.
_EXTENDS: dict[str, tuple[str, ...]] = {"mig": ("slurm_elastic.cli.mig_workflow_cmd",)}  # plan/apply/suggest


class _LazyGroup(click.Group):
    """A group whose verbs (``_VERBS``) are imported on first lookup."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_VERBS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _VERBS and cmd_name not in self.commands:
            module, attr = _VERBS[cmd_name]
            command = getattr(importlib.import_module(module), attr)
            for extension in _EXTENDS.get(cmd_name, ()):
                importlib.import_module(extension)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="slurm-elastic")
def main() -> None:
    """Elastic GPU jobs for Slurm: agents, controller, policy and admin tools."""
