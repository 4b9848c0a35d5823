"""Loading the policy config: TOML text or an already parsed table, validated against
:mod:`slurm_elastic.policy.schema` into a :class:`~slurm_elastic.policy.config.PolicyConfig` (every problem
collected, each with its line where the text is known), and the check that every combination of scopes
keeps scale_down_below below scale_up_above.
"""

from __future__ import annotations

import itertools
import math
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from slurm_elastic.configfile import suggest, with_lines
from slurm_elastic.directives.options import SIGNALS
from slurm_elastic.keyschema import Kind
from slurm_elastic.policy.config import (
    WINDOWS_KEY,
    LayerSet,
    PolicyConfig,
    PolicyConfigError,
    packaged_profiles,
)
from slurm_elastic.policy.schema import (
    BY_NAME,
    CONFIG_VERSION,
    META_KEYS,
    PROFILE_TABLE,
    SCOPE_TABLES,
    KeyDef,
    Scope,
    Value,
)
from slurm_elastic.policy.windows import Window, WindowError, parse_window


def parse_config(text: str, source: str = "<policy config>") -> PolicyConfig:
    """Parse and validate TOML text. Raises PolicyConfigError (a ConfigError) listing every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyConfigError(source, [f"not valid TOML: {exc}"]) from None
    try:
        return config_from_mapping(data, source)
    except PolicyConfigError as exc:  # the text is known here: say on which line each problem is
        raise PolicyConfigError(source, with_lines(exc.problems, text)) from None


def config_from_mapping(data: Mapping[str, Any], source: str = "<policy config>") -> PolicyConfig:
    """Validate an already parsed mapping (e.g. the ``[policy]`` table of the controller's TOML)."""
    problems: list[str] = []
    if not isinstance(data, Mapping):
        raise PolicyConfigError(source, [f"expected a table, not {type(data).__name__}"])
    version = data.get("version")
    if version is None:
        problems.append(f"version: missing (this code reads version = {CONFIG_VERSION})")
    elif isinstance(version, bool) or not isinstance(version, int) or version != CONFIG_VERSION:
        problems.append(f"version: {version!r} is not supported (this code reads version = {CONFIG_VERSION})")

    body = {k: v for k, v in data.items() if k not in META_KEYS and k != PROFILE_TABLE}
    base = _layer_set(body, "", problems)
    profiles: dict[str, LayerSet] = {}
    windows: dict[str, tuple[Window, ...]] = {}
    raw_profiles = data.get(PROFILE_TABLE, {})
    profiles.update(packaged_profiles())  # a site profile of the same name replaces a packaged one
    if not isinstance(raw_profiles, Mapping):
        problems.append(f"{PROFILE_TABLE}: must be a table of [profile.NAME] tables")
    else:
        for name in sorted(raw_profiles):
            table = raw_profiles[name]
            if not isinstance(table, Mapping):
                problems.append(f"{PROFILE_TABLE}.{name}: must be a table")
                continue
            body = {k: v for k, v in table.items() if k != WINDOWS_KEY}
            profiles[name] = _layer_set(body, f"{PROFILE_TABLE}.{name}.", problems)
            if WINDOWS_KEY in table:
                parsed = _windows(table[WINDOWS_KEY], f"{PROFILE_TABLE}.{name}.{WINDOWS_KEY}", problems)
                if parsed:
                    windows[name] = parsed

    active = data.get("active_profile")
    if active is not None:
        if not isinstance(active, str):
            problems.append(f"active_profile: must be a string, not {active!r}")
            active = None
        elif active not in profiles:
            known = ", ".join(sorted(profiles)) or "none defined"
            problems.append(f"active_profile: {active!r} is not a profile (profiles: {known})")
            active = None

    tz = data.get("timezone", "UTC")
    if not isinstance(tz, str) or not _known_zone(tz):
        problems.append(f"timezone: {tz!r} is not an IANA time zone (e.g. 'UTC', 'Europe/Berlin', 'America/Chicago')")
        tz = "UTC"

    cfg = PolicyConfig(CONFIG_VERSION, base, profiles, active, source, windows, timezone=tz)
    if not problems:
        problems.extend(_band_problems(cfg))
    if problems:
        raise PolicyConfigError(source, problems)
    return cfg


def _known_zone(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _windows(value: Any, path: str, problems: list[str]) -> tuple[Window, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{path}: must be a list of strings like 'Mon-Fri 08:00-20:00'")
        return ()
    out: list[Window] = []
    for text in value:
        try:
            out.append(parse_window(text))
        except WindowError as exc:
            problems.append(f"{path}: {exc}")
    return tuple(out)


def _layer_set(table: Mapping[str, Any], prefix: str, problems: list[str]) -> LayerSet:
    global_values: dict[str, Value] = {}
    scoped: dict[Scope, dict[str, Mapping[str, Value]]] = {s: {} for s in SCOPE_TABLES.values()}
    for key, value in table.items():
        path = f"{prefix}{key}"
        if key in SCOPE_TABLES:
            scope = SCOPE_TABLES[key]
            if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
                problems.append(f"{path}: must hold [{path}.NAME] tables")
                continue
            for name in sorted(value):
                scoped[scope][name] = _layer(value[name], scope, f"{path}.{name}.", problems)
        elif key in BY_NAME:
            checked = _check_value(BY_NAME[key], value, Scope.GLOBAL, path, problems)
            if checked is not None:
                global_values[key] = checked
        else:
            where = "at the top level" if not prefix else f"in {prefix.rstrip('.')}"
            allowed = list(BY_NAME) + list(SCOPE_TABLES) + ([PROFILE_TABLE, *META_KEYS] if not prefix else [])
            problems.append(f"{path}: unknown key {where}{suggest(key, allowed)}")
    return LayerSet(global_values, scoped[Scope.PARTITION], scoped[Scope.ACCOUNT], scoped[Scope.QOS])


def _layer(table: Mapping[str, Any], scope: Scope, prefix: str, problems: list[str]) -> Mapping[str, Value]:
    out: dict[str, Value] = {}
    for key, value in table.items():
        path = f"{prefix}{key}"
        keydef = BY_NAME.get(key)
        if keydef is None:
            problems.append(f"{path}: unknown key{suggest(key, BY_NAME)}")
            continue
        checked = _check_value(keydef, value, scope, path, problems)
        if checked is not None:
            out[key] = checked
    return out


def _check_value(keydef: KeyDef, value: Any, scope: Scope, path: str, problems: list[str]) -> Value | None:
    if scope not in keydef.scopes:
        problems.append(f"{path}: {keydef.name} can not be set per {scope.value} (only: {keydef.scopes_text()})")
        return None
    kind = keydef.kind
    bad = f"{path}: {value!r} is not a valid {kind.value}"
    if kind in (Kind.INT, Kind.PERCENT, Kind.DURATION):
        if isinstance(value, bool) or not isinstance(value, int):
            unit = " (whole seconds)" if kind is Kind.DURATION else ""
            problems.append(f"{bad}{unit}")
            return None
        return _in_range(keydef, value, path, problems)
    if kind is Kind.FLOAT:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            problems.append(bad)
            return None
        return _in_range(keydef, float(value), path, problems)
    if kind is Kind.BOOL:
        if not isinstance(value, bool):
            problems.append(f"{bad} (use true or false)")
            return None
        return value
    if kind is Kind.SIGNAL:
        name = value.upper().removeprefix("SIG") if isinstance(value, str) else None
        if name not in SIGNALS:
            problems.append(f"{path}: {value!r} is not a supported signal ({keydef.range_text()})")
            return None
        return name
    if kind is Kind.STR_LIST:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problems.append(bad)
            return None
        return tuple(value)
    if kind is Kind.INT_LIST:
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
        ):
            problems.append(f"{bad} (non-negative job ids)")
            return None
        return tuple(value)
    raise AssertionError(kind)


def _in_range(keydef: KeyDef, value: int | float, path: str, problems: list[str]) -> int | float | None:
    assert keydef.lo is not None and keydef.hi is not None
    if not keydef.lo <= value <= keydef.hi:
        problems.append(f"{path}: {value!r} is out of range {keydef.range_text()}")
        return None
    return value


_BAND = ("scale_down_below", "scale_up_above")


def _band_problems(cfg: PolicyConfig, limit: int = 10) -> list[str]:
    """Every combination of scopes (and profile) must give scale_down_below < scale_up_above.

    Only names that set one of the two keys matter, so the product stays small.
    """

    def names(get: str) -> list[str | None]:
        found: set[str] = set()
        for layers in [cfg.base, *cfg.profiles.values()]:
            for name, values in getattr(layers, get).items():
                if any(k in values for k in _BAND):
                    found.add(name)
        return [None, *sorted(found)]

    problems: list[str] = []
    for profile in [None, *sorted(cfg.profiles)]:
        view = replace(cfg, active_profile=profile)
        for p, a, q in itertools.product(names("partitions"), names("accounts"), names("qos")):
            down = view.resolve("scale_down_below", p, a, q)
            up = view.resolve("scale_up_above", p, a, q)
            if cast(int, down.value) >= cast(int, up.value):
                scope = ", ".join(
                    f"{k}={v}" for k, v in (("partition", p), ("account", a), ("qos", q)) if v is not None
                ) or "every job"
                prof = f" with profile {profile}" if profile else ""
                msg = (
                    f"scale_down_below={down.value} ({down.provenance}) is not below scale_up_above={up.value} "
                    f"({up.provenance}) for {scope}{prof}"
                )
                if msg not in problems:
                    problems.append(msg)
                if len(problems) >= limit:
                    return problems
    return problems
