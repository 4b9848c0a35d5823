"""The typed reading of Slurm's JSON (slurm/decode.py) against the field-by-field walk of the decoded document
(slurm/openapi.py's ``walk_squeue``/``walk_nodes``, the parser the controller used before): on every reply
recorded from 22.05, 24.11 and 26.05 (the replies folders and every squeue/sinfo/scontrol reply of the recorded
controller and MIG scenarios) both give the same records, field by field, and the typed reading takes them
without handing any to the walk; on fuzzed replies both give the same result or the same error."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_elastic.slurm import decode, openapi
from slurm_elastic.slurm.errors import SlurmParseError

from .test_fuzz_inputs import JSON_VALUES, SINFO_DOCS, SQUEUE_DOCS, _shrunk, mutated

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
NODE_COMMANDS = (["sinfo", "--json"], ["scontrol", "show", "nodes", "--json"])


def _replies() -> dict[str, list[tuple[str, str]]]:
    """{"squeue"|"nodes": [(where, text)]}: every recorded reply of those commands (distinct texts)."""
    out: dict[str, dict[str, str]] = {"squeue": {}, "nodes": {}}
    for path in sorted(FIX.glob("*/recorded/*.json")) + sorted(FIX.glob("constructed/*.json")):
        kind = ("squeue" if path.name.startswith("squeue") else
                "nodes" if path.name.startswith(("sinfo", "scontrol-nodes")) else None)
        if kind is not None:
            out[kind].setdefault(path.read_text(), str(path.relative_to(FIX)))
    for path in sorted(FIX.glob("*/*scenarios/*.json")):
        doc = json.loads(path.read_text())
        for i, step in enumerate(doc["steps"]):
            argv, reply = step.get("argv"), doc["replies"][step["reply"]] if "reply" in step else None
            if reply is None or reply[0] != 0:
                continue
            kind = "squeue" if argv == ["squeue", "--all", "--json"] else "nodes" if argv in NODE_COMMANDS else None
            if kind is not None:
                out[kind].setdefault(reply[1], f"{path.relative_to(FIX)} step {i}")
    return {k: [(where, text) for text, where in v.items()] for k, v in out.items()}


REPLIES = _replies()


def test_every_release_and_the_scenarios_are_covered() -> None:
    wheres = " ".join(w for kind in REPLIES.values() for w, _ in kind)
    for release in ("22.05", "24.11", "26.05"):
        assert f"{release}/recorded/squeue.json" in wheres
    assert "24.11/recorded/scontrol-nodes.json" in wheres and "26.05/recorded/sinfo.json" in wheres
    assert len(REPLIES["squeue"]) > 50 and len(REPLIES["nodes"]) > 50  # the scenarios' replies, not one each


def assert_same_records(typed: tuple[Any, ...], walked: tuple[Any, ...], where: str) -> None:
    assert len(typed) == len(walked), where
    for a, b in zip(typed, walked, strict=True):
        for f in dataclasses.fields(a):
            assert getattr(a, f.name) == getattr(b, f.name), f"{where}: {a!r}.{f.name}"
        assert type(a) is type(b) and a == b


@pytest.mark.parametrize("where,text", REPLIES["squeue"], ids=[w for w, _ in REPLIES["squeue"]])
def test_squeue_typed_equals_the_walk(where: str, text: str) -> None:
    meta, jobs = decode.typed_squeue(decode._SQUEUE.decode(text))  # typed all the way: no hand-over
    walked_meta, walked = openapi.walk_squeue(json.loads(text))
    assert meta == walked_meta and meta.known
    assert_same_records(jobs, walked, where)
    assert decode.read_squeue(text) == (meta, jobs) == decode.parse_squeue(json.loads(text))


@pytest.mark.parametrize("where,text", REPLIES["nodes"], ids=[w for w, _ in REPLIES["nodes"]])
def test_nodes_typed_equals_the_walk(where: str, text: str) -> None:
    meta, nodes = decode.typed_nodes(decode._NODES.decode(text))
    walked_meta, walked = openapi.walk_nodes(json.loads(text))
    assert meta == walked_meta and nodes
    assert_same_records(nodes, walked, where)
    assert decode.read_nodes(text) == (meta, nodes) == decode.parse_nodes(json.loads(text))


def outcome(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except SlurmParseError as e:
        return "error", str(e)
    except (json.JSONDecodeError, RecursionError) as e:
        return "json", type(e).__name__


FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(st.one_of(JSON_VALUES, st.one_of(*[mutated(_shrunk(d, "jobs"), 6) for d in SQUEUE_DOCS])))
def test_fuzzed_squeue_reads_as_the_walk_reads_it(doc: Any) -> None:
    text = json.dumps(doc)
    assert outcome(lambda: decode.read_squeue(text)) == outcome(lambda: openapi.walk_squeue(json.loads(text)))
    assert outcome(lambda: decode.parse_squeue(doc)) == outcome(lambda: openapi.walk_squeue(doc))


@FUZZ
@given(st.one_of(JSON_VALUES, st.one_of(*[mutated(_shrunk(_shrunk(d, "nodes"), "sinfo"), 6) for d in SINFO_DOCS])))
def test_fuzzed_nodes_read_as_the_walk_reads_them(doc: Any) -> None:
    text = json.dumps(doc)
    assert outcome(lambda: decode.read_nodes(text)) == outcome(lambda: openapi.walk_nodes(json.loads(text)))
    assert outcome(lambda: decode.parse_nodes(doc)) == outcome(lambda: openapi.walk_nodes(doc))


def test_a_reply_outside_the_typed_shapes_is_read_by_the_walk() -> None:
    """A float where a number belongs is outside the typed shapes; the walk reads it (as a whole number)."""
    text = json.dumps({"jobs": [{"job_id": 7.0, "job_state": "PENDING"}]})
    with pytest.raises(msgspec.ValidationError):
        decode._SQUEUE.decode(text)
    _, (job,) = decode.read_squeue(text)
    assert job.job_id == 7 and job.is_pending


def test_invalid_json_raises_as_json_loads_does() -> None:
    with pytest.raises(json.JSONDecodeError):
        decode.read_squeue('{"jobs": [')
    with pytest.raises(RecursionError):
        decode.read_nodes("[" * 100_000 + "]" * 100_000)


def test_a_memo_takes_the_records_of_unchanged_jobs_again_and_builds_the_changed_ones() -> None:
    text = (FIX / "24.11" / "recorded" / "squeue.json").read_text()
    memo = decode.JobMemo()
    _, first = decode.read_squeue(text, memo)
    assert first == decode.read_squeue(text)[1] and len(first) > 5
    _, again = decode.read_squeue(text, memo)
    assert again == first and all(a is b for a, b in zip(again, first, strict=True))  # taken, not built
    doc = json.loads(text)
    doc["jobs"][1]["name"] = "renamed"
    doc["jobs"][2]["job_state"] = ["RUNNING", "COMPLETING"]
    changed_text = json.dumps(doc)
    _, changed = decode.read_squeue(changed_text, memo)
    assert changed == decode.read_squeue(changed_text)[1] == openapi.walk_squeue(doc)[1]
    assert changed[1].name == "renamed" and changed[2].state_flags == ("COMPLETING",)
    assert [a is b for a, b in zip(changed, first, strict=True)] == [i not in (1, 2) for i in range(len(first))]
    kept = dict(memo.by_raw)
    doc["jobs"][0]["job_id"] = 7.0  # outside the typed shapes: the walk reads it, the memo stays as it was
    assert decode.read_squeue(json.dumps(doc), memo)[1][0].job_id == 7
    assert memo.by_raw == kept
