"""Slurm hostlist expressions (``n[1-3,5],gpu[01-02]``) expanded and compressed without calling scontrol.

Thin wrappers over python-hostlist (the kept library for Slurm's syntax: nested prefixes, zero padding, suffixes
after a range), turning its errors into :class:`SlurmParseError`. Measured against the hand-written parser it
replaced (2026-12-05, one process): expand ``node[00012-00015]`` 9.5 µs both, a single name 2.4 µs against
1.8 µs (a 51k-job squeue: ~0.01 s more per cycle), compress of 3,300 names 12 ms against 8 ms.
"""

from __future__ import annotations

from collections.abc import Iterable

import hostlist as _lib

from slurm_elastic.slurm.errors import SlurmParseError


def expand(expr: str | None) -> tuple[str, ...]:
    """``"n[1-2],x"`` -> ``("n1", "n2", "x")``, in order, duplicates kept. Empty or None gives ``()``. A bad
    expression (unbalanced brackets, a bad or descending range, over 100,000 names in a part) raises
    SlurmParseError."""
    if not expr:
        return ()
    try:
        return tuple(_lib.expand_hostlist(expr, allow_duplicates=True))
    except _lib.BadHostlist as e:
        raise SlurmParseError(f"bad hostlist {expr[:80]!r}: {e}") from None
    except RecursionError:  # thousands of bracket groups in one name: python-hostlist recurses per group
        raise SlurmParseError(f"bad hostlist {expr[:80]!r}: too many bracket groups") from None


def compress(hosts: Iterable[str]) -> str:
    """Inverse of :func:`expand`: ``n1,n2,n4`` -> ``n[1-2,4]`` (sorted and merged, as Slurm prints them)."""
    names = list(hosts)
    try:
        return str(_lib.collect_hostlist(names))
    except _lib.BadHostlist as e:
        raise SlurmParseError(f"bad host name in {names[:5]!r}: {e}") from None
