"""The renderings of the key declarations (slurm_elastic/keydocs.py) are committed as rendered, and the one
declaration is what every dialect reads: the policy's and the directives' shared keys, the config files'
dataclass defaults."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_elastic.agent.config import KEYS as AGENT_FILE_KEYS
from slurm_elastic.agent.config import AgentConfig
from slurm_elastic.controller.config import CONTROLLER_KEYS, ControllerConfig, parse_controller_config
from slurm_elastic.directives.options import BY_FIELD
from slurm_elastic.directives.spec import ElasticSpec
from slurm_elastic.keydocs import RENDERINGS, Rendering, fresh, render_range_vectors, stale
from slurm_elastic.keyschema import JOB_KEYS, Key, Kind
from slurm_elastic.policy.schema import BY_NAME

REPO = Path(__file__).resolve().parents[2]


def test_every_committed_rendering_is_fresh() -> None:
    assert stale(REPO) == [], "run scripts/render-keys"
    assert {r.path for r in RENDERINGS} == {"docs/policy.md", "docs/directives.md", "docs/configuration-keys.md",
                                            "plugins/job_submit.lua", "tests/vectors/key_ranges.json"}


def test_a_changed_declaration_makes_the_rendering_stale(tmp_path: Path) -> None:
    """The check can fail: a committed block that differs from the declarations is found, in docs and lua."""
    for path in ("docs/directives.md", "plugins/job_submit.lua"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        text = fresh(REPO)[path]
        (tmp_path / path).write_text(text.replace("default = 90", "default = 80").replace("| 90% |", "| 80% |"))
    rendered = [r for r in RENDERINGS if r.path in ("docs/directives.md", "plugins/job_submit.lua")]
    for r in rendered:
        text = (tmp_path / r.path).read_text()
        assert r.replaced(text) != text, r.path


def test_missing_markers_are_an_error() -> None:
    with pytest.raises(ValueError, match="markers"):
        Rendering("docs/x.md", "nothing", lambda: "").replaced("no markers here\n")


def test_the_script_checks_the_committed_files() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "render-keys"), "--check"], capture_output=True,
                          text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_directive_and_policy_share_one_declaration_with_the_packaged_defaults() -> None:
    for name, key in JOB_KEYS.items():
        assert BY_NAME[name].key is key and BY_FIELD[name].decl is key
        assert BY_NAME[name].directive
        assert getattr(ElasticSpec(), name) == key.default  # the spec's placeholder is what a job gets
    assert (ElasticSpec().scale_down_below, ElasticSpec().scale_up_above) == (20, 90)


def test_config_dataclass_defaults_are_the_declared_ones() -> None:
    cfg = parse_controller_config("version = 1\n")
    assert cfg == dataclasses.replace(ControllerConfig(), source="<string>")
    for name, key in CONTROLLER_KEYS.items():
        if key.default is not None:
            assert getattr(cfg, name) == key.default, name
    agent = AgentConfig(node="n1")
    for name, key in AGENT_FILE_KEYS.items():
        if key.default is not None and name != "node":
            want = Path(key.default) if key.kind is Kind.PATH else key.default
            assert getattr(agent, name) == want, name


@pytest.mark.parametrize(("key", "value", "problem"), [
    (Key(Kind.INT, 1, "d", 1, 10), 11, "11 out of range 1..10"),
    (Key(Kind.INT, 1, "d", 1, 10), True, "expected an integer, got a boolean"),
    (Key(Kind.NUMBER, 1.0, "d", 0.5), "x", "wrong type str (expected a number)"),
    (Key(Kind.STR, "", "d", check=lambda v: "bad" if v == "x" else None), "x", "bad"),
    (Key(Kind.NUMBER, 1.0, "d", 0.5), 0.75, None),
])
def test_key_problem_wording(key: Key, value: object, problem: str | None) -> None:
    assert key.problem(value) == problem


def test_units_and_ranges_render() -> None:
    assert JOB_KEYS["scale_up_above"].unit_text == "%" and JOB_KEYS["window_s"].unit_text == "s"
    assert JOB_KEYS["step"].unit_text == "nodes" and JOB_KEYS["window_s"].range_text() == "10..86400"
    assert Key(Kind.FLOAT, 0.5, "d", 0, 1).range_text() == "0.0..1.0"
    assert Key(Kind.NUMBER, 5.0, "d", 0.05).range_text() == ">= 0.05"


def _run_lua(interpreter: str, plugin: Path) -> subprocess.CompletedProcess[str]:
    lua = shutil.which(interpreter)
    assert lua, f"{interpreter} not found: run scripts/bootstrap (Debian package {interpreter})"
    return subprocess.run([lua, "run_vectors.lua", str(plugin), str(REPO / "tests" / "vectors" / "key_ranges.json")],
                          capture_output=True, text=True, timeout=120, check=False, cwd=REPO / "tests" / "lua")


@pytest.mark.parametrize("interpreter", ["lua5.1", "lua5.3"])
def test_the_plugin_takes_exactly_the_declared_ranges(interpreter: str) -> None:
    proc = _run_lua(interpreter, REPO / "plugins" / "job_submit.lua")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert len(json.loads(proc.stdout)["results"]) == len(json.loads(render_range_vectors())["cases"]) > 30


def test_a_plugin_with_another_range_fails_the_range_vectors(tmp_path: Path) -> None:
    text = (REPO / "plugins" / "job_submit.lua").read_text()
    wrong = tmp_path / "job_submit.lua"
    wrong.write_text(text.replace('field = "window_s", kind = "duration", default = 600, lo = 10, hi = 86400',
                                  'field = "window_s", kind = "duration", default = 600, lo = 10, hi = 86401', 1))
    assert wrong.read_text() != text
    proc = _run_lua("lua5.3", wrong)
    assert proc.returncode == 1 and "MISMATCH: range --window 86401" in proc.stderr


def test_the_library_bench_compares_like_with_like() -> None:
    """bench/key_schema.py's msgspec schema, built from the same declarations, takes the packaged policy and the
    controller example and refuses what the loaders refuse (a value out of range, an unknown key)."""
    import importlib.util

    import msgspec

    spec = importlib.util.spec_from_file_location("bench_key_schema", REPO / "bench" / "key_schema.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    policy, controller = bench._msgspec_types()
    policy_data = bench.tomllib.loads(bench.render_defaults_toml())
    controller_data = bench.tomllib.loads(bench._controller_text())
    controller_data["agents"].pop("urls")
    assert msgspec.convert(policy_data, policy).scale_up_above == 90
    assert msgspec.convert(controller_data, controller).controller.interval_s == 30
    for bad in ({**policy_data, "scale_up_above": 101}, {**policy_data, "scale_upabove": 1}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, policy)
