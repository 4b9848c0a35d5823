"""Slurm's network topology (topology/tree): which leaf switch each node hangs off.

Read from ``scontrol show topology``, one line per switch (recorded from a 22.05 controller with the
topology.conf of tests/fixtures/slurm/22.05/topology.conf)::

    SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=n[1-3]
    SwitchName=spine Level=1 LinkSpeed=1 Nodes=n[1-6] Switches=leaf[1-2]

A leaf switch is one of ``Level=0``; its ``Nodes`` are the nodes it connects. Without a topology plugin,
scontrol prints nothing on stdout (``No topology information available`` on stderr, exit 0): no leaf switches.
Lines that name no switch (other topology plugins' output) are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping

from slurm_elastic.slurm import hostlist
from slurm_elastic.slurm.errors import SlurmParseError


def _fields(line: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out


def parse_leaf_switches(text: str) -> Mapping[str, str]:
    """Node -> its leaf switch, from ``scontrol show topology``. A node under two leaf switches keeps the first
    (Slurm warns of such a topology.conf itself)."""
    leaf_of: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        f = _fields(line)
        name = f.get("SwitchName")
        if not name:
            continue
        level = f.get("Level", "")
        if not level.isdigit():
            raise SlurmParseError(f"scontrol show topology line {number}: switch {name} has no Level ({line!r})")
        if int(level) != 0:
            continue
        nodes = f.get("Nodes")
        if not nodes or nodes == "(null)":
            continue
        for node in hostlist.expand(nodes):
            leaf_of.setdefault(node, name)
    return leaf_of
