"""Slurm-style output for every listing verb: an aligned table by default, ``-P/--parsable`` ('|'-separated,
like sacct -P), ``--json``, and ``-n/--noheader``."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def output_options(f: F) -> F:
    for opt in (
        click.option("-n", "--noheader", is_flag=True, help="no header line"),
        click.option("--json", "as_json", is_flag=True, help="JSON output"),
        click.option("-P", "--parsable", is_flag=True, help="'|'-separated output"),
    ):
        f = opt(f)
    return f


def emit(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, parsable: bool, as_json: bool,
         noheader: bool, json_rows: Sequence[dict[str, Any]] | None = None) -> None:
    if as_json:
        data = json_rows if json_rows is not None else [dict(zip(columns, r, strict=True)) for r in rows]
        click.echo(json.dumps(list(data), indent=2, default=str))
        return
    text = [["" if v is None else str(v) for v in r] for r in rows]
    if parsable:
        if not noheader:
            click.echo("|".join(columns))
        for r in text:
            click.echo("|".join(v.replace("|", "/").replace("\n", " ") for v in r))
        return
    widths = [max([len(c)] + [len(r[i]) for r in text]) for i, c in enumerate(columns)]
    if not noheader:
        click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for r in text:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def age(seconds: float) -> str:
    """Slurm-like elapsed time: 59s, 12:34, 3:02:01, 2-03:04:05."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def value_text(value: Any) -> str:
    """A decision input as text: strings as they are, everything else as JSON (``["n5"]``, ``null``, ``true``),
    never Python's repr."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), default=str)


def spec_text(normalized: str | None) -> str:
    """A stored normalized spec for people: the ``--prewarm`` command as text (shell-quoted), not the hex the
    stored form keeps it in (directives/spec.py); anything else as stored."""
    import shlex

    from slurm_elastic.directives.spec import SpecError, from_normalized

    if not normalized or "prewarm=" not in normalized:
        return normalized or ""
    try:
        command = from_normalized(normalized).prewarm
    except SpecError:
        return normalized
    if command is None:
        return normalized
    return " ".join(f"prewarm={shlex.quote(command)}" if t.startswith("prewarm=") else t
                    for t in normalized.split(" "))
