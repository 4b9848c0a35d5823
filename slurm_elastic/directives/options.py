"""The ``#ELASTIC`` options as data: spelling, normalized key, spec field and one :class:`~slurm_elastic.keyschema.Key`
each (kind, default, allowed range, doc).

This table is the single source of truth for the grammar. The parser, the normalizer, ``slurm-elastic check``
and docs/directives.md all follow it; plugins/job_submit.lua's option table is rendered
from it by scripts/render-keys, and unit tests compare the two (tests/unit/test_keys_rendered.py,
tests/unit/test_directives_lua.py), so they can not drift apart silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slurm_elastic.keyschema import JOB_KEYS, MAX_NODES, Key, Kind

#: Version tag of the normalized form (``elastic:v1 ...``). Bump it when the meaning of a key changes.
FORMAT_VERSION = "v1"

#: Limits that bound the work a script can cause at submit time (slurmctld holds its job lock meanwhile).
MAX_LINE_BYTES = 1024  # an #ELASTIC line longer than this is an error (a full line needs ~250 bytes)
MAX_DIRECTIVE_LINES = 128  # more #ELASTIC lines than this: error, and reading stops
MAX_ERRORS = 20  # after this many errors one "too many errors" error is added and reading stops
MAX_WARNINGS = 10  # further warnings are dropped
MAX_HET_GROUP = 127  # Slurm allows at most 128 components in a heterogeneous job
MAX_COMMAND_BYTES = 256  # a --prewarm command (stored hex-encoded in the normalized form)


#: How an option's value is written and checked: the one :class:`~slurm_elastic.keyschema.Kind` (INT: decimal
#: digits; PERCENT: an optional trailing '%'; DURATION: see values.parse_duration; SIGNAL: a name or its Linux
#: number; FLAG: no value; MILLIS: 50ms, 50 or 2s; COMMAND: a command line, lo..hi bytes).
OptionKind = Kind


@dataclass(frozen=True)
class OptionDef:
    """One ``#ELASTIC`` option: its spelling, its key in the normalized form, the ElasticSpec field, and its
    :class:`~slurm_elastic.keyschema.Key` (kind, default, inclusive range, doc). The keys a site's policy also
    sets are the very ``JOB_KEYS`` declarations the policy uses, with the policy's packaged defaults."""

    option: str  # as written in a script: "--min-nodes"
    key: str  # key in the normalized form: "min"
    field: str  # ElasticSpec attribute: "min_nodes"
    decl: Key

    @property
    def kind(self) -> Kind:
        return self.decl.kind

    @property
    def default(self) -> int | str | bool | None:
        """None: no built-in default (see doc)."""
        return self.decl.default  # type: ignore[no-any-return]

    @property
    def lo(self) -> int | None:
        """Inclusive bounds for INT, PERCENT (percent), DURATION (seconds), MILLIS (ms), COMMAND (bytes)."""
        return None if self.decl.lo is None else int(self.decl.lo)

    @property
    def hi(self) -> int | None:
        return None if self.decl.hi is None else int(self.decl.hi)

    @property
    def doc(self) -> str:
        return self.decl.doc


#: Signals a job may ask for as its warning before nodes are taken away, with their Linux numbers.
SIGNALS: Mapping[str, int] = {
    "HUP": 1,
    "INT": 2,
    "QUIT": 3,
    "USR1": 10,
    "USR2": 12,
    "ALRM": 14,
    "TERM": 15,
    "CONT": 18,
    "URG": 23,
    "XCPU": 24,
    "WINCH": 28,
}
#: Signals that can not be caught: a job warned with them could not checkpoint.
UNCATCHABLE_SIGNALS: Mapping[str, int] = {"KILL": 9, "STOP": 19}

HET_GROUP_OPTION = "--het-group"

OPTIONS: tuple[OptionDef, ...] = (
    OptionDef("--min-nodes", "min", "min_nodes", Key(Kind.INT, 1, "fewest nodes the job is shrunk to", 1, MAX_NODES,
                                                     unit="nodes")),
    OptionDef("--max-nodes", "max", "max_nodes", Key(
        Kind.INT, None, "most nodes the job is grown to; must be >= --min-nodes; unset: the node count the job was "
        "submitted with", 1, MAX_NODES, unit="nodes")),
    OptionDef("--step", "step", "step", JOB_KEYS["step"]),
    OptionDef("--scale-up-above", "up", "scale_up_above", JOB_KEYS["scale_up_above"]),
    OptionDef("--scale-down-below", "down", "scale_down_below", JOB_KEYS["scale_down_below"]),
    OptionDef("--window", "window", "window_s", JOB_KEYS["window_s"]),
    OptionDef("--cooldown", "cooldown", "cooldown_s", JOB_KEYS["cooldown_s"]),
    OptionDef("--grace", "grace", "grace_s", JOB_KEYS["grace_s"]),
    OptionDef("--signal", "signal", "signal", JOB_KEYS["signal"]),
    OptionDef(HET_GROUP_OPTION, "het", "het_group", Key(
        Kind.INT, None, "the options on this line apply to this component of a heterogeneous job", 0,
        MAX_HET_GROUP)),
    OptionDef("--no-grow", "grow", "grow", Key(Kind.FLAG, True, "never grow the job")),
    OptionDef("--no-shrink", "shrink", "shrink", Key(Kind.FLAG, True, "never shrink the job")),
    OptionDef("--serving", "serving", "serving", Key(
        Kind.FLAG, False, "the job serves requests: one replica per node, scaled on its load and latency "
        "(docs/serving.md); needs --slo-p99 and/or --target-rps-per-replica")),
    OptionDef("--slo-p99", "slo", "slo_p99_ms", Key(
        Kind.MILLIS, None, "serving objective: 99th percentile request latency the job must stay under; needs "
        "--serving", 1, 600000)),
    OptionDef("--target-rps-per-replica", "rps", "target_rps_per_replica", Key(
        Kind.INT, None, "serving objective: requests per second one replica should carry; needs --serving", 1,
        10000000, unit="requests/s")),
    OptionDef("--prewarm", "prewarm", "prewarm", Key(
        Kind.COMMAND, None, "command an extension job runs on each of its new nodes before they join (stage data, "
        "load the model); quoted like a shell word, run without a shell as the job's user (docs/power-saving.md)",
        1, MAX_COMMAND_BYTES, unit="bytes")),
    OptionDef("--prewarm-timeout", "prewarmtimeout", "prewarm_timeout_s", Key(
        Kind.DURATION, 600, "a --prewarm command still running after this long fails the grow; needs --prewarm",
        1, 86400)),
    OptionDef("--whole-nodes", "whole", "whole_nodes", Key(
        Kind.FLAG, False, "grow only by whole nodes, never by a few GPUs on a shared node (e.g. a job that needs "
        "NVLink between all its GPUs; policy key gpu_granular_growth)")),
)

BY_OPTION: Mapping[str, OptionDef] = {o.option: o for o in OPTIONS}
BY_KEY: Mapping[str, OptionDef] = {o.key: o for o in OPTIONS}
BY_FIELD: Mapping[str, OptionDef] = {o.field: o for o in OPTIONS}

#: Options that describe the elastic behaviour (everything except the scope selector --het-group).
SETTINGS: tuple[OptionDef, ...] = tuple(o for o in OPTIONS if o.option != HET_GROUP_OPTION)

ALL_OPTIONS_TEXT = ", ".join(o.option for o in OPTIONS)
