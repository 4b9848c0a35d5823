"""The ``#ELASTIC`` options as data: name, type, default and allowed range, one row each.

This table is the single source of truth for the grammar. The parser, the normalizer, ``slurm-elastic check``
and docs/directives.md all follow it; plugins/job_submit.lua carries a copy that a unit test compares with
this one (tests/unit/directives/test_lua_vectors.py), so the two can not drift apart silently.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

#: Version tag of the normalized form (``elastic:v1 ...``). Bump it when the meaning of a key changes.
FORMAT_VERSION = "v1"

#: Limits that bound the work a script can cause at submit time (slurmctld holds its job lock meanwhile).
MAX_LINE_BYTES = 1024  # an #ELASTIC line longer than this is an error (a full line needs ~250 bytes)
MAX_DIRECTIVE_LINES = 128  # more #ELASTIC lines than this: error, and reading stops
MAX_ERRORS = 20  # after this many errors one "too many errors" error is added and reading stops
MAX_WARNINGS = 10  # further warnings are dropped
MAX_HET_GROUP = 127  # Slurm allows at most 128 components in a heterogeneous job
MAX_NODES = 65536
MAX_COMMAND_BYTES = 256  # a --prewarm command (stored hex-encoded in the normalized form)


class OptionKind(enum.Enum):
    """How an option's value is written and checked."""

    INT = "int"  # decimal digits
    PERCENT = "percent"  # decimal digits, an optional trailing '%'
    DURATION = "duration"  # see values.parse_duration
    SIGNAL = "signal"  # a name (USR1, SIGUSR1, usr1) or its Linux number
    FLAG = "flag"  # no value: writing it sets the opposite of the default
    MILLIS = "millis"  # a latency: 50ms, 50 (milliseconds) or 2s
    COMMAND = "command"  # a command line, usually quoted (directives/words.py); lo..hi bytes


@dataclass(frozen=True)
class OptionDef:
    """One ``#ELASTIC`` option."""

    option: str  # as written in a script: "--min-nodes"
    key: str  # key in the normalized form: "min"
    field: str  # ElasticSpec attribute: "min_nodes"
    kind: OptionKind
    default: int | str | bool | None  # None: no built-in default (see doc)
    lo: int | None  # inclusive bounds for INT, PERCENT (percent), DURATION (seconds) and MILLIS (ms)
    hi: int | None
    doc: str


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
    OptionDef("--min-nodes", "min", "min_nodes", OptionKind.INT, 1, 1, MAX_NODES,
              "fewest nodes the job is shrunk to"),
    OptionDef("--max-nodes", "max", "max_nodes", OptionKind.INT, None, 1, MAX_NODES,
              "most nodes the job is grown to; must be >= --min-nodes; unset: the node count the job was "
              "submitted with"),
    OptionDef("--step", "step", "step", OptionKind.INT, 1, 1, MAX_NODES,
              "nodes added or removed by one resize"),
    OptionDef("--scale-up-above", "up", "scale_up_above", OptionKind.PERCENT, 80, 1, 100,
              "grow when GPU utilization stays above this percentage for the window; must be above "
              "--scale-down-below"),
    OptionDef("--scale-down-below", "down", "scale_down_below", OptionKind.PERCENT, 40, 0, 99,
              "shrink when GPU utilization stays below this percentage for the window"),
    OptionDef("--window", "window", "window_s", OptionKind.DURATION, 600, 10, 86400,
              "how long utilization must stay beyond a threshold before the job is resized"),
    OptionDef("--cooldown", "cooldown", "cooldown_s", OptionKind.DURATION, 300, 0, 86400,
              "no further resize for this long after one"),
    OptionDef("--grace", "grace", "grace_s", OptionKind.DURATION, 120, 0, 3600,
              "time between the warning signal and taking nodes away (for a checkpoint)"),
    OptionDef("--signal", "signal", "signal", OptionKind.SIGNAL, "USR1", None, None,
              "signal sent to the job before nodes are taken away"),
    OptionDef(HET_GROUP_OPTION, "het", "het_group", OptionKind.INT, None, 0, MAX_HET_GROUP,
              "the options on this line apply to this component of a heterogeneous job"),
    OptionDef("--no-grow", "grow", "grow", OptionKind.FLAG, True, None, None,
              "never grow the job"),
    OptionDef("--no-shrink", "shrink", "shrink", OptionKind.FLAG, True, None, None,
              "never shrink the job"),
    OptionDef("--serving", "serving", "serving", OptionKind.FLAG, False, None, None,
              "the job serves requests: one replica per node, scaled on its load and latency "
              "(docs/serving.md); needs --slo-p99 and/or --target-rps-per-replica"),
    OptionDef("--slo-p99", "slo", "slo_p99_ms", OptionKind.MILLIS, None, 1, 600000,
              "serving objective: 99th percentile request latency the job must stay under; needs --serving"),
    OptionDef("--target-rps-per-replica", "rps", "target_rps_per_replica", OptionKind.INT, None, 1, 10000000,
              "serving objective: requests per second one replica should carry; needs --serving"),
    OptionDef("--prewarm", "prewarm", "prewarm", OptionKind.COMMAND, None, 1, MAX_COMMAND_BYTES,
              "command an extension job runs on each of its new nodes before they join (stage data, load the "
              "model); quoted like a shell word, run without a shell as the job's user (docs/power-saving.md)"),
    OptionDef("--prewarm-timeout", "prewarmtimeout", "prewarm_timeout_s", OptionKind.DURATION, 600, 1, 86400,
              "a --prewarm command still running after this long fails the grow; needs --prewarm"),
    OptionDef("--whole-nodes", "whole", "whole_nodes", OptionKind.FLAG, False, None, None,
              "grow only by whole nodes, never by a few GPUs on a shared node (e.g. a job that needs NVLink "
              "between all its GPUs; policy key gpu_granular_growth)"),
)

BY_OPTION: Mapping[str, OptionDef] = {o.option: o for o in OPTIONS}
BY_KEY: Mapping[str, OptionDef] = {o.key: o for o in OPTIONS}
BY_FIELD: Mapping[str, OptionDef] = {o.field: o for o in OPTIONS}

#: Options that describe the elastic behaviour (everything except the scope selector --het-group).
SETTINGS: tuple[OptionDef, ...] = tuple(o for o in OPTIONS if o.option != HET_GROUP_OPTION)

ALL_OPTIONS_TEXT = ", ".join(o.option for o in OPTIONS)
