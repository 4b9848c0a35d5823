"""Parsers for the few ``scontrol -o`` text replies that 22.05 has no JSON for (partitions)."""

from __future__ import annotations

import re

from slurm_elastic.slurm import hostlist
from slurm_elastic.slurm.model import Partition

_KV = re.compile(r"(\w+)=(\S*)")


def parse_oneliner(line: str) -> dict[str, str]:
    """``Key=Value Key2=Value2`` (scontrol -o) -> dict. Values never contain spaces in these replies."""
    return {m.group(1): m.group(2) for m in _KV.finditer(line)}


def parse_partitions(text: str) -> tuple[Partition, ...]:
    parts: list[Partition] = []
    for line in text.splitlines():
        if not line.startswith("PartitionName="):
            continue
        kv = parse_oneliner(line)
        tier = kv.get("PriorityTier")
        parts.append(
            Partition(
                name=kv["PartitionName"],
                nodes=hostlist.expand(kv.get("Nodes")) if kv.get("Nodes") not in {None, "(null)"} else (),
                is_default=kv.get("Default") == "YES",
                priority_tier=int(tier) if tier and tier.isdigit() else None,
                state=kv.get("State"),
            )
        )
    return tuple(parts)
