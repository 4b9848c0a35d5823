"""The shared vectors through the Python parser (the Lua side: test_directives_lua.py)."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_elastic.directives import ElasticSpec, embed, extract, parse_script

from .directives_vectors import load, python_actual, script_of

VECTORS = load()
CASES = VECTORS["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_vector(case: dict[str, Any]) -> None:
    assert python_actual(case) == case["expect"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_vector_validity_and_round_trip(case: dict[str, Any]) -> None:
    result = parse_script(script_of(case))
    assert result.ok == case["valid"]
    for spec in result.specs:
        text = spec.to_normalized()
        assert ElasticSpec.from_normalized(text) == spec
        assert text.isascii() and "]" not in text and "[" not in text


def test_text_and_bytes_give_the_same_result() -> None:
    for case in CASES:
        if "script" in case:
            assert parse_script(case["script"]) == parse_script(script_of(case)), case["name"]


def test_vectors_cover_every_option_and_both_outcomes() -> None:
    texts = " ".join(c.get("script", "") for c in CASES)
    for option in ("--min-nodes", "--max-nodes", "--step", "--scale-up-above", "--scale-down-below", "--window",
                   "--cooldown", "--grace", "--signal", "--het-group", "--no-grow", "--no-shrink"):
        assert option in texts
    assert sum(c["valid"] for c in CASES) >= 40
    assert sum(not c["valid"] for c in CASES) >= 40


@pytest.mark.parametrize("case", VECTORS["admin_comment"]["embed"])
def test_admin_comment_embed(case: dict[str, Any]) -> None:
    assert embed(case["admin_comment"], case["body"]) == case["expect"]


@pytest.mark.parametrize("case", VECTORS["admin_comment"]["extract"])
def test_admin_comment_extract(case: dict[str, Any]) -> None:
    assert extract(case["admin_comment"]) == case["expect"]
