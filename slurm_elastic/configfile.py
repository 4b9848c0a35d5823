"""The config layer shared by the TOML loaders (controller.toml, mig.toml, agent.toml; the policy has its own
table in policy/schema.py and uses :func:`suggest` and :class:`KeyLines` from here).

A loader describes each table as ``{name: Key}`` (:class:`slurm_elastic.keyschema.Key`: kind, range, default,
doc, unit) and calls :func:`check_table`:
unknown keys are refused with a "did you mean" from difflib, wrong types and out-of-range values name the key,
and every problem carries the line of the file it comes from (tomllib reports none, so :class:`KeyLines` finds
``key =`` inside its ``[section]`` in the text). Problems are collected, then raised together as one
:class:`~slurm_elastic.errors.ConfigError`.

The ``[agents]`` and ``[store]`` sections mean the same in controller.toml and mig.toml (:data:`AGENT_KEYS`,
:data:`STORE_KEYS`). Keys that moved are in :data:`MOVED`: the old spelling still works for one release with a
warning naming the new key (a restart after an upgrade must not stop the daemon), both at once are an error.
"""

from __future__ import annotations

import difflib
import logging
import re
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_elastic.errors import ConfigError
from slurm_elastic.keyschema import AGENT_KEY_FILE, Key, Kind

__all__ = ["Key", "Kind"]  # the one key declaration (keyschema.py), re-exported for the loaders

log = logging.getLogger(__name__)

def suggest(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known name, or ""."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_.\- ]+?)\s*=""")


def _parts(dotted: str) -> tuple[str, ...]:
    return tuple(p.strip().strip("\"'") for p in dotted.split("."))


class KeyLines:
    """Where each key is defined in a TOML text: ``line(("agents", "timeout_s"))`` -> 1-based line or None.

    A small scan, not a parser: ``[a.b]`` headers, ``key =`` and dotted ``a.b =`` lines; keys inside inline
    tables and multi-line values are not found (the problem is then reported without a line)."""

    def __init__(self, text: str) -> None:
        self._lines: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        for n, line in enumerate(text.splitlines(), 1):
            header = _HEADER.match(line)
            if header:
                table = _parts(header.group(1))
                self._lines.setdefault(table, n)
                continue
            key = _KEY.match(line)
            if key:
                self._lines.setdefault(table + _parts(key.group(1)), n)

    def line(self, path: Sequence[str]) -> int | None:
        return self._lines.get(tuple(path))


@dataclass
class Problems:
    """Problems found in one file, each as ``line N: path: why``; :meth:`raise_if_any` raises them together."""

    source: str
    lines: KeyLines | None = None
    items: list[str] = field(default_factory=list)

    def add(self, path: str, why: str) -> None:
        n = self.lines.line(path.split(".")) if self.lines is not None else None
        self.items.append(f"line {n}: {path}: {why}" if n is not None else f"{path}: {why}")

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            raise ConfigError(f"{self.source}: " + "; ".join(self.items))


def with_lines(problems: Iterable[str], text: str) -> list[str]:
    """``path: why`` problems (a loader's own list) with ``line N: `` in front where the path's key is found."""
    lines = KeyLines(text)
    out = []
    for p in problems:
        n = lines.line(p.split(":", 1)[0].strip().split("."))
        out.append(f"line {n}: {p}" if n is not None else p)
    return out


def check_table(table: Any, keys: Mapping[str, Key], where: str, problems: Problems) -> dict[str, Any]:
    """The valid keys of ``table`` (a TOML table at dotted path ``where``; "" for the top level); every other key
    is a problem. Defaults are not filled in: a loader tells "unset" from "set to the default"."""
    if not isinstance(table, dict):
        problems.add(where, "must be a table")
        return {}
    out: dict[str, Any] = {}
    for name, value in table.items():
        path = f"{where}.{name}" if where else name
        key = keys.get(name)
        if key is None:
            problems.add(path, f"unknown key{suggest(name, keys)} (known: {', '.join(keys)})")
            continue
        why = key.problem(value)
        if why is not None:
            problems.add(path, why)
            continue
        out[name] = value
    return out


def check_sections(data: Mapping[str, Any], known: Iterable[str], problems: Problems) -> None:
    known = list(known)
    for name in data:
        if name not in known:
            problems.add(name, f"unknown section{suggest(name, known)} (known: {', '.join(sorted(known))})")


def describe(section: str, keys: Mapping[str, Key]) -> list[str]:
    """One line per key: ``[section] name = default: doc``."""
    def toml(value: Any) -> str:
        if value is None:
            return "(unset)"
        if isinstance(value, bool):
            return str(value).lower()
        return str(value) if isinstance(value, int | float) else f'"{value}"'

    head = f"[{section}] " if section else ""
    return [f"{head}{name} = {toml(k.default)}: {k.doc}" for name, k in keys.items()]


# ---- the sections controller.toml and mig.toml share --------------------------------------------------------


def _url_template(value: str) -> str | None:
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(value) if f is not None}
    except ValueError as e:
        return f"not a valid template ({e})"
    if fields - {"node", "address"}:
        return f"only {{node}} and {{address}} may be used, not {', '.join(sorted(fields - {'node', 'address'}))}"
    return None


def _urls(value: dict[str, Any]) -> str | None:
    bad = sorted(n for n, u in value.items() if not isinstance(u, str) or not u.startswith(("http://", "https://")))
    return f"each must be an http(s) URL (not: {', '.join(bad)})" if bad else None


def _not_empty(value: str) -> str | None:
    return None if value.strip() else "must not be empty"


def _auth_kind(value: str) -> str | None:
    return None if value in ("hmac", "munge") else "must be 'hmac' or 'munge'"


#: ``[agents]``: how the controller and the MIG workflow reach the node agents.
AGENT_KEYS: dict[str, Key] = {
    "auth": Key(Kind.STR, "hmac", "how requests to the agents are authenticated: 'hmac' (key_file) or 'munge' (the "
                "site's MUNGE key); the agents' auth must say the same", check=_auth_kind),
    "key_file": Key(Kind.PATH, AGENT_KEY_FILE, "auth = \"hmac\": shared key of the agents (mode 0600; the "
                    "agent's key_file default too); the controller and the MIG workflow refuse to start when it is "
                    "missing or readable beyond its owner", check=_not_empty),
    "munge_socket": Key(Kind.STR, "/run/munge/munge.socket.2", "auth = \"munge\": munged's socket on this host"),
    "munge_agent_user": Key(Kind.STR, "root", "auth = \"munge\": the user (name or uid) the agents run as; answers "
                            "whose credential carries another uid are refused"),
    "munge_ttl_s": Key(Kind.INT, 60, "auth = \"munge\": TTL of the credentials sent to the agents (at most the "
                       "agents' munge_max_ttl_s)", 1, 3600),
    "url_template": Key(Kind.STR, "http://{address}:9817", "agent URL; {node} is the Slurm node name, {address} its "
                        "NodeAddr (Slurm's default NodeAddr is the node name)", check=_url_template),
    "timeout_s": Key(Kind.NUMBER, None, "timeout of one agent read (default: 5 in the controller, 10 in the "
                     "MIG workflow)", 0.1, 300),
    "apply_timeout_s": Key(Kind.NUMBER, 600.0, "MIG workflow: timeout of one MIG apply on an agent", 1, 7200),
    "urls": Key(Kind.TABLE, None, "per-node agent URLs that override url_template, e.g. { n1 = \"http://...\" }",
                check=_urls),
}

def agent_values(agents: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    """``[agents]`` (checked against :data:`AGENT_KEYS`) as the typed fields the controller's ``AgentsConfig`` and
    the MIG workflow's ``AgentAccess`` share, so that the section means the same in both files: an unset key gets
    the schema's default, ``timeout_s`` the caller's (the key has none: 5 s in the controller, 10 in the MIG
    workflow). ``apply_timeout_s`` is the MIG workflow's alone."""
    def get(key: str) -> Any:
        return agents.get(key, AGENT_KEYS[key].default)

    return {"key_file": Path(get("key_file")), "auth": str(get("auth")), "munge_socket": str(get("munge_socket")),
            "munge_agent_user": str(get("munge_agent_user")), "munge_ttl_s": int(get("munge_ttl_s")),
            "url_template": str(get("url_template")), "timeout_s": float(agents.get("timeout_s", timeout_s)),
            "urls": dict(agents.get("urls") or {})}


#: ``[store]``: the state DB (docs/store.md).
STORE_KEYS: dict[str, Key] = {
    "url": Key(Kind.STR, "sqlite:////var/lib/slurm-elastic/state.db", "SQLAlchemy URL of the state DB"),
    "table_prefix": Key(Kind.STR, "", "table prefix: several stores in one shared database (tests, staging)"),
}

#: Old spelling -> new spelling, accepted for one release with a warning.
MOVED: dict[str, str] = {
    "controller.db_url": "store.url",
    "controller.table_prefix": "store.table_prefix",
    "mig.db_url": "store.url",
    "mig.table_prefix": "store.table_prefix",
}


def take_moved(data: dict[str, Any], problems: Problems, warn: Callable[[str], None] | None = None) -> None:
    """Move old spellings (:data:`MOVED`) found in ``data`` to their new place, warning once per key; an old and
    a new spelling of the same key together are a problem (which one was meant?)."""
    for old, new in MOVED.items():
        old_section, old_key = old.split(".")
        new_section, new_key = new.split(".")
        table = data.get(old_section)
        if not isinstance(table, dict) or old_key not in table:
            continue
        value = table.pop(old_key)
        target = data.setdefault(new_section, {})
        if not isinstance(target, dict):
            continue  # reported by the section check
        if new_key in target:
            problems.add(old, f"set twice: remove it and keep {new} (it replaced {old})")
            continue
        target[new_key] = value
        (warn or log.warning)(f"{problems.source}: {old} is deprecated and will be refused in the next release; "
                              f"write it as [{new_section}] {new_key} = ... instead")
