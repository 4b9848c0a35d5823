"""The command line loads a verb's module only when that verb runs: `slurm-elastic agent` (every node) and each
controller start must not pay for the store, the simulator or the MIG workflow."""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner

from slurm_elastic.cli import _VERBS, main

PROBE = """
import sys
from slurm_elastic.cli import main
try:
    main([{verb!r}, "--help"])
except SystemExit as e:
    assert e.code == 0, e.code
print(" ".join(sorted(sys.modules)))
"""


def loaded_after_help(verb: str) -> set[str]:
    cp = subprocess.run([sys.executable, "-c", PROBE.format(verb=verb)], capture_output=True, text=True,
                        check=True, timeout=120)
    return set(cp.stdout.split("\n")[-2].split())


def test_agent_loads_neither_the_store_nor_the_simulator_nor_the_mig_workflow() -> None:
    loaded = loaded_after_help("agent")
    assert "slurm_elastic.cli.agent_cmd" in loaded
    heavy = {"sqlalchemy", "slurm_elastic.store", "slurm_elastic.sim", "slurm_elastic.cli.mig_workflow_cmd",
             "slurm_elastic.cli.simulate_cmd", "slurm_elastic.cli.controller_cmd"}
    assert not heavy & loaded, heavy & loaded


def test_every_verb_resolves_under_its_name_and_help_lists_them_all() -> None:
    ctx = click.Context(main)
    for verb in _VERBS:
        command = main.get_command(ctx, verb)
        assert command is not None and command.name == verb
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    listed = result.output.split("Commands:")[1]
    assert all(f"  {verb} " in listed for verb in _VERBS), listed


def test_mig_has_the_workflow_subcommands_when_reached_through_main() -> None:
    result = CliRunner().invoke(main, ["mig", "--help"])
    assert result.exit_code == 0, result.output
    for sub in ("plan", "apply", "suggest", "catalog", "validate"):
        assert f"  {sub} " in result.output, result.output


def test_an_unknown_verb_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["frobnicate"])
    assert result.exit_code == 2 and "No such command 'frobnicate'" in result.output
