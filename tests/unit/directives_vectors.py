"""Loads tests/vectors/directives.json, the vectors shared by the Python parser and plugins/job_submit.lua."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurm_elastic.directives import ParseResult, parse_script, select_component

REPO = Path(__file__).resolve().parents[2]
VECTORS_PATH = REPO / "tests" / "vectors" / "directives.json"
PLUGIN_PATH = REPO / "plugins" / "job_submit.lua"
LUA_DIR = REPO / "tests" / "lua"


def load() -> dict[str, Any]:
    with open(VECTORS_PATH, encoding="ascii") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def script_of(case: dict[str, Any]) -> bytes:
    if "script_hex" in case:
        return bytes.fromhex(case["script_hex"])
    if "script_parts" in case:
        return b"".join(text.encode("utf-8") * count for text, count in case["script_parts"])
    script: str = case["script"]
    return script.encode("utf-8")


def _errors(errors: Any) -> list[list[Any]]:
    return [[e.line, e.option, e.message, e.allowed] for e in errors]


def actual(result: ParseResult, components: Any = None) -> dict[str, Any]:
    """The Python parser's result in the vectors' 'expect' shape."""
    out: dict[str, Any] = {
        "specs": [s.to_normalized() for s in result.specs],
        "errors": _errors(result.errors),
        "warnings": [[w.line, w.message] for w in result.warnings],
    }
    if components is not None:
        out["components"] = {}
        for key in components:
            sel = select_component(result, None if key == "none" else int(key))
            out["components"][key] = {
                "spec": sel.spec.to_normalized() if sel.spec else None,
                "errors": _errors(sel.errors),
            }
    return out


def python_actual(case: dict[str, Any]) -> dict[str, Any]:
    return actual(parse_script(script_of(case)), case["expect"].get("components"))
