"""Property tests of the #ELASTIC parser: it never fails with anything but its typed result, normalized specs
round-trip, and (differential) plugins/job_submit.lua agrees with it on thousands of generated scripts."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_elastic.directives import (
    ElasticSpec,
    ParseResult,
    SpecFormatError,
    embed,
    extract,
    from_normalized,
    parse_script,
)
from slurm_elastic.directives.options import MAX_ERRORS, MAX_WARNINGS, SIGNALS

from .directives_vectors import LUA_DIR, PLUGIN_PATH, actual

PROFILE = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WORDS = ["#ELASTIC", "#ELASTIC ", " ", "\t", "\n", "\r\n", "--", "=", "#", "-", "%", ":", "srun x\n", "# ELASTIC",
         "--min-nodes", "--max-nodes", "--step", "--scale-up-above", "--scale-down-below", "--window",
         "--cooldown", "--grace", "--signal", "--het-group", "--no-grow", "--no-shrink", "0", "1", "2", "4", "40",
         "80", "100", "65536", "1h30m", "05:00", "1-00:00:00", "90s", "USR1", "sigterm", "KILL", "9", "\x00",
         "\xff", "é", "#SBATCH -N 2\n", "#!/bin/bash\n"]


def directive_soup() -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(WORDS), max_size=80).map("".join)


def check_invariants(result: ParseResult, script: bytes) -> None:
    assert isinstance(result, ParseResult)
    if result.errors:
        assert result.specs == ()
    assert len(result.errors) <= MAX_ERRORS + 1
    assert len(result.warnings) <= MAX_WARNINGS
    n_lines = script.count(b"\n") + 1
    for e in result.errors:
        assert 1 <= e.line <= n_lines
        assert e.option == "#ELASTIC" or e.option.startswith("--")
        for text in (e.option, e.message, e.allowed or ""):
            assert text.isascii() and text.isprintable()
    for spec in result.specs:
        assert from_normalized(spec.to_normalized()) == spec


@PROFILE
@given(st.binary(max_size=2000))
def test_never_raises_on_bytes(script: bytes) -> None:
    check_invariants(parse_script(script), script)


@PROFILE
@given(st.text(max_size=500))
def test_never_raises_on_text(script: str) -> None:
    result = parse_script(script)
    check_invariants(result, script.encode("utf-8", "surrogatepass"))


@PROFILE
@given(directive_soup())
def test_never_raises_on_directive_soup(script: str) -> None:
    check_invariants(parse_script(script), script.encode("utf-8"))


@PROFILE
@given(st.text(max_size=200))
def test_from_normalized_only_raises_its_error(text: str) -> None:
    try:
        spec = from_normalized(text)
    except SpecFormatError:
        return
    assert spec.to_normalized() == text


# --- generated valid specs, written in every way the grammar allows ------------------------------------------


def _duration(seconds: int, how: int) -> str:
    if how == 0:
        return str(seconds)
    if how == 1:
        return f"{seconds}s"
    if how == 2 and seconds % 60 == 0:
        return f"{seconds // 60}m"
    if how == 3:
        h, rest = divmod(seconds, 3600)
        return f"{h:02d}:{rest // 60:02d}:{rest % 60:02d}"
    if how == 4:
        d, rest = divmod(seconds, 86400)
        h, rest = divmod(rest, 3600)
        return "".join(f"{n}{u}" for n, u in ((d, "d"), (h, "h"), (rest // 60, "m"), (rest % 60, "s")) if n) or "0s"
    return f"{seconds // 60}:{seconds % 60:02d}"


@st.composite
def spec_and_script(draw: st.DrawFn) -> tuple[ElasticSpec, str]:
    values: dict[str, Any] = {}
    words: list[tuple[str, str | None]] = []

    def take(option: str, field: str, value: Any, text: str | None) -> None:
        values[field] = value
        words.append((option, text))

    if draw(st.booleans()):
        take("--min-nodes", "min_nodes", mn := draw(st.integers(1, 64)), str(mn))
        if draw(st.booleans()):
            take("--max-nodes", "max_nodes", mx := draw(st.integers(mn, 65536)), str(mx))
    elif draw(st.booleans()):
        take("--max-nodes", "max_nodes", mx := draw(st.integers(1, 65536)), str(mx))
    if draw(st.booleans()):
        take("--step", "step", s := draw(st.integers(1, 65536)), str(s))
    up = draw(st.integers(1, 100)) if draw(st.booleans()) else None
    down = draw(st.integers(0, (up if up is not None else 80) - 1)) if draw(st.booleans()) else None
    if up is not None and down is None and up <= 40:
        down = draw(st.integers(0, up - 1))
    if up is not None:
        take("--scale-up-above", "scale_up_above", up, f"{up}%" if draw(st.booleans()) else str(up))
    if down is not None:
        take("--scale-down-below", "scale_down_below", down, str(down))
    for option, field, lo, hi in (("--window", "window_s", 10, 86400), ("--cooldown", "cooldown_s", 0, 86400),
                                  ("--grace", "grace_s", 0, 3600)):
        if draw(st.booleans()):
            sec = draw(st.integers(lo, hi))
            take(option, field, sec, _duration(sec, draw(st.integers(0, 5))))
    if draw(st.booleans()):
        name = draw(st.sampled_from(sorted(SIGNALS)))
        form = draw(st.integers(0, 3))
        written = [name, f"SIG{name}", name.lower(), str(SIGNALS[name])][form]
        take("--signal", "signal", name, written)
    flag = draw(st.sampled_from([None, "--no-grow", "--no-shrink"]))
    if flag:
        take(flag, flag[5:], False, None)
    het = draw(st.one_of(st.none(), st.integers(0, 127)))

    draw(st.randoms()).shuffle(words)
    tokens = []
    for option, text in words:
        if text is None:
            tokens.append(option)
        elif draw(st.booleans()):
            tokens.append(f"{option}={text}")
        else:
            tokens.append(f"{option}{draw(st.sampled_from([' ', chr(9), '  ']))}{text}")
    lines: list[list[str]] = [[]]
    for token in tokens:
        if lines[-1] and draw(st.integers(0, 3)) == 0:
            lines.append([])
        lines[-1].append(token)
    if het is not None:
        for line in lines:
            line.insert(draw(st.integers(0, len(line))), f"--het-group {het}")
    body = "".join(
        "#ELASTIC " + " ".join(line) + (" # note" if draw(st.booleans()) else "") + "\n" for line in lines)
    script = "#!/bin/bash\n#SBATCH -N 2\n" + body + "srun python train.py\n"
    spec = ElasticSpec(het_group=het, explicit=frozenset(values), **values)
    return spec, script


@PROFILE
@given(spec_and_script())
def test_generated_valid_scripts_give_their_spec(case: tuple[ElasticSpec, str]) -> None:
    spec, script = case
    result = parse_script(script)
    assert result.errors == (), result.errors
    assert result.specs == (spec,)
    text = spec.to_normalized()
    assert from_normalized(text) == spec
    assert from_normalized(text).to_normalized() == text
    assert extract(embed("admin note [x]", text)) == text


@PROFILE
@given(st.one_of(st.none(), st.text(max_size=100)), spec_and_script())
def test_embed_then_extract(admin_comment: str | None, case: tuple[ElasticSpec, str]) -> None:
    body = case[0].to_normalized()
    assert extract(embed(admin_comment, body)) == body
    again = embed(embed(admin_comment, body), body)
    assert again == embed(admin_comment, body)  # idempotent: resubmitting does not grow the comment


# --- differential: the Lua plugin and the Python parser on the same generated scripts ----------------------


def _generated_cases(n: int) -> list[dict[str, Any]]:
    rng = random.Random(20240601)
    cases = []
    for i in range(n):
        parts = [rng.choice(WORDS) for _ in range(rng.randrange(1, 60))]
        if rng.random() < 0.1:
            parts.insert(rng.randrange(len(parts)), bytes([rng.randrange(256)]).decode("latin-1"))
        data = "".join(parts).encode("utf-8")
        result = parse_script(data)
        cases.append({"name": f"generated {i}", "valid": result.ok, "script_hex": data.hex(),
                      "expect": actual(result, ["none", "0", "1"])})
    return cases


@pytest.mark.parametrize("interpreter", ["lua5.1", "lua5.3"])
def test_lua_agrees_with_python_on_generated_scripts(interpreter: str, tmp_path: Path) -> None:
    lua = shutil.which(interpreter)
    assert lua, f"{interpreter} not found: run scripts/bootstrap"
    doc: dict[str, Any] = {"cases": _generated_cases(3000), "admin_comment": {"embed": [], "extract": []}}
    assert sum(c["valid"] for c in doc["cases"]) > 300  # the soup reaches valid scripts too
    vectors = tmp_path / "generated.json"
    vectors.write_text(json.dumps(doc), encoding="ascii")
    proc = subprocess.run([lua, "run_vectors.lua", str(PLUGIN_PATH), str(vectors)], capture_output=True,
                          text=True, timeout=300, check=False, cwd=LUA_DIR)
    assert proc.returncode == 0, proc.stderr[-4000:]
