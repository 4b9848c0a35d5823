"""One typed declaration per configuration key: :class:`Key` (kind, default, doc, inclusive range, unit).

Every place a user sets a value declares its keys with :class:`Key`: the controller's, the MIG workflow's and
the agent's TOML files (:mod:`slurm_elastic.configfile`, ``controller/config.py``, ``agent/config.py``), the
policy TOML (:mod:`slurm_elastic.policy.schema`, which adds the scopes) and the ``#ELASTIC`` directives
(:mod:`slurm_elastic.directives.options`, which adds the option's spelling). The keys a job may set with a
directive *and* a site with its policy are declared once, here, in :data:`JOB_KEYS`, with the policy's
packaged defaults: those are what a job that does not set them actually gets. The docs tables and
plugins/job_submit.lua's option table are rendered from these declarations by ``scripts/render-keys`` (a unit
test fails when the committed rendering differs from a fresh one).

Why frozen standard-library dataclasses and not msgspec or pydantic: measured with ``bench/key_schema.py``,
which builds the same schema in each library (docs/configuration-keys.md, "Why the standard library"). Reading
the packaged policy and a full controller.toml takes ~1.7-2.2 ms, of which tomllib's parse is 70-87%; the checks
are 0.2-0.5 ms, msgspec would take ~3 us and pydantic ~30-80 us. That is once at start-up or per ``policy set``,
so the at most 0.5 ms a faster validator saves decides nothing. The messages decide: the loaders collect *every*
problem, each with its TOML line and a "did you mean" (tests assert on them); msgspec stops at the first error
and names no line, pydantic has its own wording and is not a dependency, and the policy package may import only
the standard library.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class Kind(enum.Enum):
    """How a value is written and checked. The value is the word the docs and job_submit.lua use."""

    INT = "int"
    PERCENT = "percent"  # int, 0..100
    DURATION = "duration"  # whole seconds (a directive may write 1h30m)
    FLOAT = "float"
    NUMBER = "number"  # an int or a float in TOML
    BOOL = "bool"
    STR = "string"
    PATH = "path"
    TABLE = "table"
    SIGNAL = "signal"  # a name from directives.options.SIGNALS
    STR_LIST = "list of strings"
    INT_LIST = "list of ints"
    FLAG = "flag"  # a directive without a value: writing it sets the opposite of the default
    MILLIS = "millis"  # a latency: 50ms, 50 (milliseconds) or 2s
    COMMAND = "command"  # a command line, usually quoted (directives/words.py); lo..hi bytes


#: The Python types a TOML value of each kind may have (bool is never an int here).
_TOML_TYPES: Mapping[Kind, tuple[type, ...]] = {
    Kind.INT: (int,), Kind.PERCENT: (int,), Kind.DURATION: (int,), Kind.MILLIS: (int,),
    Kind.FLOAT: (int, float), Kind.NUMBER: (int, float), Kind.BOOL: (bool,), Kind.FLAG: (bool,),
    Kind.STR: (str,), Kind.PATH: (str,), Kind.SIGNAL: (str,), Kind.COMMAND: (str,), Kind.TABLE: (dict,),
    Kind.STR_LIST: (list,), Kind.INT_LIST: (list,),
}
_TYPE_WORDS: Mapping[Kind, str] = {
    Kind.INT: "an integer", Kind.PERCENT: "an integer", Kind.DURATION: "an integer", Kind.MILLIS: "an integer",
    Kind.FLOAT: "a number", Kind.NUMBER: "a number", Kind.BOOL: "true or false", Kind.FLAG: "true or false",
    Kind.STR: "a string", Kind.PATH: "a string", Kind.SIGNAL: "a string", Kind.COMMAND: "a string",
    Kind.TABLE: "a table", Kind.STR_LIST: "a list", Kind.INT_LIST: "a list",
}
_UNITS: Mapping[Kind, str] = {Kind.PERCENT: "%", Kind.DURATION: "s", Kind.MILLIS: "ms"}


@dataclass(frozen=True)
class Key:
    """One key: its kind, default (None: unset, or a default only the caller knows; the doc says which), a doc
    line, an optional inclusive range, its unit ("" for the kind's own: % for percent, s for durations) and an
    extra check that returns a problem (or None) for a value of the right type."""

    kind: Kind
    default: Any
    doc: str
    lo: float | None = None
    hi: float | None = None
    unit: str = ""
    check: Callable[[Any], str | None] | None = field(default=None, compare=False)

    @property
    def unit_text(self) -> str:
        return self.unit or _UNITS.get(self.kind, "")

    def range_text(self) -> str:
        """``lo..hi`` (whole numbers unless the kind is a float), ``>= lo``, or ""."""
        def num(v: float) -> str:
            return str(float(v)) if self.kind is Kind.FLOAT else f"{v:g}" if self.kind is Kind.NUMBER else str(int(v))

        if self.lo is not None and self.hi is not None:
            return f"{num(self.lo)}..{num(self.hi)}"
        if self.lo is not None:
            return f">= {num(self.lo)}"
        return ""

    def in_range(self, value: float) -> bool:
        return (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi)

    def problem(self, value: Any) -> str | None:
        """Why a TOML value does not fit this key (the config files' wording), or None."""
        types = _TOML_TYPES[self.kind]
        if isinstance(value, bool) and bool not in types:
            return f"expected {_TYPE_WORDS[self.kind]}, got a boolean"
        if not isinstance(value, types):
            return f"wrong type {type(value).__name__} (expected {_TYPE_WORDS[self.kind]})"
        if isinstance(value, int | float) and not isinstance(value, bool) and not self.in_range(value):
            return f"{value} out of range {self._range_g()}"
        return self.check(value) if self.check is not None else None

    def _range_g(self) -> str:
        lo = "" if self.lo is None else f"{self.lo:g}"
        hi = "" if self.hi is None else f"{self.hi:g}"
        return f"{lo}..{hi}"


_DAY = 86400

#: The agents' shared key (``auth = "hmac"``): the one default of the agent's ``key_file`` and of ``[agents]
#: key_file`` in controller.toml and mig.toml, so every program reads the same file when none is set.
AGENT_KEY_FILE = "/etc/slurm-elastic/agent.key"

#: Upper bound of node counts (a directive's --min-nodes, a step, a quota).
MAX_NODES = 65536

#: The keys a job sets with an ``#ELASTIC`` directive and a site with its policy (every scope): one declaration,
#: the policy's packaged default. A directive wins over the policy; a job that sets neither gets this default.
JOB_KEYS: Mapping[str, Key] = {
    "scale_up_above": Key(Kind.PERCENT, 90, "grow when mean GPU utilization over the window is above this "
                          "(percent); must be above scale_down_below", 1, 100),
    "scale_down_below": Key(Kind.PERCENT, 20, "shrink when mean GPU utilization over the window is below this "
                            "(percent); must be below scale_up_above", 0, 99),
    "window_s": Key(Kind.DURATION, 600, "seconds of samples a resize needs: utilization must stay beyond a "
                    "threshold for this long", 10, _DAY),
    "cooldown_s": Key(Kind.DURATION, 300, "no resize of a unit for this long after its last one (any outcome)",
                      0, _DAY),
    "grace_s": Key(Kind.DURATION, 120, "seconds between the warning signal and taking nodes away (for a "
                   "checkpoint)", 0, 3600),
    "signal": Key(Kind.SIGNAL, "USR1", "signal sent to the job before nodes are taken away"),
    "step": Key(Kind.INT, 1, "nodes added or removed by one resize", 1, MAX_NODES, unit="nodes"),
}
