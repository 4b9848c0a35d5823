"""Renderings of the key declarations (:mod:`slurm_elastic.keyschema`) that are committed beside the code.

Each :class:`Rendering` is a block between two marker lines in a file: the policy keys in docs/policy.md, the
``#ELASTIC`` option table in docs/directives.md, the config-file keys in docs/configuration-keys.md, and the
option table of plugins/job_submit.lua (which validates the directives inside slurmctld and can not import
Python); or a whole file: tests/vectors/key_ranges.json, the plugin's vectors at every declared bound.
``scripts/render-keys`` rewrites them; tests/unit/test_keys_rendered.py fails when a committed block
differs from a fresh rendering, so a key changed in one place can not leave its docs or the plugin behind.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_elastic.directives import parse_script
from slurm_elastic.directives.options import HET_GROUP_OPTION, OPTIONS, OptionKind
from slurm_elastic.directives.values import allowed_text, format_duration
from slurm_elastic.keyschema import Key


def _toml(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f'{k} = "{v}"' for k, v in value.items()) + " }"
    return str(value) if isinstance(value, int | float) else f'"{value}"'


def _unit(name: str, key: Key) -> str:
    """The declared unit, else the one the config files' naming rule gives: ``*_s`` seconds, ``*_days`` days."""
    if key.unit_text:
        return key.unit_text
    return "s" if name.endswith("_s") else "days" if name.endswith("_days") else ""


def render_config_markdown(sections: Mapping[str, Mapping[str, Key]]) -> str:
    """One table of every ``[section] key`` of a config file: kind, default, range, unit, meaning."""
    out = ["| key | type | default | range | unit | meaning |", "|---|---|---|---|---|---|"]
    for section, keys in sections.items():
        head = f"[{section}] " if section else ""
        for name, key in keys.items():
            out.append(f"| `{head}{name}` | {key.kind.value} | `{_toml(key.default)}` | {key.range_text()} | "
                       f"{_unit(name, key)} | {key.doc} |")
    return "\n".join(out) + "\n"


_VALUE = {OptionKind.INT: " N", OptionKind.PERCENT: " PCT", OptionKind.DURATION: " DURATION",
          OptionKind.SIGNAL: " SIG", OptionKind.FLAG: "", OptionKind.MILLIS: " LATENCY", OptionKind.COMMAND: " 'CMD'"}
_UNSET = {"--max-nodes": "node count at submit", "--het-group": "whole job"}


def render_options_markdown() -> str:
    """The option table of docs/directives.md."""
    out = ["| option | key | default | allowed | meaning |", "|---|---|---|---|---|"]
    for o in OPTIONS:
        if o.default is None:
            default = _UNSET.get(o.option, "none")
        elif o.kind is OptionKind.DURATION:
            assert isinstance(o.default, int)
            default = format_duration(o.default)
        elif o.kind is OptionKind.FLAG:
            default = "off"
        elif o.kind is OptionKind.PERCENT:
            default = f"{o.default}%"
        else:
            default = str(o.default)
        allowed = "see Signals" if o.kind is OptionKind.SIGNAL else (allowed_text(o) or "—")
        out.append(f"| `{o.option}{_VALUE[o.kind]}` | `{o.key}` | {default} | {allowed} | {o.doc} |")
    return "\n".join(out) + "\n"


def _lua(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int) else f'"{value}"'


def render_lua_options() -> str:
    """The ``M.OPTIONS`` table of plugins/job_submit.lua (one line per option)."""
    out = ["M.OPTIONS = {"]
    for o in OPTIONS:
        bounds = f", lo = {o.lo}, hi = {o.hi}" if o.lo is not None and o.hi is not None else ""
        head = f'  {{ option = "{o.option}", key = "{o.key}", field = "{o.field}", kind = "{o.kind.value}",'
        tail = f"default = {_lua(o.default)}{bounds} }},"
        line = f"{head} {tail}"
        out.extend([line] if len(line) <= 120 else [head, f"    {tail}"])  # the plugin's 120 columns
    out.append("}")
    return "\n".join(out) + "\n"


#: What an option needs beside it to be valid on its own (the rules between options).
_NEEDS = {"--slo-p99": "--serving ", "--target-rps-per-replica": "--serving ", "--prewarm-timeout": "--prewarm x "}


def render_range_vectors() -> str:
    """tests/vectors/key_ranges.json: for every option with a numeric range, a script at each bound (valid) and
    one past each (an error), in the shared vectors' format, so that plugins/job_submit.lua is run against the
    declared ranges (tests/unit/test_keys_rendered.py). The expectations are the Python parser's; rendering
    fails if the parser disagrees with the declaration about which values are valid."""
    cases = []
    for o in OPTIONS:
        if o.lo is None or o.hi is None or o.option == HET_GROUP_OPTION or o.kind is OptionKind.COMMAND:
            continue
        for value, valid in ((o.lo, True), (o.hi, True), (o.lo - 1, False), (o.hi + 1, False)):
            if value < 0:
                continue  # not a number the grammar can write
            script = f"#!/bin/bash\n#ELASTIC {_NEEDS.get(o.option, '')}{o.option} {value}\nsrun x\n"
            result = parse_script(script.encode())
            if result.ok != valid:
                raise AssertionError(f"{o.option} {value}: the parser says ok={result.ok}, the declaration {valid}")
            cases.append({"name": f"range {o.option} {value}", "valid": valid, "script": script, "expect": {
                "specs": [sp.to_normalized() for sp in result.specs],
                "errors": [[e.line, e.option, e.message, e.allowed] for e in result.errors],
                "warnings": [[w.line, w.message] for w in result.warnings]}})
    doc = {"comment": "Rendered by scripts/render-keys from slurm_elastic/directives/options.py (keydocs."
                      "render_range_vectors): each option's declared range at and past its bounds. Do not edit.",
           "cases": cases, "admin_comment": {"embed": [], "extract": []}}
    return json.dumps(doc, indent=1, ensure_ascii=True) + "\n"


def _controller_sections() -> Mapping[str, Mapping[str, Key]]:
    from slurm_elastic.controller.config import SECTIONS

    return SECTIONS


def _agent_sections() -> Mapping[str, Mapping[str, Key]]:
    from slurm_elastic.agent.config import KEYS

    return {"": KEYS}


def _mig_sections() -> Mapping[str, Mapping[str, Key]]:
    from slurm_elastic.configfile import AGENT_KEYS, STORE_KEYS
    from slurm_elastic.mig.config import MIG_KEYS

    return {"mig": MIG_KEYS, "agents": AGENT_KEYS, "store": STORE_KEYS}


def _policy_keys() -> str:
    from slurm_elastic.policy.schema import render_keys_markdown

    return render_keys_markdown()


@dataclass(frozen=True)
class Rendering:
    path: str  # relative to the repository root
    name: str  # the markers: <!-- NAME:begin --> ... <!-- NAME:end --> (markdown), -- NAME:begin ... (lua);
    render: Callable[[], str]  # "" for a file that is rendered whole

    def _markers(self) -> tuple[str, str]:
        if self.path.endswith(".lua"):
            return (f"-- {self.name}:begin (rendered by scripts/render-keys from slurm_elastic/directives/options.py;"
                    " do not edit)\n", f"-- {self.name}:end\n")
        return f"<!-- {self.name}:begin -->\n", f"<!-- {self.name}:end -->"

    def replaced(self, text: str) -> str:
        """``text`` with this block rendered afresh. Raises ValueError when the markers are missing."""
        if not self.name:
            return self.render()
        begin, end = self._markers()
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise ValueError(f"{self.path}: markers {begin.strip()!r} ... {end.strip()!r} not found")
        return pattern.sub(lambda _: begin + self.render() + end, text, count=1)


RENDERINGS: tuple[Rendering, ...] = (
    Rendering("docs/policy.md", "policy-keys", _policy_keys),
    Rendering("docs/directives.md", "directive-options", render_options_markdown),
    Rendering("docs/configuration-keys.md", "controller-keys", lambda: render_config_markdown(_controller_sections())),
    Rendering("docs/configuration-keys.md", "agent-keys", lambda: render_config_markdown(_agent_sections())),
    Rendering("docs/configuration-keys.md", "mig-keys", lambda: render_config_markdown(_mig_sections())),
    Rendering("plugins/job_submit.lua", "option-table", render_lua_options),
    Rendering("tests/vectors/key_ranges.json", "", render_range_vectors),
)


def fresh(root: Path) -> dict[str, str]:
    """Every rendered file's text as it should be: {path: text}."""
    out: dict[str, str] = {}
    for r in RENDERINGS:
        path = root / r.path
        text = out.get(r.path) or (path.read_text(encoding="utf-8") if path.exists() else "")
        out[r.path] = r.replaced(text)
    return out


def stale(root: Path) -> list[str]:
    """The files whose committed text differs from a fresh rendering."""
    return [path for path, text in fresh(root).items()
            if not (root / path).exists() or (root / path).read_text(encoding="utf-8") != text]


def write(root: Path) -> list[str]:
    """Render every block in place; the files that changed."""
    changed = stale(root)
    for path, text in fresh(root).items():
        if path in changed:
            (root / path).write_text(text, encoding="utf-8")
    return changed

