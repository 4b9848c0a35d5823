"""Slurm hostlist expressions (``n[1-3,5],gpu[01-02]``) expanded and compressed without calling scontrol."""

from __future__ import annotations

import re
from collections.abc import Iterable

from slurm_elastic.slurm.errors import SlurmParseError

_MAX_HOSTS = 1_000_000  # guards against "n[0-999999999]" from hostile input


def _split_top_level(expr: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmParseError(f"unbalanced ']' in hostlist {expr!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise SlurmParseError(f"unbalanced '[' in hostlist {expr!r}")
    parts.append("".join(cur))
    return [p for p in (s.strip() for s in parts) if p]


def _expand_ranges(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for piece in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", piece.strip())
        if not m:
            raise SlurmParseError(f"bad range {piece!r} in hostlist {expr!r}")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise SlurmParseError(f"descending range {piece!r} in hostlist {expr!r}")
        if hi - lo >= _MAX_HOSTS:
            raise SlurmParseError(f"range {piece!r} in hostlist {expr!r} is too large")
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        out.extend(str(i).zfill(width) for i in range(lo, hi + 1))
    return out


def expand(expr: str | None) -> tuple[str, ...]:
    """``"n[1-2],x"`` -> ``("n1", "n2", "x")``. Empty or None gives ``()``."""
    if not expr:
        return ()
    hosts: list[str] = []
    for part in _split_top_level(expr):
        # Expand the first bracket group, then recurse for any further groups (e.g. rack[1-2]n[1-2]).
        m = re.match(r"^([^\[\]]*)\[([^\[\]]+)\](.*)$", part)
        if not m:
            if "[" in part or "]" in part:
                raise SlurmParseError(f"bad hostlist element {part!r}")
            hosts.append(part)
            continue
        prefix, body, rest = m.groups()
        for idx in _expand_ranges(body, expr):
            hosts.extend(expand(prefix + idx + rest) if "[" in rest else [prefix + idx + rest])
        if len(hosts) > _MAX_HOSTS:
            raise SlurmParseError(f"hostlist {expr[:80]!r} expands to too many hosts")
    return tuple(hosts)


def compress(hosts: Iterable[str]) -> str:
    """Inverse of :func:`expand` for simple ``prefix<number>`` names: ``n1,n2,n4`` -> ``n[1-2,4]``."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for h in hosts:
        m = re.fullmatch(r"(.*?)(\d+)", h)
        if not m:
            plain.append(h)
            order.append(h)
            continue
        prefix, digits = m.groups()
        width = len(digits) if digits.startswith("0") else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(digits))
    out: list[str] = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        prefix, width = item
        nums = sorted(set(groups[item]))
        if len(nums) == 1:
            out.append(f"{prefix}{str(nums[0]).zfill(width)}")
            continue
        ranges: list[str] = []
        start = prev = nums[0]
        for n in [*nums[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            a, b = str(start).zfill(width), str(prev).zfill(width)
            ranges.append(a if start == prev else f"{a}-{b}")
            if n is not None:
                start = prev = n
        out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(out)
