"""Parsing of Slurm GRES/TRES strings (``gpu:a100:4(S:0-1)``, ``gres:gpu:2``, ``gres/gpu=4``)."""

from __future__ import annotations

import re

from slurm_elastic.slurm.errors import SlurmParseError
from slurm_elastic.slurm.model import GresCount

_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_COUNT = re.compile(r"^(\d+)([KMGTP]?)$")


def _count(text: str, whole: str) -> int:
    m = _COUNT.match(text)
    if not m:
        raise SlurmParseError(f"bad GRES count {text!r} in {whole!r}")
    return int(m.group(1)) * _SUFFIX[m.group(2)]


def _split_entries(text: str) -> list[str]:
    """Split on commas that are not inside parentheses: ``gpu:2(IDX:0,2),mps:0``."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [e.strip() for e in out if e.strip()]


def parse_gres(text: str | None) -> tuple[GresCount, ...]:
    """Parse a node's gres / gres_used string. ``N/A``, ``(null)`` and empty give ``()``."""
    if not text or text.strip() in {"N/A", "(null)", "none"}:
        return ()
    result: list[GresCount] = []
    for raw in _split_entries(text):
        entry = re.sub(r"\([^()]*\)$", "", raw)  # drop (S:0-1) / (IDX:0-3) details
        entry = entry.removeprefix("gres:").removeprefix("gres/")
        fields = entry.split(":")
        if len(fields) == 1:  # "gpu" alone means one
            name, gtype, count = fields[0], None, 1
        elif len(fields) == 2:
            name, gtype, count = fields[0], None, _count(fields[1], text)
        elif len(fields) == 3:
            name, gtype, count = fields[0], fields[1], _count(fields[2], text)
        else:
            raise SlurmParseError(f"bad GRES entry {entry!r} in {text!r}")
        if gtype in {"(null)", ""}:
            gtype = None
        if not name:
            raise SlurmParseError(f"GRES entry without a name in {text!r}")
        result.append(GresCount(name=name, type=gtype, count=count))
    return tuple(result)


def parse_tres_per_node(text: str | None) -> tuple[GresCount, ...]:
    """``gres:gpu:2`` (22.05) or ``gres/gpu:2`` (23.02+); non-GRES TRES entries are ignored."""
    if not text:
        return ()
    entries = [e for e in _split_entries(text) if e.startswith(("gres:", "gres/"))]
    return parse_gres(",".join(entries)) if entries else ()
