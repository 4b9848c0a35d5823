"""Hostile input, fuzzed with hypothesis: every parser that reads data from outside the controller either returns a
valid result or raises its typed error (a :class:`SlurmElasticError`), never another exception and never a hang.

Targets: the ``#ELASTIC`` directive parser and the admin_comment spec, agent JSON payloads as the controller
receives them (bytes off the wire), ``squeue --json`` / ``sinfo --json`` replies, the policy TOML, and the four
trace loaders.  Inputs are both unstructured (random bytes/JSON) and mutations of real captured documents, so
the fuzzer gets deep into each parser.

Bounded in CI: ``FUZZ_EXAMPLES`` cases per test (derandomized, so CI runs are reproducible).  Long form::

    SLURM_ELASTIC_LONG=1 .venv/bin/pytest tests/unit/test_fuzz_inputs.py --hypothesis-show-statistics

A hang is caught by the per-test pytest timeout (a guard, not a timed assertion).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_elastic.agent.payload import NodeReport, parse_payload_bytes, to_json_bytes
from slurm_elastic.directives import ParseResult, parse_script, spec_from_admin_comment
from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.policy import PolicyConfig, parse_config
from slurm_elastic.sim.loaders import FORMATS, TraceFormat, load_workload
from slurm_elastic.sim.workload import Workload
from slurm_elastic.slurm.decode import parse_nodes, parse_squeue

from .test_agent_payload import sample_report

LONG = os.environ.get("SLURM_ELASTIC_LONG") == "1"
FUZZ_EXAMPLES = int(os.environ.get("SLURM_ELASTIC_FUZZ_EXAMPLES", "5000" if LONG else "300"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=not LONG, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
HANG_GUARD = pytest.mark.timeout(1800 if LONG else 300)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

#: Cases each test ran, printed at the end (tests/unit/conftest.py-free: a module-level tally).
RAN: dict[str, int] = {}


def _tally(name: str) -> None:
    RAN[name] = RAN.get(name, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> Any:
    yield
    if RAN:
        print("\nfuzz cases run: " + ", ".join(f"{k}={v}" for k, v in sorted(RAN.items())))


def typed_or_valid(fn: Callable[[], object]) -> object | None:
    """Run the parser: a result, or None for its typed error; anything else fails the test (propagates)."""
    try:
        return fn()
    except SlurmElasticError as e:
        assert str(e), "a typed error must say what is wrong"
        return None


# --- generic JSON values and mutation of real documents -------------------------------------------------------
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
                    st.sampled_from(["", "RUNNING", "n[1-3]", "n[1-", "gres:gpu:2", "gpu:4", "v0.0.38", "-1",
                                     "4294967294", "Infinity", "None", "\x00", "n1,n2", "[", "]"]))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=12), inner, max_size=5)), max_leaves=30)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):  # the first few items are enough, and keep the space small
            out.extend(_paths(v, (*prefix, i)))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any, op: str) -> Any:
    if not path:
        return value
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if op == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@st.composite
def mutated(draw: st.DrawFn, base: Any, max_mutations: int = 4) -> Any:
    doc = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, max_mutations))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "replace", "delete"]))
        doc = _set(doc, path, draw(JSON_VALUES), op)
    return doc


# --- 1. #ELASTIC directives and the admin_comment spec ----------------------------------------------------------
# tests/unit/test_directives_properties.py already fuzzes parse_script (binary, directive soup, differential
# against the Lua plugin); here: adversarial sizes and the admin_comment path the controller reads on every cycle.
DIRECTIVE_LINES = st.lists(st.sampled_from([
    "#ELASTIC --min-nodes 1 --max-nodes 3", "#ELASTIC --max-nodes 99999999999999999999", "#ELASTIC " + "x" * 5000,
    "#ELASTIC --window " + "9" * 400, "#ELASTIC --signal \x00\xff", "#ELASTIC --het-group -1", "#ELASTIC =",
    "#ELASTIC --grace 1-00:00:00:00", "#SBATCH -N 2", "srun x", "#ELASTIC --min-nodes=0x10", ""]), max_size=400)


@HANG_GUARD
@FUZZ
@given(DIRECTIVE_LINES, st.binary(max_size=200))
def test_fuzz_directive_parser_typed_result(lines: list[str], noise: bytes) -> None:
    _tally("directives")
    script = "#!/bin/bash\n" + "\n".join(lines) + "\n" + noise.decode("latin-1")
    result = parse_script(script)  # never raises: errors are part of the result
    assert isinstance(result, ParseResult)
    if result.errors:
        assert result.specs == ()


@HANG_GUARD
@FUZZ
@given(st.one_of(st.text(max_size=300), st.lists(st.sampled_from(
    ["[elastic:v1", " min=1", " max=3", " window=", "99999999999999999999", "]", "[elastic:off]", " het=1",
     " signal=USR2", " signal=\x00", " grow=2", " min=-1", "[", "elastic:v2", " x=y", "==", " "]),
    max_size=30).map("".join)))
def test_fuzz_admin_comment_spec(text: str) -> None:
    _tally("admin_comment")
    typed_or_valid(lambda: spec_from_admin_comment(text))


# --- 2. agent payloads, as the controller receives them (bytes after the signature check) ------------------------
def _sample_dict() -> Any:
    return json.loads(to_json_bytes(sample_report()))


@HANG_GUARD
@FUZZ
@given(st.one_of(st.binary(max_size=500), JSON_VALUES.map(lambda v: json.dumps(v).encode()),
                 mutated(_sample_dict()).map(lambda v: json.dumps(v).encode()),
                 st.builds(lambda b, cut: b[:cut], st.just(to_json_bytes(sample_report())), st.integers(0, 4000))))
def test_fuzz_agent_payload_bytes(body: bytes) -> None:
    _tally("agent_payload")
    result = typed_or_valid(lambda: parse_payload_bytes(body))
    assert result is None or isinstance(result, NodeReport)


def test_agent_payload_deeply_nested_json_is_a_typed_error() -> None:
    body = b"[" * 100_000 + b"]" * 100_000  # json.loads raises RecursionError here: must be PayloadError
    assert typed_or_valid(lambda: parse_payload_bytes(body)) is None


# --- 3. squeue --json / sinfo --json ---------------------------------------------------------------------------------
def _fixture_docs(prefix: str) -> list[Any]:
    paths = sorted((FIXTURES / "slurm").rglob(f"{prefix}*.json"))
    assert paths, f"no {prefix} fixtures"
    return [json.loads(p.read_text()) for p in paths]


SQUEUE_DOCS = _fixture_docs("squeue")
SINFO_DOCS = _fixture_docs("sinfo")


def _shrunk(doc: Any, key: str) -> Any:
    """The document with at most three items of its list (mutation works on a small copy)."""
    small = dict(doc)
    if isinstance(small.get(key), list):
        small[key] = small[key][:3]
    return small


@HANG_GUARD
@FUZZ
@given(st.one_of(JSON_VALUES, st.one_of(*[mutated(_shrunk(d, "jobs"), 6) for d in SQUEUE_DOCS])))
def test_fuzz_squeue_json(doc: Any) -> None:
    _tally("squeue_json")
    typed_or_valid(lambda: parse_squeue(doc))


@HANG_GUARD
@FUZZ
@given(st.one_of(JSON_VALUES, st.one_of(*[mutated(_shrunk(_shrunk(d, "nodes"), "sinfo"), 6) for d in SINFO_DOCS])))
def test_fuzz_sinfo_json(doc: Any) -> None:
    _tally("sinfo_json")
    typed_or_valid(lambda: parse_nodes(doc))


# --- 4. the policy TOML ---------------------------------------------------------------------------------------------
TOML_PIECES = ["version = 1\n", "version = 2\n", "window_s = 10\n", "window_s = -1\n", "window_s = 1e999\n",
               "window_s = nan\n", "cooldown_s = \"x\"\n", "grace_s = 3\n", "min_samples = 99999999999999999999\n",
               "[partition.train]\n", "[user.alice]\n", "[account.nlp]\n", "[[windows]]\n", "start = \"25:00\"\n",
               "scale_up_above = 10\n", "scale_down_below = 90\n", "[", "]", "= =\n", "a.b.c = 1\n",
               "x = [1, \"a\", {}]\n", "\x00", "\"\"\"\n", "key = 1979-05-27T07:32:00Z\n", "[qos.\"\\u0000\"]\n",
               "unknown_key = true\n", "max_metric_age_s = 0\n", "[partition]\n", "partition = 3\n"]


@HANG_GUARD
@FUZZ
@given(st.one_of(st.text(max_size=400), st.lists(st.sampled_from(TOML_PIECES), max_size=25).map("".join)))
def test_fuzz_policy_toml(text: str) -> None:
    _tally("policy_toml")
    result = typed_or_valid(lambda: parse_config(text, source="fuzz.toml"))
    assert result is None or isinstance(result, PolicyConfig)


# --- 5. trace loaders ------------------------------------------------------------------------------------------------
TRACE_SEEDS: dict[str, str] = {
    "pollux": "name,time,application,num_replicas,batch_size\na,0,cifar10,1,128\nb,5,bert,2,64\n",
    "philly": "jobid,status,vc,num_gpus,submitted_time,start_time,finished_time\n"
    "j1,Pass,vc1,4,2017-10-03 12:00:00,2017-10-03 12:01:00,2017-10-03 13:00:00\n",
    "sacct": (FIXTURES / "sacct" / "captured-22.05.8-parsable.txt").read_text()[:1500],
    "itp": "",  # a tarball loader: fuzzed with random bytes as the archive
}
TRACE_NOISE = st.lists(st.sampled_from(
    [",", "|", "\n", "\r", "\"", "-1", "1e309", "nan", "2026-13-45T99:99:99", "gres/gpu=", "gres/gpu=abc", "\x00",
     "CANCELLED by 0", "Unknown", "INVALID", "9" * 30, "a", "0", "00:00:00", "1-", "{", "}", "[]"]), max_size=40)


@HANG_GUARD
@FUZZ
@given(st.sampled_from(FORMATS), st.one_of(
    st.binary(max_size=600),
    st.tuples(st.integers(0, 2000), TRACE_NOISE),
    JSON_VALUES.map(lambda v: json.dumps(v).encode())))
def test_fuzz_trace_loaders(fmt: TraceFormat, payload: Any) -> None:
    _tally(f"trace_{fmt}")
    if isinstance(payload, tuple):  # a real seed with noise spliced in at a position
        seed = TRACE_SEEDS[fmt]
        pos, noise = payload
        pos = min(pos, len(seed))
        data = (seed[:pos] + "".join(noise) + seed[pos:]).encode()
    else:
        data = payload
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / ("trace.tar.gz" if fmt == "itp" else "trace.csv")
        path.write_bytes(data)
        target = f"{path}#cluster01.csv" if fmt == "itp" else str(path)
        result = typed_or_valid(lambda: load_workload(target, fmt))
    assert result is None or isinstance(result, Workload)


def test_squeue_reply_nested_too_deeply_is_a_typed_error() -> None:
    """Regression: SlurmCli._json let RecursionError escape, which aborted a whole controller cycle."""
    from slurm_elastic.slurm.adapter import SlurmCli
    from slurm_elastic.slurm.errors import SlurmParseError
    from slurm_elastic.slurm.runner import CommandResult, SlurmCommands

    def runner(argv: Any, *, timeout: float, input_text: str | None, env: Any) -> CommandResult:
        return CommandResult(tuple(argv), 0, "[" * 100_000 + "]" * 100_000, "")

    with pytest.raises(SlurmParseError, match="nested too deeply"):
        SlurmCli(SlurmCommands(runner=runner, env={})).jobs()


@pytest.mark.parametrize("entry", [{"nodes": [1]}, {"node": True}, {"cpus": [1]}, {"gres": "x"}, {"partition": 3},
                                   {"nodes": {"nodes": "n1"}}])
def test_sinfo_entry_of_the_wrong_shape_is_a_typed_error_or_ignored(entry: dict[str, Any]) -> None:
    """Regression: a 23.02+ sinfo entry with a list/bool where an object belongs raised AttributeError."""
    typed_or_valid(lambda: parse_nodes({"sinfo": [entry]}))


@pytest.mark.parametrize("fmt", ["pollux", "philly"])
def test_trace_that_is_not_utf8_is_a_typed_error(fmt: TraceFormat, tmp_path: Path) -> None:
    """Regression: a CSV trace with invalid UTF-8 raised UnicodeDecodeError instead of TraceFormatError."""
    from slurm_elastic.sim.errors import TraceFormatError

    path = tmp_path / "t.csv"
    path.write_bytes(b"\x80name,time\n")
    with pytest.raises(TraceFormatError, match="not UTF-8"):
        load_workload(str(path), fmt)


def test_squeue_time_beyond_year_9999_is_unknown_not_a_crash() -> None:
    """Regression (found by the long fuzz run): a timestamp past year 9999 raised ValueError from the parser."""
    doc = json.loads(json.dumps(SQUEUE_DOCS[0]))
    doc["jobs"] = doc["jobs"][:1]
    doc["jobs"][0]["submit_time"] = 2**40
    doc["jobs"][0]["start_time"] = {"set": True, "infinite": False, "number": 2**50}
    _, jobs = parse_squeue(doc)
    assert jobs[0].submit_time is None


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_slurm_number_that_is_not_finite_is_a_typed_error(value: float) -> None:
    """Regression (found by the long fuzz run): a NaN/infinite number raised OverflowError/ValueError."""
    from slurm_elastic.slurm.errors import SlurmParseError
    from slurm_elastic.slurm.openapi import num

    with pytest.raises(SlurmParseError, match="finite"):
        num(value)
