"""Policy config: TOML loading, validation with clear errors, layered resolution with provenance."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from slurm_elastic.errors import ConfigError
from slurm_elastic.policy import (
    KEYS,
    Action,
    PolicyConfigError,
    Provenance,
    UnitSettings,
    decide,
    default_config,
    parse_config,
    render_defaults_toml,
    resolve_unit,
)
from slurm_elastic.policy.config import UNIT_KEYS
from slurm_elastic.policy.schema import DEFAULTS
from slurm_elastic.policy.windows import parse_window
from tests.unit.policy_builders import NOW, job, make_input, nodes, unit, util

SITE = """
version = 1
scale_down_below = 30

[partition.gpu]
free_node_reserve = 1
cooldown_s = 100

[account.physics]
cooldown_s = 200

[qos.high]
cooldown_s = 300
shrink_to_admit = true

[profile.peak]
scale_up_above = 90

[profile.peak.partition.serve]
free_node_reserve = 2

[profile.peak.qos.high]
cooldown_s = 400
"""


def test_packaged_defaults_load_and_match_the_schema() -> None:
    cfg = parse_config(render_defaults_toml(), source="defaults")
    for key in KEYS:
        resolved = cfg.resolve(key.name)
        assert resolved.value == key.default
        assert resolved.provenance == Provenance("global")  # written in the file
    plain = default_config()
    assert all(plain.resolve(k.name).provenance == Provenance("default") for k in KEYS)


def test_every_key_has_a_doc_line_and_unit_settings_cover_the_unit_keys() -> None:
    assert all(k.doc.strip() and not k.doc.endswith(".") for k in KEYS)
    fields = [f.name for f in dataclasses.fields(UnitSettings) if f.name != "provenance"]
    assert fields == list(UNIT_KEYS)


@pytest.mark.parametrize(
    ("partition", "account", "qos", "value", "provenance"),
    [
        (None, None, None, 300, "default"),
        ("gpu", None, None, 100, "partition gpu"),
        ("gpu", "physics", None, 200, "account physics"),
        ("gpu", "physics", "high", 300, "qos high"),
        ("cpu", "chem", "normal", 300, "default"),
    ],
)
def test_most_specific_scope_wins(
    partition: str | None, account: str | None, qos: str | None, value: int, provenance: str
) -> None:
    resolved = parse_config(SITE).resolve("cooldown_s", partition, account, qos)
    assert (resolved.value, str(resolved.provenance)) == (value, provenance)


def test_profile_overlays_everything_and_says_so() -> None:
    cfg = parse_config(SITE).with_active_profile("peak")
    assert str(cfg.resolve("scale_up_above").provenance) == "profile peak"
    assert cfg.resolve("scale_up_above").value == 90
    high = cfg.resolve("cooldown_s", "gpu", "physics", "high")
    assert (high.value, str(high.provenance)) == (400, "profile peak qos=high")
    serve = cfg.resolve("free_node_reserve", "serve")
    assert (serve.value, str(serve.provenance)) == (2, "profile peak partition=serve")
    assert cfg.resolve("scale_down_below").value == 30  # not in the profile: the site's value
    assert parse_config(SITE).with_active_profile(None).resolve("scale_up_above").value == DEFAULTS["scale_up_above"]


def test_active_profile_at_top_level() -> None:
    cfg = parse_config('active_profile = "peak"\n' + SITE)
    assert cfg.active_profile == "peak"
    with pytest.raises(ConfigError, match="unknown policy profile 'night'"):
        cfg.with_active_profile("night")


def test_directives_win_and_are_labelled() -> None:
    cfg = parse_config(SITE)
    u = unit(job(1, account="physics", qos="high"), cooldown_s=50, window_s=60)
    s = resolve_unit(cfg, u)
    assert (s.cooldown_s, s.source("cooldown_s")) == (50, "directive")
    assert (s.window_s, s.source("window_s")) == (60, "directive")
    assert (s.scale_down_below, s.source("scale_down_below")) == (30, "global")
    assert (s.free_node_reserve, s.source("free_node_reserve")) == (1, "partition gpu")
    assert (s.shrink_to_admit, s.source("shrink_to_admit")) == (True, "qos high")
    rows = {key: (value, source) for key, value, source in s.rows()}
    assert rows["min_samples"] == (DEFAULTS["min_samples"], "default")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("scale_up_above = 90", "version: missing (this code reads version = 1)"),
        ("version = 2", "version: 2 is not supported"),
        ("version = 1\nscale_up_abov = 90", "scale_up_abov: unknown key at the top level (did you mean "
         "'scale_up_above'?)"),
        ("version = 1\n[partition.gpu]\ncooldwn_s = 5", "partition.gpu.cooldwn_s: unknown key (did you mean "
         "'cooldown_s'?)"),
        ("version = 1\nscale_up_above = 120", "scale_up_above: 120 is out of range 1..100"),
        ("version = 1\nwindow_s = 5", "window_s: 5 is out of range 10..86400"),
        ("version = 1\nwindow_s = '10m'", "window_s: '10m' is not a valid duration (whole seconds)"),
        ("version = 1\nstep = true", "step: True is not a valid int"),
        ("version = 1\npaused = 1", "paused: 1 is not a valid bool (use true or false)"),
        ("version = 1\nmax_actions_per_cycle = \"__import__('os').system('true')\"",
         "max_actions_per_cycle: \"__import__('os').system('true')\" is not a valid int"),
        ("version = 1\nsignal = 'KILL'", "signal: 'KILL' is not a supported signal"),
        ("version = 1\ngoodput_min_marginal_efficiency = 1.5", "goodput_min_marginal_efficiency: 1.5 is out of "
         "range 0.0..1.0"),
        ("version = 1\n[account.a]\nfree_node_reserve = 1", "account.a.free_node_reserve: free_node_reserve can "
         "not be set per account (only: global, partition)"),
        ("version = 1\n[partition.gpu]\nmax_actions_per_cycle = 3", "can not be set per partition (only: global)"),
        ("version = 1\npaused_jobs = [1, -2]", "paused_jobs: [1, -2] is not a valid list of ints"),
        ("version = 1\nactive_profile = 'x'", "active_profile: 'x' is not a profile (profiles: utilization-band)"),
        ("version = 1\npartition = 3", "partition: must hold [partition.NAME] tables"),
        ("version = 1\n[profile.p]\nversion = 1", "profile.p.version: unknown key in profile.p"),
        ("version = 1\nscale_down_below = 95", "scale_down_below=95 (global) is not below scale_up_above=90 "
         "(default) for every job"),
        ("version = 1\n[qos.low]\nscale_up_above = 15", "scale_down_below=20 (default) is not below "
         "scale_up_above=15 (qos low) for qos=low"),
        ("version = 1\n[profile.p.account.a]\nscale_down_below = 90", "for account=a with profile p"),
        ("version = 1\nnot toml = = 3", "not valid TOML"),
    ],
)
def test_invalid_config_is_rejected_clearly(text: str, problem: str) -> None:
    with pytest.raises(PolicyConfigError) as err:
        parse_config(text, source="site.toml")
    assert isinstance(err.value, ConfigError)
    assert str(err.value).startswith("invalid policy config site.toml:")
    assert any(problem in p for p in err.value.problems), err.value.problems


def test_problems_say_on_which_line_of_the_file_the_key_is() -> None:
    text = "version = 1\n# comment\nstep = 0\n\n[partition.gpu]\ncooldwn_s = 5\n[profile.night]\nwindow_s = 1\n"
    with pytest.raises(PolicyConfigError) as err:
        parse_config(text, source="site.toml")
    lines = sorted(err.value.problems)
    assert lines[0].startswith("line 3: step: ") and lines[1].startswith("line 6: partition.gpu.cooldwn_s: ")
    assert lines[2].startswith("line 8: profile.night.window_s: "), lines


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(PolicyConfigError) as err:
        parse_config("version = 1\nstep = 0\nwindow_s = 1\nbogus = 1")
    assert len(err.value.problems) == 3


def test_signal_names_are_normalized() -> None:
    assert parse_config("version = 1\nsignal = 'sigusr2'").resolve("signal").value == "USR2"


def test_config_is_frozen() -> None:
    cfg = default_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.active_profile = "x"  # type: ignore[misc]


PROFILED = """
version = 1
scale_up_above = 80
[profile.peak]
windows = ["Mon-Fri 08:00-20:00"]
scale_up_above = 95
[profile.peak.partition.serve]
free_node_reserve = 2
[profile.night]
windows = ["22:00-06:00"]
max_actions_per_cycle = 50
"""


@pytest.mark.parametrize(
    ("when", "profile"),
    [
        ("2025-06-02T12:00", "peak"),  # Monday noon
        ("2025-06-02T07:59", None),
        ("2025-06-02T20:00", None),  # the end is exclusive
        ("2025-06-07T12:00", None),  # Saturday
        ("2025-06-02T23:30", "night"),
        ("2025-06-03T05:59", "night"),  # overnight: belongs to the day it started
        ("2025-06-03T06:00", None),
    ],
)
def test_profile_windows_pick_the_profile(when: str, profile: str | None) -> None:
    cfg = parse_config(PROFILED)
    now = datetime.fromisoformat(when).replace(tzinfo=UTC)
    assert cfg.profile_at(now) == profile
    assert cfg.at(now).active_profile == profile
    assert cfg.with_active_profile("night").profile_at(now) == "night"  # an explicit profile wins


def test_decide_applies_the_profile_in_force() -> None:
    cfg = parse_config(PROFILED)
    u = unit(job(100, nodes=("n1",)))
    inp = make_input([u], nodes(3, busy=["n1"]), utils=[util(100, 90)])
    (day,) = decide(inp, cfg, NOW)  # Monday 12:00
    assert (day.action, day.profile, day.inputs["scale_up_above.source"]) == (Action.HOLD, "peak", "profile peak")
    later = make_input([u], nodes(3, busy=["n1"]), utils=[util(100, 90, age=10 - 9 * 3600)])
    (evening,) = decide(later, cfg, NOW.replace(hour=21))
    assert (evening.action, evening.profile) == (Action.GROW, None)


@pytest.mark.parametrize(
    ("window", "problem"),
    [
        ("Mon-Fri 8-20", "expected '[DAYS ]HH:MM-HH:MM'"),
        ("Mon-Fry 08:00-20:00", "bad days 'mon-fry'"),
        ("08:00-25:00", "bad time '25:00'"),
        ("24:00-08:00", "bad time '24:00'"),
        ("08:00-08:00", "is empty"),
    ],
)
def test_bad_windows_are_config_errors(window: str, problem: str) -> None:
    with pytest.raises(PolicyConfigError) as err:
        parse_config(f'version = 1\n[profile.p]\nwindows = ["{window}"]\n')
    problems = err.value.problems
    assert any(problem in p and p.startswith("line 3: profile.p.windows:") for p in problems), problems


def test_window_grammar() -> None:
    w = parse_window("Fri-Mon 00:00-24:00")
    assert w.days == frozenset({4, 5, 6, 0})
    assert parse_window("Sat,Sun 10:00-12:00").days == frozenset({5, 6})
    assert parse_window("* 10:00-12:00").days == frozenset(range(7))


def test_profile_windows_are_read_in_the_configured_time_zone() -> None:
    text = 'version = 1\ntimezone = "America/Chicago"\n[profile.day]\nwindows = ["Mon-Fri 08:00-20:00"]\n'
    cfg = parse_config(text)
    # 2026-11-30 is a Monday. 13:00 UTC is 07:00 in Chicago (CST, UTC-6): not yet; 14:00 UTC is 08:00: open.
    assert cfg.profile_at(datetime(2026, 11, 30, 13, 59, tzinfo=UTC)) is None
    assert cfg.profile_at(datetime(2026, 11, 30, 14, 0, tzinfo=UTC)) == "day"
    # Saturday 01:00 UTC is still Friday 19:00 in Chicago.
    assert cfg.profile_at(datetime(2026, 12, 5, 1, 0, tzinfo=UTC)) == "day"
    utc = parse_config(text.replace('timezone = "America/Chicago"\n', ""))
    assert utc.timezone == "UTC" and utc.profile_at(datetime(2026, 11, 30, 13, 0, tzinfo=UTC)) == "day"


def test_an_unknown_time_zone_is_a_clear_error() -> None:
    with pytest.raises(PolicyConfigError, match="timezone: 'Mars/Olympus' is not an IANA time zone"):
        parse_config('version = 1\ntimezone = "Mars/Olympus"\n')


def test_the_seed_band_is_a_packaged_profile() -> None:
    plain = default_config()
    assert plain.resolve("shrink_to_admit").value is True and plain.active_profile is None
    band = plain.with_active_profile("utilization-band")
    got = {k: (band.resolve(k).value, str(band.resolve(k).provenance))
           for k in ("scale_up_above", "scale_down_below", "shrink_to_admit")}
    assert got == {"scale_up_above": (80, "profile utilization-band"),
                   "scale_down_below": (40, "profile utilization-band"),
                   "shrink_to_admit": (False, "profile utilization-band")}
    site = parse_config('version = 1\nactive_profile = "utilization-band"\ncooldown_s = 60\n')
    assert (site.resolve("scale_up_above").value, site.resolve("cooldown_s").value) == (80, 60)


def test_a_site_profile_replaces_the_packaged_one_of_the_same_name() -> None:
    site = parse_config('version = 1\n[profile.utilization-band]\nscale_up_above = 70\n')
    band = site.with_active_profile("utilization-band")
    assert band.resolve("scale_up_above").value == 70
    assert str(band.resolve("scale_down_below").provenance) == "default"  # not the packaged profile's 40


def test_the_packaged_profile_overlays_a_site_band() -> None:
    text = "version = 1\n[qos.low]\nscale_up_above = 30\n"  # valid with the default 20 (not with 40)
    assert parse_config(text).resolve("scale_up_above", qos="low").value == 30
    band = parse_config('active_profile = "utilization-band"\n' + text)  # sets both ends: still a valid band
    assert [band.resolve(k, qos="low").value for k in ("scale_down_below", "scale_up_above")] == [40, 80]
