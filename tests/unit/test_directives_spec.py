"""ElasticSpec, its normalized form, value syntax, admin_comment segments and the controller's read path."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from slurm_elastic.directives import (
    DirectiveError,
    ElasticSpec,
    SpecError,
    SpecFormatError,
    directives_for_job,
    from_normalized,
    parse_script,
    spec_from_admin_comment,
)
from slurm_elastic.directives.options import BY_OPTION, OPTIONS, SETTINGS
from slurm_elastic.directives.values import InvalidValue, format_duration, parse_duration, parse_signal
from slurm_elastic.errors import SlurmElasticError

WINDOW = BY_OPTION["--window"]
GRACE = BY_OPTION["--grace"]
SIGNAL = BY_OPTION["--signal"]


# --- the table and the dataclass agree -------------------------------------------------------------------


def test_dataclass_defaults_are_the_table_defaults() -> None:
    spec = ElasticSpec()
    for opt in SETTINGS:
        assert getattr(spec, opt.field) == opt.default, opt.option
    assert spec.het_group is None and spec.explicit == frozenset()
    assert {f.name for f in dataclasses.fields(ElasticSpec)} == {o.field for o in OPTIONS} | {"explicit"}


def test_option_table_is_consistent() -> None:
    assert len({o.option for o in OPTIONS}) == len({o.key for o in OPTIONS}) == len(OPTIONS)
    for opt in OPTIONS:
        assert opt.option.startswith("--") and opt.doc
        if opt.lo is not None and opt.hi is not None:
            assert opt.lo <= opt.hi
            if isinstance(opt.default, int) and not isinstance(opt.default, bool):
                assert opt.lo <= opt.default <= opt.hi


# --- values ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("10m", 600), ("1h", 3600), ("1h30m", 5400), ("1d", 86400), ("2m5s", 125),
     ("05:00", 300), ("5:00", 300), ("1:5", 65), ("01:30:00", 5400), ("0:00:10", 10), ("1-00:00:00", 86400),
     ("0-01:00:00", 3600), ("00010", 10), ("0h10m", 600)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(WINDOW, text.encode()) == seconds


@pytest.mark.parametrize(
    "text", ["", "abc", "10M", "1H", "m", "1.5m", "1h1h", "5s10m", "-5", "1:60", "1:2:3:4", "1-24:00:00",
             "1-05:00", ":30", "1:", "1:234", "10 m", "१०"],
)
def test_not_durations(text: str) -> None:
    with pytest.raises(InvalidValue) as e:
        parse_duration(WINDOW, text.encode())
    assert "is not a duration" in e.value.message
    assert e.value.allowed is not None and e.value.allowed.startswith("10s..1d")


@pytest.mark.parametrize("text", ["5", "9s", "1d1s", "25:00:00", "9999999999", "99999999999999999999h"])
def test_durations_out_of_range(text: str) -> None:
    with pytest.raises(InvalidValue) as e:
        parse_duration(WINDOW, text.encode())
    assert e.value.message.endswith("is out of range") and e.value.allowed == "10s..1d"


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (10, "10s"), (600, "10m"), (5400, "1h30m"),
                                                (86400, "1d"), (90061, "1d1h1m1s")])
def test_format_duration(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(("text", "name"), [("USR1", "USR1"), ("usr1", "USR1"), ("SIGUSR2", "USR2"),
                                             ("sigTerm", "TERM"), ("10", "USR1"), ("15", "TERM"),
                                             ("001", "HUP"), ("28", "WINCH")])
def test_signals(text: str, name: str) -> None:
    assert parse_signal(SIGNAL, text.encode()) == name


@pytest.mark.parametrize(("text", "fragment"), [("KILL", "SIGKILL can not be caught"),
                                                 ("9", "SIGKILL can not be caught"),
                                                 ("SIGSTOP", "SIGSTOP can not be caught"),
                                                 ("SEGV", "is not a supported signal"),
                                                 ("0", "is not a supported signal"),
                                                 ("USR1\xe9", "is not a supported signal")])
def test_bad_signals(text: str, fragment: str) -> None:
    with pytest.raises(InvalidValue) as e:
        parse_signal(SIGNAL, text.encode())
    assert fragment in e.value.message
    assert isinstance(e.value, SlurmElasticError)


# --- ElasticSpec -----------------------------------------------------------------------------------------


def test_spec_from_a_script_knows_what_was_explicit() -> None:
    (spec,) = parse_script("#ELASTIC --max-nodes 4 --window 2m\n").specs
    assert spec.max_nodes == 4 and spec.window_s == 120 and spec.min_nodes == 1
    assert spec.source("max_nodes") == "directive"
    assert spec.source("min_nodes") == "default"
    with pytest.raises(KeyError):
        spec.source("nope")


@pytest.mark.parametrize(
    "kwargs",
    [{"min_nodes": 0}, {"min_nodes": 5, "max_nodes": 4, "explicit": frozenset({"min_nodes", "max_nodes"})},
     {"scale_up_above": 40, "scale_down_below": 40, "explicit": frozenset({"scale_up_above", "scale_down_below"})},
     {"scale_down_below": 100}, {"window_s": 5}, {"signal": "KILL"},
     {"grow": False, "shrink": False}, {"explicit": frozenset({"bogus"})}, {"het_group": 128},
     {"explicit": frozenset({"grow"})}, {"step": True}, {"max_nodes": None, "explicit": frozenset({"max_nodes"})},
     {"min_nodes": "2"}],
)
def test_invalid_specs_can_not_be_built(kwargs: dict[str, object]) -> None:
    with pytest.raises(SpecError):
        ElasticSpec(**kwargs)  # type: ignore[arg-type]


def test_with_defaults_replaces_only_defaults() -> None:
    (spec,) = parse_script("#ELASTIC --window 2m --max-nodes 4\n").specs
    site = spec.with_defaults({"window_s": 900, "cooldown_s": 60, "max_nodes": 8})
    assert site.window_s == 120 and site.max_nodes == 4  # the user's directives win
    assert site.cooldown_s == 60
    assert site.explicit == spec.explicit
    assert site.to_normalized() == spec.to_normalized()


def test_with_defaults_rejects_bad_keys_and_conflicts() -> None:
    (spec,) = parse_script("#ELASTIC --scale-up-above 50\n").specs
    with pytest.raises(SpecError, match="unknown"):
        spec.with_defaults({"nope": 1})
    with pytest.raises(SpecError, match="unknown"):
        spec.with_defaults({"het_group": 1})
    with pytest.raises(SpecError, match="scale_down_below=60 is not below scale_up_above=50"):
        spec.with_defaults({"scale_down_below": 60})


def test_to_dict() -> None:
    (spec,) = parse_script("#ELASTIC --het-group 1 --no-grow\n").specs
    d = spec.to_dict()
    assert d["het_group"] == 1 and d["grow"] is False and d["explicit"] == ["grow"]
    assert d["normalized"] == "elastic:v1 het=1 grow=0"


# --- normalized form --------------------------------------------------------------------------------------


def test_normalized_round_trip_of_every_field() -> None:
    text = ("elastic:v1 het=3 min=2 max=8 step=2 up=90 down=30 window=900 cooldown=0 grace=3600 signal=TERM "
            "shrink=0")
    spec = from_normalized(text)
    assert spec.to_normalized() == text
    assert spec.het_group == 3 and spec.signal == "TERM" and spec.shrink is False and spec.grow is True
    assert ElasticSpec.from_normalized("elastic:v1") == ElasticSpec()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("", "not an elastic spec"), ("elastic", "not an elastic spec"), ("[elastic:v1]", "not an elastic spec"),
     ("elastic:v2 min=1", "unsupported elastic spec version"), ("elastic:v1 ", "bad item"),
     ("elastic:v1  min=1", "bad item"), ("elastic:v1 min=01", "bad number"), ("elastic:v1 min=-1", "bad item"),
     ("elastic:v1 min=0", "out of range"), ("elastic:v1 foo=1", "bad item"), ("elastic:v1 grow=1", "only be 0"),
     ("elastic:v1 signal=KILL", "unknown signal"), ("elastic:v1 signal=usr1", "bad item"),
     ("elastic:v1 max=1 min=1", "not in normal form"), ("elastic:v1 min=1 min=2", "not in normal form"),
     ("elastic:v1 het=1 het=2", "not in normal form"), ("elastic:v1 min=3 max=2", "2 is below --min-nodes 3"),
     ("elastic:v1 up=30 down=40", "40 is not below --scale-up-above 30, as given"),
     ("elastic:v1 grow=0 shrink=0", "could never be resized"), ("elastic:v1 window=1h", "bad item"),
     ("elastic:v1 min=1\n", "bad item"), ("elastic:v1 het=128", "out of range")],
)
def test_from_normalized_rejects(text: str, fragment: str) -> None:
    with pytest.raises(SpecFormatError, match=None) as e:
        from_normalized(text)
    assert fragment in str(e.value)


def test_from_normalized_rejects_non_text() -> None:
    with pytest.raises(SpecFormatError):
        from_normalized(b"elastic:v1")  # type: ignore[arg-type]


# --- admin_comment ------------------------------------------------------------------------------------------


def test_spec_from_admin_comment() -> None:
    assert spec_from_admin_comment(None) is None
    assert spec_from_admin_comment("just a note") is None
    assert spec_from_admin_comment("note [elastic:off]") is None
    spec = spec_from_admin_comment("note [elastic:v1 max=3] more")
    assert spec is not None and spec.max_nodes == 3
    with pytest.raises(SpecFormatError):
        spec_from_admin_comment("[elastic:v1 max=three]")


# --- the controller's read path (no job_submit plugin) -----------------------------------------------------


def test_read_path_elastic() -> None:
    jd = directives_for_job(b"#!/bin/bash\n#ELASTIC --max-nodes 3\nsrun x\n")
    assert jd.status == "elastic" and jd.elastic
    assert jd.spec is not None and jd.spec.max_nodes == 3
    assert jd.reason == "#ELASTIC directives: elastic:v1 max=3"


def test_read_path_invalid_directives_are_ignored_with_a_reason() -> None:
    jd = directives_for_job("#ELASTIC --max-nodes x --step y\n")
    assert jd.status == "invalid" and jd.spec is None and len(jd.errors) == 2
    assert jd.reason == ("invalid #ELASTIC directives, ignored: line 1: --max-nodes: 'x' is not a whole number "
                         "(allowed: 1..65536) (and 1 more)")


def test_read_path_not_elastic() -> None:
    assert directives_for_job(None).reason == "no batch script"
    jd = directives_for_job("#!/bin/bash\nsrun x\n#ELASTIC --max-nodes 3\n")
    assert jd.status == "not_elastic" and jd.reason == "no #ELASTIC directives" and len(jd.warnings) == 1


def test_read_path_het_components() -> None:
    script = "#ELASTIC --window 5m\n#ELASTIC --het-group 1 --max-nodes 4\n"
    jd = directives_for_job(script, het_job_offset=1)
    assert jd.spec is not None and jd.spec.het_group == 1 and jd.spec.window_s == 300
    jd = directives_for_job(script, het_job_offset=0)
    assert jd.status == "not_elastic" and jd.reason == "no #ELASTIC directives for het component 0"
    jd = directives_for_job(script)
    assert jd.status == "invalid" and jd.errors == (
        DirectiveError(2, "--het-group", "the job is not heterogeneous", None),)
    jd = directives_for_job("#ELASTIC --max-nodes 4\n", het_job_offset=0)
    assert jd.status == "invalid" and "needs --het-group" in jd.reason


def test_error_formatting() -> None:
    e = DirectiveError(3, "--max-nodes", "'x' is not a whole number", "1..65536")
    assert e.format("job.sh") == "job.sh:3: --max-nodes: 'x' is not a whole number (allowed: 1..65536)"
    assert DirectiveError(2, "--no-grow", "takes no value").format("s") == "s:2: --no-grow: takes no value"


# --- the package stays pure ----------------------------------------------------------------------------------

ALLOWED_IMPORTS = {"__future__", "re", "enum", "dataclasses", "collections.abc", "typing"}


def test_directives_package_is_pure() -> None:
    """Functional core: no I/O, clock or process modules anywhere in slurm_elastic/directives."""
    package = Path(__file__).resolve().parents[2] / "slurm_elastic" / "directives"
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name in ALLOWED_IMPORTS or name.startswith("slurm_elastic."), f"{path.name}: {name}"


# --- docs/directives.md shows the option table as it is in the code ------------------------------------------


def test_docs_option_table_matches_the_code() -> None:
    from slurm_elastic.directives.options import OptionKind
    from slurm_elastic.directives.values import allowed_text

    value = {OptionKind.INT: " N", OptionKind.PERCENT: " PCT", OptionKind.DURATION: " DURATION",
             OptionKind.SIGNAL: " SIG", OptionKind.FLAG: "", OptionKind.MILLIS: " LATENCY",
             OptionKind.COMMAND: " 'CMD'"}
    unset = {"--max-nodes": "node count at submit", "--het-group": "whole job", "--slo-p99": "none",
             "--target-rps-per-replica": "none", "--prewarm": "none"}
    doc = (Path(__file__).resolve().parents[2] / "docs" / "directives.md").read_text(encoding="utf-8")
    for o in OPTIONS:
        if o.default is None:
            default = unset[o.option]
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
        row = f"| `{o.option}{value[o.kind]}` | `{o.key}` | {default} | {allowed} | {o.doc} |"
        assert row in doc, row
