"""plugins/job_submit.lua under Debian's Lua interpreters: the shared vectors, Python/Lua agreement, the
plugin's entry points.

Both interpreters are required (scripts/bootstrap installs them): Debian's slurmctld runs job_submit.lua
under Lua 5.1 (job_submit_lua.so links liblua5.1), and 5.3 is what the project's tooling documents.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

from slurm_elastic.directives.options import (
    MAX_DIRECTIVE_LINES,
    MAX_ERRORS,
    MAX_HET_GROUP,
    MAX_LINE_BYTES,
    MAX_NODES,
    MAX_WARNINGS,
    OPTIONS,
    SIGNALS,
    UNCATCHABLE_SIGNALS,
)
from slurm_elastic.directives.spec import FORMAT_TAG
from slurm_elastic.directives.values import QUOTE_MAX_BYTES

from .directives_vectors import LUA_DIR, PLUGIN_PATH, VECTORS_PATH, load, python_actual

INTERPRETERS = ["lua5.1", "lua5.3"]


def _lua(interpreter: str) -> str:
    path = shutil.which(interpreter)
    assert path, f"{interpreter} not found: run scripts/bootstrap (Debian package {interpreter})"
    return path


def _run(interpreter: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_lua(interpreter), *args], capture_output=True, text=True, timeout=120, check=False, cwd=LUA_DIR
    )


@pytest.fixture(scope="module", params=INTERPRETERS)
def lua_run(request: pytest.FixtureRequest) -> dict[str, Any]:
    proc = _run(request.param, "run_vectors.lua", str(PLUGIN_PATH), str(VECTORS_PATH))
    assert proc.returncode == 0, f"{request.param}: {proc.stderr[-4000:]}"
    doc: dict[str, Any] = json.loads(proc.stdout)
    doc["interpreter"] = request.param
    return doc


def test_lua_passes_every_vector(lua_run: dict[str, Any]) -> None:
    assert lua_run["failures"] == 0
    assert lua_run["load_rc"] == 0  # the chunk returns slurm.SUCCESS, as slurmctld expects
    assert lua_run["lua"] == {"lua5.1": "Lua 5.1", "lua5.3": "Lua 5.3"}[lua_run["interpreter"]]


def test_lua_and_python_agree_on_every_case(lua_run: dict[str, Any]) -> None:
    cases = load()["cases"]
    results = {r["name"]: r["actual"] for r in lua_run["results"]}
    assert len(results) == len(cases)
    for case in cases:
        assert results[case["name"]] == python_actual(case), case["name"]


def test_lua_option_table_is_the_python_one(lua_run: dict[str, Any]) -> None:
    python_options = [
        {"option": o.option, "key": o.key, "field": o.field, "kind": o.kind.value, "default": o.default,
         "lo": o.lo, "hi": o.hi}
        for o in OPTIONS
    ]
    assert lua_run["options"] == python_options
    assert lua_run["signals"] == [[name, num] for name, num in SIGNALS.items()]
    assert lua_run["uncatchable_signals"] == [[name, num] for name, num in UNCATCHABLE_SIGNALS.items()]
    assert lua_run["format_tag"] == FORMAT_TAG
    assert lua_run["limits"] == {
        "max_line_bytes": MAX_LINE_BYTES,
        "max_directive_lines": MAX_DIRECTIVE_LINES,
        "max_errors": MAX_ERRORS,
        "max_warnings": MAX_WARNINGS,
        "max_het_group": MAX_HET_GROUP,
        "max_nodes": MAX_NODES,
        "quote_max_bytes": QUOTE_MAX_BYTES,
    }


@pytest.mark.parametrize("interpreter", INTERPRETERS)
def test_plugin_entry_points(interpreter: str) -> None:
    proc = _run(interpreter, "test_plugin.lua", str(PLUGIN_PATH))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " 0 failed" in proc.stdout


@pytest.mark.parametrize("interpreter", INTERPRETERS)
def test_lua_driver_fails_on_a_wrong_expectation(interpreter: str, tmp_path: Any) -> None:
    """The driver must not pass vacuously: a vector with a wrong expectation makes it exit 1."""
    doc = load()
    doc["cases"] = [doc["cases"][0]]
    doc["cases"][0]["expect"]["specs"] = ["elastic:v1 max=99"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc), encoding="ascii")
    proc = _run(interpreter, "run_vectors.lua", str(PLUGIN_PATH), str(bad))
    assert proc.returncode == 1
    assert "MISMATCH: minimal" in proc.stderr
