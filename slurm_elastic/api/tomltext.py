"""Policy text edits for ``policy set KEY=VALUE`` (pure): dotted keys into the TOML tables, values read as TOML
(``70``, ``true``, ``"USR2"``, ``[1, 2]``; a bare word is taken as a string), written back with tomli-w in a
fixed order. Nothing is ever evaluated as code."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from typing import Any

import tomli_w

from slurm_elastic.errors import SlurmElasticError

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


class PolicyEditError(SlurmElasticError):
    """A ``KEY=VALUE`` assignment that cannot be applied."""


def parse_assignment(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key:
        raise PolicyEditError(f"{text!r}: expected KEY=VALUE (e.g. scale_up_above=70 or partition.gpu.grace_s=60)")
    path = key.split(".")
    if any(not _BARE.match(p) for p in path):
        raise PolicyEditError(f"{key!r}: keys are dotted names of letters, digits, '_' and '-'")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if not _BARE.match(raw):
            raise PolicyEditError(f"{text!r}: {raw!r} is not a TOML value") from None
        value = raw
    return path, value


def apply_assignments(data: Mapping[str, Any], assignments: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = _copy(data)
    for text in assignments:
        path, value = parse_assignment(text)
        table = out
        for part in path[:-1]:
            nxt = table.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise PolicyEditError(f"{text!r}: {part} is a value, not a table")
            table = nxt
        table[path[-1]] = value
    return out


def _copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def _ordered(body: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level scalars first (``version`` leading, then by name), then the tables by name, depth first."""
    scalars = sorted(((k, v) for k, v in body.items() if not isinstance(v, Mapping)),
                     key=lambda kv: (kv[0] != "version", kv[0]))
    tables = sorted((k, _ordered(v)) for k, v in body.items() if isinstance(v, Mapping))
    return dict(scalars + tables)


def dumps(data: Mapping[str, Any]) -> str:
    """TOML text (tomli-w); top-level scalars first (``version`` leading), then the tables depth first."""
    try:
        return tomli_w.dumps(_ordered(data))
    except (TypeError, ValueError) as e:
        raise PolicyEditError(f"cannot write this policy as TOML: {e}") from None
