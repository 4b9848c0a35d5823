"""Policy configuration: load and validate TOML into frozen values, and resolve each setting with its provenance.

A site file looks like this (every key is optional except ``version``; see docs/policy.md for all keys)::

    version = 1
    scale_down_below = 30            # global: overrides the packaged default

    [partition.gpu]
    free_node_reserve = 1
    [account.physics]
    cooldown_s = 600
    [qos.high]
    shrink_to_admit = true

    [profile.peak]                   # overlaid on all of the above while in force
    windows = ["Mon-Fri 08:00-20:00"]
    scale_up_above = 90
    [profile.peak.partition.serve]
    free_node_reserve = 2

Resolution, first match wins: an ``#ELASTIC`` directive (for the keys that are also directives), then the
qos, account, partition and global values of the profile in force (``active_profile``, else the first
profile by name whose ``windows`` contain ``now``), then the site's qos, account, partition and global values,
then the packaged default. The most specific scope wins because a QOS is what a job asks for
explicitly, an account is who pays, and a partition is where it runs. Each resolved value carries its
:class:`Provenance`, so ``explain`` can say where every number came from.

Nothing in a config file is evaluated: values are checked against :mod:`slurm_elastic.policy.schema` and
unknown keys are errors (with a suggestion when one is close).
"""

from __future__ import annotations

import itertools
import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from slurm_elastic.configfile import suggest, with_lines
from slurm_elastic.directives.options import SIGNALS
from slurm_elastic.errors import ConfigError
from slurm_elastic.policy.model import ElasticUnit
from slurm_elastic.policy.schema import (
    BY_NAME,
    CONFIG_VERSION,
    DEFAULTS,
    GLOBAL_ONLY,
    KEYS,
    META_KEYS,
    PACKAGED_PROFILES,
    PROFILE_TABLE,
    SCOPE_TABLES,
    KeyDef,
    Kind,
    Scope,
    Value,
)
from slurm_elastic.policy.windows import Window, WindowError, parse_window

#: Inside [profile.NAME]: the time windows in which the profile is in force (see policy.windows).
WINDOWS_KEY = "windows"

Source = Literal["default", "global", "partition", "account", "qos", "profile", "directive"]


class PolicyConfigError(ConfigError):
    """An invalid policy config; ``problems`` holds one ``path: why`` line per problem."""

    def __init__(self, source: str, problems: Iterable[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"invalid policy config {source}:\n{lines}")


@dataclass(frozen=True)
class Provenance:
    """Where a resolved value came from. ``scope`` names the partition/account/QOS (or profile)."""

    source: Source
    scope: str | None = None

    def __str__(self) -> str:
        return self.source if self.scope is None else f"{self.source} {self.scope}"


@dataclass(frozen=True)
class Resolved:
    key: str
    value: Value
    provenance: Provenance


@dataclass(frozen=True)
class LayerSet:
    """Global values plus per-partition, per-account and per-QOS overrides (the site's, or a profile's)."""

    global_values: Mapping[str, Value] = field(default_factory=dict, hash=False)
    partitions: Mapping[str, Mapping[str, Value]] = field(default_factory=dict, hash=False)
    accounts: Mapping[str, Mapping[str, Value]] = field(default_factory=dict, hash=False)
    qos: Mapping[str, Mapping[str, Value]] = field(default_factory=dict, hash=False)

    def scoped(self, scope: Scope) -> Mapping[str, Mapping[str, Value]]:
        if scope is Scope.PARTITION:
            return self.partitions
        if scope is Scope.ACCOUNT:
            return self.accounts
        if scope is Scope.QOS:
            return self.qos
        raise ValueError(scope)


@dataclass(frozen=True)
class PolicyConfig:
    """The validated policy configuration. Build it with :func:`parse_config`, :func:`config_from_mapping`
    or :func:`default_config`; switch profiles with :meth:`with_active_profile`."""

    version: int = CONFIG_VERSION
    base: LayerSet = field(default_factory=LayerSet)
    profiles: Mapping[str, LayerSet] = field(default_factory=lambda: dict(packaged_profiles()), hash=False)
    active_profile: str | None = None
    source: str = "<packaged defaults>"
    windows: Mapping[str, tuple[Window, ...]] = field(default_factory=dict, hash=False)  # profile -> windows
    timezone: str = "UTC"  # IANA zone the windows are read in (part of the config, so decide() stays pure)

    def with_active_profile(self, name: str | None) -> PolicyConfig:
        """The same config with profile ``name`` overlaid (None: no profile). Raises ConfigError if unknown."""
        if name is not None and name not in self.profiles:
            known = ", ".join(sorted(self.profiles)) or "none defined"
            raise ConfigError(f"unknown policy profile {name!r} (profiles: {known})")
        return replace(self, active_profile=name)

    def profile_at(self, now: datetime) -> str | None:
        """The profile in force at ``now``: ``active_profile`` if set, else the first profile (by name) with
        a time window containing ``now``, else None."""
        if self.active_profile is not None:
            return self.active_profile
        if now.tzinfo is not None:
            now = now.astimezone(ZoneInfo(self.timezone))
        for name in sorted(self.windows):
            if any(w.contains(now) for w in self.windows[name]):
                return name
        return None

    def at(self, now: datetime) -> PolicyConfig:
        """This config with the profile in force at ``now`` active (``decide`` calls it itself)."""
        profile = self.profile_at(now)
        return self if profile == self.active_profile else replace(self, active_profile=profile)

    def _chain(
        self, partition: str | None, account: str | None, qos: str | None
    ) -> list[tuple[Mapping[str, Value], Provenance]]:
        chain: list[tuple[Mapping[str, Value], Provenance]] = []
        layer_sets: list[tuple[LayerSet, str | None]] = []
        if self.active_profile is not None:
            layer_sets.append((self.profiles[self.active_profile], self.active_profile))
        layer_sets.append((self.base, None))
        for layers, profile in layer_sets:
            for scope, name in ((Scope.QOS, qos), (Scope.ACCOUNT, account), (Scope.PARTITION, partition)):
                if name is not None and name in layers.scoped(scope):
                    if profile is None:
                        prov = Provenance(scope.value, name)
                    else:
                        prov = Provenance("profile", f"{profile} {scope.value}={name}")
                    chain.append((layers.scoped(scope)[name], prov))
            chain.append(
                (layers.global_values, Provenance("global") if profile is None else Provenance("profile", profile))
            )
        return chain

    def resolve(
        self, key: str, partition: str | None = None, account: str | None = None, qos: str | None = None
    ) -> Resolved:
        """The effective value of ``key`` for a scope, with its provenance (directives are not applied here)."""
        if key not in BY_NAME:
            raise KeyError(key)
        for values, prov in self._chain(partition, account, qos):
            if key in values:
                return Resolved(key, values[key], prov)
        return Resolved(key, DEFAULTS[key], Provenance("default"))

    def resolve_all(
        self, partition: str | None = None, account: str | None = None, qos: str | None = None
    ) -> dict[str, Resolved]:
        chain = self._chain(partition, account, qos)
        out: dict[str, Resolved] = {}
        for key in KEYS:
            for values, prov in chain:
                if key.name in values:
                    out[key.name] = Resolved(key.name, values[key.name], prov)
                    break
            else:
                out[key.name] = Resolved(key.name, key.default, Provenance("default"))
        return out

    # typed access to the global-only keys
    @property
    def max_actions_per_cycle(self) -> int:
        return cast(int, self.resolve("max_actions_per_cycle").value)

    @property
    def pending_block_reasons(self) -> frozenset[str]:
        return frozenset(cast(tuple[str, ...], self.resolve("pending_block_reasons").value))

    @property
    def paused_jobs(self) -> frozenset[int]:
        return frozenset(cast(tuple[int, ...], self.resolve("paused_jobs").value))

    @property
    def victim_by_service(self) -> bool:
        return cast(bool, self.resolve("victim_by_service").value)

    @property
    def victim_by_remaining(self) -> bool:
        return cast(bool, self.resolve("victim_by_remaining").value)

    @property
    def victim_by_goodput(self) -> bool:
        return cast(bool, self.resolve("victim_by_goodput").value)

    @property
    def goodput_moves(self) -> bool:
        return cast(bool, self.resolve("goodput_moves").value)

    @property
    def allocator(self) -> bool:
        return cast(bool, self.resolve("allocator").value)

    @property
    def fairness_power(self) -> float:
        return float(cast(float, self.resolve("fairness_power").value))

    @property
    def fairness_max_rho(self) -> float:
        return float(cast(float, self.resolve("fairness_max_rho").value))

    @property
    def admit_backoff_s(self) -> int:
        return cast(int, self.resolve("admit_backoff_s").value)

    @property
    def power_resume_backoff_s(self) -> int:
        return cast(int, self.resolve("power_resume_backoff_s").value)


@dataclass(frozen=True)
class UnitSettings:
    """Every per-unit setting, resolved for one unit (directives applied), with ``provenance`` per key."""

    scale_up_above: int
    scale_down_below: int
    window_s: int
    cooldown_s: int
    grace_s: int
    signal: str
    step: int
    min_samples: int
    max_metric_age_s: int
    startup_protection_s: int
    min_remaining_for_grow_s: int
    extend_time_limit_on_shrink: bool
    max_time_limit_extension_s: int
    free_node_reserve: int
    reclaim_reserve: bool
    paused: bool
    shrink_to_admit: bool
    admit_victim_interval_s: int
    admit_keep_percent: int
    tail_protection: bool
    max_shrunk_share: int
    tail_min_shrunk_s: int
    fair_share: bool
    max_extension_nodes_per_account: int
    max_extension_nodes_per_qos: int
    max_extension_gpus_per_account: int
    max_extension_gpus_per_qos: int
    growth_cap_percent: int
    restart_cost_aware: bool
    restart_cost_s: int
    power_resume: bool
    power_resume_s: int
    goodput: bool
    goodput_min_marginal_efficiency: float
    speedup_growth: bool
    moldable_start: bool
    mold_only_if_faster: bool
    gpu_granular_growth: bool
    serving_risk_percent: int
    serving_headroom_percent: int
    serving_up_window_s: int
    serving_down_window_s: int
    serving_down_cooldown_s: int
    serving_cold_start_s: int
    min_throughput_samples: int
    throughput_max_age_s: int
    provenance: Mapping[str, Provenance] = field(default_factory=dict, hash=False, compare=False)

    def source(self, key: str) -> str:
        return str(self.provenance[key])

    def rows(self) -> list[tuple[str, Value, str]]:
        """(key, value, provenance) for ``explain``, in schema order."""
        return [
            (f.name, cast(Value, getattr(self, f.name)), str(self.provenance[f.name]))
            for f in fields(self)
            if f.name != "provenance"
        ]

    def band_problem(self) -> str | None:
        """Why the hysteresis band is invalid (a directive combined with site values), or None."""
        if self.scale_down_below < self.scale_up_above:
            return None
        return (
            f"scale_down_below={self.scale_down_below} ({self.source('scale_down_below')}) is not below "
            f"scale_up_above={self.scale_up_above} ({self.source('scale_up_above')})"
        )


UNIT_KEYS: tuple[str, ...] = tuple(k.name for k in KEYS if k.scopes != GLOBAL_ONLY)
_DIRECTIVE_KEYS = frozenset(k.name for k in KEYS if k.directive)


class SettingsResolver:
    """Resolves UnitSettings, caching the config part per (partition, account, QOS) for one decide() call."""

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg = cfg
        self._cache: dict[tuple[str | None, str | None, str | None], dict[str, Resolved]] = {}
        self._units: dict[tuple[str | None, str | None, str | None, tuple[tuple[str, Any], ...]], UnitSettings] = {}

    def scope(self, partition: str | None, account: str | None, qos: str | None) -> dict[str, Resolved]:
        key = (partition, account, qos)
        hit = self._cache.get(key)
        if hit is None:
            hit = self.cfg.resolve_all(partition, account, qos)
            self._cache[key] = hit
        return hit

    def unit(self, unit: ElasticUnit) -> UnitSettings:
        job, spec = unit.job, unit.spec
        overrides = tuple(sorted(
            (name, getattr(spec, name)) for name in spec.explicit if name in _DIRECTIVE_KEYS
        ))
        key = (job.partition, job.account, job.qos, overrides)
        hit = self._units.get(key)
        if hit is None:
            resolved = self.scope(job.partition, job.account, job.qos)
            values: dict[str, Any] = {k: resolved[k].value for k in UNIT_KEYS}
            prov: dict[str, Provenance] = {k: resolved[k].provenance for k in UNIT_KEYS}
            for name, value in overrides:
                values[name] = value
                prov[name] = Provenance("directive")
            hit = self._units[key] = UnitSettings(**values, provenance=prov)
        return hit


def resolve_unit(cfg: PolicyConfig, unit: ElasticUnit) -> UnitSettings:
    """The settings ``decide`` uses for ``unit`` (the controller uses ``window_s`` to aggregate metrics)."""
    return SettingsResolver(cfg).unit(unit)


# --- loading ------------------------------------------------------------------------------------------------


def default_config() -> PolicyConfig:
    """The packaged defaults, with no site overrides (the packaged profiles defined, none active)."""
    return PolicyConfig()


def packaged_profiles() -> dict[str, LayerSet]:
    """The profiles every config has (schema.PACKAGED_PROFILES), as layer sets."""
    return {name: LayerSet(global_values=dict(values)) for name, values in PACKAGED_PROFILES.items()}


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
