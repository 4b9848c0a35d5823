"""``slurm-elastic slurm show``: what slurm-elastic reads from Slurm, through the same adapter the controller uses."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import datetime
from typing import Any

import click

from slurm_elastic.policy.fragmentation import snapshot_fragmentation
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.errors import SlurmError


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not f.name.startswith("_")}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


@click.group("slurm")
def slurm_cmd() -> None:
    """Inspect Slurm through slurm-elastic's adapter."""


@slurm_cmd.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print the whole snapshot as JSON.")
def show(as_json: bool) -> None:
    """Nodes (with GPUs) and jobs as the controller sees them, the nodes' leaf switches (topology/tree), and the
    GPUs stranded on partly used nodes (free there, but no waiting job asks for so few per node)."""
    try:
        snap = SlurmCli(topology=True).snapshot()
    except SlurmError as e:
        click.echo(f"slurm-elastic: {e}", err=True)
        sys.exit(1)
    frag = snapshot_fragmentation(snap)
    if as_json:
        click.echo(json.dumps({**_jsonable(snap), "fragmentation": frag.as_dict()}, indent=2))
        return
    click.echo(f"Slurm {snap.slurm_version} ({snap.data_parser}), {len(snap.nodes)} nodes, {len(snap.jobs)} jobs")
    click.echo(f"{'NODE':<10}{'STATE':<12}{'GPUS':>5}{'USED':>6}  {'SWITCH':<10}PARTITIONS")
    for n in snap.nodes:
        click.echo(f"{n.name:<10}{n.state.lower():<12}{n.gpus():>5}{n.gpus_used():>6}  "
                   f"{snap.leaf_switch.get(n.name, '-'):<10}{','.join(n.partitions)}")
    click.echo(f"{'JOBID':<10}{'USER':<8}{'ACCOUNT':<9}{'STATE':<10}{'NODES':>5}{'GPU/N':>6}  NODELIST")
    for j in snap.jobs:
        click.echo(f"{j.display_id:<10}{j.user:<8}{(j.account or ''):<9}{j.state:<10}{j.node_count:>5}"
                   f"{j.gpus_per_node():>6}  {','.join(j.nodes)}")
    click.echo(f"GPUs free on {frag.partial_nodes} partly used node(s): {frag.free_on_partial}, "
               f"stranded (no waiting job fits them): {frag.stranded}")
