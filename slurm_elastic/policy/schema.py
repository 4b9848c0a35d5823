"""The policy config keys as data: type, packaged default, range, where each may be set, and a doc line.

This table is the packaged default configuration. The loader (:mod:`slurm_elastic.policy.config`) validates a
site file against it, docs/policy.md shows it (a unit test keeps the two in step) and
:func:`render_defaults_toml` prints it as a commented TOML file.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_elastic.directives.options import SIGNALS
from slurm_elastic.keyschema import JOB_KEYS, MAX_NODES, Key, Kind

#: The config format this code reads (the ``version`` key). Bump when a key changes meaning.
CONFIG_VERSION = 1


class Scope(enum.Enum):
    """Where a key may be set. Every key may also be set inside a profile, in the same scopes."""

    GLOBAL = "global"
    PARTITION = "partition"
    ACCOUNT = "account"
    QOS = "qos"


ALL_SCOPES = frozenset(Scope)
GLOBAL_ONLY = frozenset({Scope.GLOBAL})

Value = int | float | bool | str | tuple[str, ...] | tuple[int, ...]


@dataclass(frozen=True)
class KeyDef:
    """A policy key: its name, its :class:`~slurm_elastic.keyschema.Key` (kind, default, range, doc, unit), where
    it may be set, and whether an ``#ELASTIC`` directive of the same name (ElasticSpec field) overrides it."""

    name: str
    key: Key
    scopes: frozenset[Scope]
    directive: bool = False

    @property
    def kind(self) -> Kind:
        return self.key.kind

    @property
    def default(self) -> Value:
        return self.key.default  # type: ignore[no-any-return]

    @property
    def lo(self) -> float | None:
        return self.key.lo

    @property
    def hi(self) -> float | None:
        return self.key.hi

    @property
    def doc(self) -> str:
        return self.key.doc

    def range_text(self) -> str:
        if self.kind is Kind.SIGNAL:
            return ", ".join(SIGNALS)
        return self.key.range_text() if self.lo is not None and self.hi is not None else ""

    def scopes_text(self) -> str:
        return ", ".join(s.value for s in Scope if s in self.scopes)


def _def(name: str, kind: Kind, default: Value, lo: float | None, hi: float | None,  # noqa: PLR0917
         scopes: frozenset[Scope], doc: str) -> KeyDef:
    """One row of the table below (positional: the table reads as one row per key)."""
    return KeyDef(name, Key(kind, default, doc, lo, hi), scopes)


def _job(name: str) -> KeyDef:
    """A key that is also an ``#ELASTIC`` directive: declared once, in keyschema.JOB_KEYS."""
    return KeyDef(name, JOB_KEYS[name], ALL_SCOPES, directive=True)


_DAY = 86400
_YEAR = 365 * _DAY

KEYS: tuple[KeyDef, ...] = (
    # --- thresholds and timing (also #ELASTIC directives, which win over the config) ---------------------
    *(_job(name) for name in JOB_KEYS),
    # --- measurement quality --------------------------------------------------------------------------
    _def("min_samples", Kind.INT, 10, 1, 1_000_000, ALL_SCOPES,
         "fewest utilization samples in the window for a metric-driven resize"),
    _def("max_metric_age_s", Kind.DURATION, 180, 1, _DAY, ALL_SCOPES,
         "metrics whose last sample is older than this are stale: no resize on them"),
    # --- protections ----------------------------------------------------------------------------------
    _def("startup_protection_s", Kind.DURATION, 300, 0, _DAY, ALL_SCOPES,
         "no resize during this long after the job started"),
    _def("min_remaining_for_grow_s", Kind.DURATION, 900, 0, _YEAR, ALL_SCOPES,
         "no grow when less than this much of the time limit remains"),
    _def("extend_time_limit_on_shrink", Kind.BOOL, True, None, None, ALL_SCOPES,
         "when a shrink takes nodes from a job with a time limit, add remaining x (nodes before / nodes after "
         "- 1) to the limit (scontrol update TimeLimit=) so that its remaining work still fits at linear "
         "scaling: nodes x remaining time stays the same; a later grow gives back remaining x (1 - nodes "
         "before / nodes after), at most what shrinks added"),
    _def("max_time_limit_extension_s", Kind.DURATION, _DAY, 0, _YEAR, ALL_SCOPES,
         "most seconds one shrink adds to a job's time limit (extend_time_limit_on_shrink)"),
    _def("free_node_reserve", Kind.INT, 0, 0, MAX_NODES, frozenset({Scope.GLOBAL, Scope.PARTITION}),
         "free nodes a grow must leave in each partition (a global value applies to every partition)"),
    _def("reclaim_reserve", Kind.BOOL, False, None, None, frozenset({Scope.GLOBAL, Scope.PARTITION}),
         "when a partition has fewer free nodes than free_node_reserve, shrink elastic units there (above "
         "their min) to restore it, a few per cycle"),
    _def("max_actions_per_cycle", Kind.INT, 10, 1, 100_000, GLOBAL_ONLY,
         "most grow+shrink actions per cycle; the rest hold with ACTION_CAP (by priority, then job id)"),
    _def("pending_block_reasons", Kind.STR_LIST, ("None", "Priority", "Resources"), None, None, GLOBAL_ONLY,
         "Slurm pending reasons of jobs that wait for nodes: only such jobs block grows or trigger "
         "shrink-to-admit"),
    _def("paused", Kind.BOOL, False, None, None, ALL_SCOPES,
         "decide but do not act: every decision becomes a hold with reason PAUSED"),
    _def("paused_jobs", Kind.INT_LIST, (), None, None, GLOBAL_ONLY,
         "unit job ids paused individually"),
    # --- rules beyond the utilization band, each behind its switch ------------------------------------------------
    _def("shrink_to_admit", Kind.BOOL, True, None, None, ALL_SCOPES,
         "let a higher-priority pending job take nodes this unit holds above its min (resolved for the "
         "victim unit)"),
    _def("admit_victim_interval_s", Kind.DURATION, 0, 0, 7 * _DAY, ALL_SCOPES,
         "a unit shrunk to admit a pending job is not shrunk for another one during this long (0: only the "
         "cooldown); protects long jobs from being every arrival's victim"),
    _def("admit_keep_percent", Kind.PERCENT, 0, 0, 100, ALL_SCOPES,
         "a unit shrunk to admit pending jobs keeps at least this percent of its requested size (the size it "
         "started with), rounded up, and at least its min: bounds the slowdown shrink-to-admit may cause one "
         "job (0: down to its min)"),
    _def("tail_protection", Kind.BOOL, False, None, None, ALL_SCOPES,
         "bounded slowdown: a unit that has run below its requested size for more than max_shrunk_share of "
         "its life is no longer shrunk to admit pending jobs or to restore a reserve, and grows back to its "
         "request first, ahead of pending jobs (SHRUNK_TOO_LONG, TAIL_PROTECTED)"),
    _def("max_shrunk_share", Kind.PERCENT, 30, 1, 100, ALL_SCOPES,
         "tail_protection: percent of a unit's life (since it started) it may run below its requested size"),
    _def("tail_min_shrunk_s", Kind.DURATION, 3600, 0, _YEAR, ALL_SCOPES,
         "tail_protection applies only once a unit has run shrunk for at least this long: a short job loses "
         "little in absolute terms, and protecting every job at once would undo shrink-to-admit"),
    _def("victim_by_service", Kind.BOOL, False, None, None, GLOBAL_ONLY,
         "shrink-to-admit and reserve-reclaim victims: least marginal loss first (efficiency / nodes: the "
         "share of its speed a unit loses per node), then most attained service (GPU-seconds consumed, as "
         "Tiresias' least-attained-service), instead of lowest priority first; only lower-priority units are "
         "ever victims"),
    _def("victim_by_remaining", Kind.BOOL, False, None, None, GLOBAL_ONLY,
         "shrink-to-admit and reserve-reclaim victims: least added time first (remaining time by the time "
         "limit / (nodes - 1): what losing one node adds to a unit at linear scaling; unknown last), so that "
         "long jobs are the last victims; wins over victim_by_service; only lower-priority units are ever "
         "victims"),
    _def("victim_by_goodput", Kind.BOOL, False, None, None, GLOBAL_ONLY,
         "shrink-to-admit and reserve-reclaim victims: least loss first, the seconds losing its last node adds "
         "to a unit's remaining run plus a restart, by the speedup_growth model (the goodput model for an "
         "opted-in unit, published throughput, else the linear-sync model of utilization); wins over "
         "victim_by_remaining and victim_by_service; only lower-priority units are ever victims"),
    _def("goodput_moves", Kind.BOOL, False, None, None, GLOBAL_ONLY,
         "node moves: a speedup_growth grow that finds no free node takes one from the unit whose last node "
         "is worth least, when the seconds it saves net of its restart exceed what the other loses plus its "
         "restart (GOODPUT_MOVE); one move per unit per cycle; needs speedup_growth for the growers"),
    _def("allocator", Kind.BOOL, False, None, None, GLOBAL_ONLY,
         "the goodput-fair allocator (policy/allocator.py): shrink-to-admit takes one node at a time from the "
         "unit whose finish-time fairness (rho = projected JCT / rigid-equivalent JCT) would stay lowest, none "
         "past fairness_max_rho or the waiting job's own rho, whichever is higher; spare nodes go to units behind "
         "their rigid pace first, then by the gain in sum(x ** fairness_power / fairness_power) (x: speed over "
         "the speed at the requested size); grows are valued by speedup_growth's model when it is on"),
    _def("fairness_power", Kind.FLOAT, -0.5, -4.0, -0.05, GLOBAL_ONLY,
         "allocator: the power p < 0 of the objective sum(x ** p / p) that ranks grows (Sia -0.5; Pollux's "
         "harmonic form -1): the more negative, the more a job below its requested speed counts"),
    _def("fairness_max_rho", Kind.FLOAT, 1.2, 1.0, 10.0, GLOBAL_ONLY,
         "allocator: no shrink for others takes a unit to a size at which its projected JCT would exceed this "
         "many times its rigid-equivalent JCT, unless the waiting job it gives way to is already further behind "
         "(then as far as that job's own)"),
    _def("admit_backoff_s", Kind.DURATION, 1800, 0, _DAY, GLOBAL_ONLY,
         "after a shrink-to-admit for a pending job, no further one for it until a job that held nodes of its "
         "partitions ends or its request changes, and at most this long"),
    _def("fair_share", Kind.BOOL, False, None, None, frozenset({Scope.GLOBAL, Scope.PARTITION}),
         "split a partition's spare nodes among grow candidates by account weights (sshare)"),
    _def("max_extension_nodes_per_account", Kind.INT, -1, -1, MAX_NODES,
         frozenset({Scope.GLOBAL, Scope.ACCOUNT}),
         "quota: most nodes one account may hold in extension jobs (-1: no quota)"),
    _def("max_extension_nodes_per_qos", Kind.INT, -1, -1, MAX_NODES, frozenset({Scope.GLOBAL, Scope.QOS}),
         "quota: most nodes one QOS may hold in extension jobs (-1: no quota)"),
    _def("max_extension_gpus_per_account", Kind.INT, -1, -1, 1_000_000,
         frozenset({Scope.GLOBAL, Scope.ACCOUNT}),
         "quota: most GPUs one account may hold in extension jobs (-1: no quota)"),
    _def("max_extension_gpus_per_qos", Kind.INT, -1, -1, 1_000_000, frozenset({Scope.GLOBAL, Scope.QOS}),
         "quota: most GPUs one QOS may hold in extension jobs (-1: no quota)"),
    _def("growth_cap_percent", Kind.PERCENT, 100, 0, 100, frozenset({Scope.GLOBAL, Scope.PARTITION}),
         "no grow of a unit in this partition once the partition's running jobs would hold more than this "
         "percent of the cluster's nodes (e.g. 50 in a daytime profile for train)"),
    _def("restart_cost_aware", Kind.BOOL, False, None, None, ALL_SCOPES,
         "grow only when the expected gain over the remaining time exceeds the restart cost"),
    _def("restart_cost_s", Kind.DURATION, 60, 0, _DAY, ALL_SCOPES,
         "seconds of progress one resize costs (a restart); the job's observed restart time wins"),
    _def("power_resume", Kind.BOOL, True, None, None, ALL_SCOPES,
         "grow onto nodes Slurm's power saving has powered down (POWERED_DOWN) once no powered-on free node "
         "fits, when the expected gain pays for their resume plus a restart (POWER_RESUME_COST otherwise); "
         "the extension job names them and Slurm resumes them"),
    _def("power_resume_s", Kind.DURATION, 120, 0, _DAY, ALL_SCOPES,
         "seconds a powered-down node takes to resume when its history has no measured resume (Slurm's "
         "ResumeTimeout bounds it either way)"),
    _def("power_resume_backoff_s", Kind.DURATION, 1800, 0, _DAY, GLOBAL_ONLY,
         "a node whose resume failed (ResumeTimeout) is not grown onto again for this long"),
    _def("goodput", Kind.BOOL, False, None, None, ALL_SCOPES,
         "use the job's published throughput: grow only while marginal efficiency is high enough, "
         "shrink back when a grow did not pay"),
    _def("goodput_min_marginal_efficiency", Kind.FLOAT, 0.5, 0.0, 1.0, ALL_SCOPES,
         "least marginal efficiency (gain of a step / gain of perfect scaling) to grow or stay grown"),
    _def("speedup_growth", Kind.BOOL, False, None, None, ALL_SCOPES,
         "speedup-aware growth: a unit grows when its next step's speedup (from its published throughput, "
         "else the linear-sync model fitted to its utilization) saves more of its remaining time than one "
         "restart costs and its marginal efficiency is at least goodput_min_marginal_efficiency, whatever "
         "its utilization band says; spare nodes go to the largest saving first (SPEEDUP_GAIN, "
         "LOW_SPEEDUP_GAIN)"),
    _def("moldable_start", Kind.BOOL, True, None, None, ALL_SCOPES,
         "moldable start: a pending elastic job (resolved for its partition, account and QOS) that cannot "
         "start at its request but whose #ELASTIC min fits the free whole nodes is reshaped to start now on "
         "them, with its time limit scaled by request / size; it keeps its request as its max and grows "
         "back (MOLDABLE_START)"),
    _def("mold_only_if_faster", Kind.BOOL, False, None, None, ALL_SCOPES,
         "moldable start only when it pays for the job itself: a waiting job is molded only if its run at the "
         "smaller size (its time limit x request / size) ends no later than waiting for its request would "
         "(the running jobs' expected ends: start + time limit) plus its run at the request"),
    _def("gpu_granular_growth", Kind.BOOL, False, None, None, ALL_SCOPES,
         "GPU-granular growth: a grow that finds no whole free node takes the free GPUs of a node other jobs "
         "partly use, up to its GPUs per node, as one extension job with --gres=gpu:k; "
         "a shrink gives them back by cancelling it. A job with #ELASTIC --whole-nodes "
         "keeps whole nodes"),
    # --- serving units (#ELASTIC --serving; docs/serving.md) ---------------------------------------------------
    _def("serving_risk_percent", Kind.PERCENT, 90, 1, 100, ALL_SCOPES,
         "serving: the SLO is at risk (scale out at once, SLO_AT_RISK) when the p99 latency of the short window "
         "is above this percent of --slo-p99, or the requests per replica above this percent of "
         "--target-rps-per-replica"),
    _def("serving_headroom_percent", Kind.PERCENT, 70, 1, 99, ALL_SCOPES,
         "serving: scale in (SLO_HEADROOM) only when, over the whole long window, the p99 latency stayed below "
         "this percent of the SLO and the load would stay below this percent of one replica fewer's capacity"),
    _def("serving_up_window_s", Kind.DURATION, 60, 10, 3600, ALL_SCOPES,
         "serving: the short window whose worst p99 and peak load decide a scale-out"),
    _def("serving_down_window_s", Kind.DURATION, 900, 60, _DAY, ALL_SCOPES,
         "serving: the long window that must show headroom throughout before a scale-in"),
    _def("serving_down_cooldown_s", Kind.DURATION, 900, 0, _DAY, ALL_SCOPES,
         "serving: no scale-in for this long after any resize of the unit (scale-out has no cooldown beyond "
         "the replicas' cold start)"),
    _def("serving_cold_start_s", Kind.DURATION, 60, 0, 3600, ALL_SCOPES,
         "serving: seconds a new replica takes to serve; a scale-out waits this long for the last one to "
         "take load, and the forecast reserves this far ahead of a peak (the measured cold start wins)"),
    _def("min_throughput_samples", Kind.INT, 3, 1, 100_000, ALL_SCOPES,
         "fewest throughput samples at a size before that size's throughput is trusted"),
    _def("throughput_max_age_s", Kind.DURATION, 21600, 60, 7 * _DAY, ALL_SCOPES,
         "throughput samples older than this are forgotten, at every size: a job whose speed changes over "
         "training is not judged on old numbers, and a size that did not pay is tried again later"),
)

BY_NAME: Mapping[str, KeyDef] = {k.name: k for k in KEYS}
DEFAULTS: Mapping[str, Value] = {k.name: k.default for k in KEYS}

#: Profiles every config has (a site's [profile.NAME] of the same name replaces one), for
#: ``active_profile = "NAME"`` or a site profile's windows. ``utilization-band`` is the seed's policy: grow above
#: 80% and shrink below 40% mean utilization, no shrink-to-admit (docs/policy.md, "Packaged profiles").
PACKAGED_PROFILES: Mapping[str, Mapping[str, Value]] = {
    "utilization-band": {"scale_up_above": 80, "scale_down_below": 40, "shrink_to_admit": False},
}

#: Top-level keys that are not settings.
META_KEYS: Mapping[str, str] = {
    "version": f"config format version; must be {CONFIG_VERSION}",
    "active_profile": "name of the profile overlaid on everything else (optional; the shell may set it)",
    "timezone": "IANA time zone in which profile windows are read (default UTC), e.g. 'Europe/Berlin'",
}
SCOPE_TABLES: Mapping[str, Scope] = {"partition": Scope.PARTITION, "account": Scope.ACCOUNT, "qos": Scope.QOS}
PROFILE_TABLE = "profile"


def _toml_value(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def render_defaults_toml() -> str:
    """The packaged defaults as a commented TOML file (valid input for the loader)."""
    lines = [
        "# slurm-elastic policy: packaged defaults. Copy and change what your site needs.",
        "# Tables [partition.NAME], [account.NAME], [qos.NAME] override keys for their scope;",
        "# [profile.NAME] (with its own partition/account/qos tables) is overlaid when active_profile names it",
        "# or when one of its windows = [\"Mon-Fri 08:00-20:00\", ...] contains the current time.",
        "",
        f"version = {CONFIG_VERSION}",
        "",
    ]
    for key in KEYS:
        extra = f"; range {key.range_text()}" if key.range_text() else ""
        lines.append(f"# {key.doc} ({key.kind.value}{extra}; scopes: {key.scopes_text()})")
        lines.append(f"{key.name} = {_toml_value(key.default)}")
    return "\n".join(lines) + "\n"


def render_keys_markdown() -> str:
    """The keys table of docs/policy.md."""
    out = [
        "| key | type | default | range | scopes | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for key in KEYS:
        directive = " (an `#ELASTIC` directive wins)" if key.directive else ""
        out.append(
            f"| `{key.name}` | {key.kind.value} | `{_toml_value(key.default)}` | {key.range_text()} | "
            f"{key.scopes_text()} | {key.doc}{directive} |"
        )
    return "\n".join(out) + "\n"
