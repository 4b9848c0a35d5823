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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo

from slurm_elastic.errors import ConfigError
from slurm_elastic.policy.model import ElasticUnit
from slurm_elastic.policy.schema import (
    BY_NAME,
    CONFIG_VERSION,
    DEFAULTS,
    GLOBAL_ONLY,
    KEYS,
    PACKAGED_PROFILES,
    Scope,
    Value,
)
from slurm_elastic.policy.windows import Window

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
