"""ElasticSpec (what a job asked for), its normalized text form, and the checks between options.

The normalized form is what plugins/job_submit.lua stores on the job (inside ``[...]`` in admin_comment, see
:mod:`slurm_elastic.directives.admin_comment`). Grammar, exactly::

    normalized = "elastic:v1" *( " " key "=" value )

- keys appear in this order, each at most once: het min max step up down window cooldown grace signal grow
  shrink serving slo rps prewarm prewarmtimeout whole;
- only options the user wrote are present (defaults are left out, so that a site's policy defaults apply to
  them and ``explain`` can tell a directive from a default); ``het`` is present only for a component of a
  heterogeneous job;
- numbers are decimal without sign or leading zeros; durations are whole seconds; the signal is its name
  without ``SIG`` (``USR1``); ``grow`` and ``shrink`` only ever appear as ``grow=0`` / ``shrink=0``,
  ``serving`` and ``whole`` only as ``=1``; ``slo`` is whole milliseconds; ``prewarm`` is the command's bytes in
  upper-case hex (a command has spaces, quotes and brackets; hex keeps the form one token of ``[0-9A-F]``).

Example: ``#ELASTIC --min-nodes 1 --max-nodes=3 --window 1h30m --signal SIGusr2`` normalizes to
``elastic:v1 min=1 max=3 window=5400 signal=USR2``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from slurm_elastic.directives.options import (
    BY_FIELD,
    BY_KEY,
    FORMAT_VERSION,
    MAX_HET_GROUP,
    SETTINGS,
    SIGNALS,
    OptionKind,
)
from slurm_elastic.directives.values import InvalidValue, check_command
from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.keyschema import MAX_NODES

FORMAT_TAG = f"elastic:{FORMAT_VERSION}"

Value = int | str | bool


@dataclass(frozen=True)
class DirectiveError:
    """One problem with a script's ``#ELASTIC`` lines. Data, not an exception: a parse returns all of them.

    ``option`` is the option as written (``--min-nodes``), or ``#ELASTIC`` for a problem with the line itself.
    ``allowed`` says what would be accepted, when that can be said in a few words.
    """

    line: int
    option: str
    message: str
    allowed: str | None = None

    def describe(self) -> str:
        """``--option: why (allowed: range)``."""
        tail = f" (allowed: {self.allowed})" if self.allowed else ""
        return f"{self.option}: {self.message}{tail}"

    def format(self, source: str) -> str:
        """``SOURCE:LINE: --option: why (allowed: range)``, the compiler-style line ``check`` prints."""
        return f"{source}:{self.line}: {self.describe()}"

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "option": self.option, "message": self.message, "allowed": self.allowed}


@dataclass(frozen=True)
class DirectiveWarning:
    """Something that is legal but probably not what the user meant (e.g. ``#ELASTIC`` after a command)."""

    line: int
    message: str

    def format(self, source: str) -> str:
        return f"{source}:{self.line}: warning: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "message": self.message}


class SpecError(SlurmElasticError):
    """An ElasticSpec that breaks the option table's ranges or the rules between options."""


class SpecFormatError(SpecError):
    """Text that is not a valid normalized spec (``elastic:v1 ...``)."""


def _default(field: str) -> Any:
    """The option table's default of ``field`` (for the keys a policy also sets: the policy's packaged default)."""
    return BY_FIELD[field].default


@dataclass(frozen=True)
class ElasticSpec:
    """The elastic behaviour of one job, or of one component of a heterogeneous job; every field resolved.

    ``explicit`` names the fields (attribute names) that a directive set; every other field holds the
    built-in default from :data:`slurm_elastic.directives.options.OPTIONS` (the policy's packaged default for the
    keys a policy also sets), which a site policy may replace
    with :meth:`with_defaults`. ``max_nodes`` is None when no directive set it: it then means "the node count
    the job was submitted with", which only the controller knows.
    """

    het_group: int | None = None
    min_nodes: int = _default("min_nodes")
    max_nodes: int | None = None
    step: int = _default("step")
    scale_up_above: int = _default("scale_up_above")
    scale_down_below: int = _default("scale_down_below")
    window_s: int = _default("window_s")
    cooldown_s: int = _default("cooldown_s")
    grace_s: int = _default("grace_s")
    signal: str = _default("signal")
    grow: bool = _default("grow")
    shrink: bool = _default("shrink")
    serving: bool = _default("serving")
    slo_p99_ms: int | None = None
    target_rps_per_replica: int | None = None
    prewarm: str | None = None
    prewarm_timeout_s: int = _default("prewarm_timeout_s")
    whole_nodes: bool = _default("whole_nodes")
    explicit: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        problems = _spec_problems(self)
        if problems:
            raise SpecError("invalid elastic spec: " + "; ".join(problems))

    def source(self, field: str) -> Literal["directive", "default"]:
        """Where the value of ``field`` came from, for ``explain``."""
        if field not in BY_FIELD:
            raise KeyError(field)
        return "directive" if field in self.explicit else "default"

    def with_defaults(self, defaults: Mapping[str, Value | None]) -> ElasticSpec:
        """A copy where the fields not set by a directive take ``defaults`` (e.g. a site's policy defaults).

        Keys are field names; ``het_group`` and ``explicit`` can not be given. Raises SpecError when a key is
        unknown, a value is out of range, or the result breaks a rule between options (for example a policy
        default scale-down threshold above a directive's scale-up threshold).
        """
        changes: dict[str, Any] = {}
        for name, value in defaults.items():
            if name not in BY_FIELD or name == "het_group":
                raise SpecError(f"unknown elastic spec field {name!r}")
            if name not in self.explicit:
                changes[name] = value
        result = dataclasses.replace(self, **changes)
        known = self.explicit | set(defaults)  # fields whose values are now given, not placeholders
        if {"scale_up_above", "scale_down_below"} <= known and result.scale_down_below >= result.scale_up_above:
            raise SpecError(f"invalid elastic spec: scale_down_below={result.scale_down_below} is not below "
                            f"scale_up_above={result.scale_up_above}")
        return result

    def to_normalized(self) -> str:
        """The normalized text form (see the module docstring)."""
        parts = [FORMAT_TAG]
        if self.het_group is not None:
            parts.append(f"het={self.het_group}")
        for opt in SETTINGS:
            if opt.field in self.explicit:
                parts.append(f"{opt.key}={_render(getattr(self, opt.field), opt.kind)}")
        return " ".join(parts)

    @classmethod
    def from_normalized(cls, text: str) -> ElasticSpec:
        """Parse the normalized text form; exact inverse of :meth:`to_normalized`. Raises SpecFormatError."""
        return from_normalized(text)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["explicit"] = sorted(self.explicit)
        out["normalized"] = self.to_normalized()
        return out


def _render(value: Value | None, kind: OptionKind | None = None) -> str:
    if kind is OptionKind.COMMAND and isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").hex().upper()
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _spec_problems(spec: ElasticSpec) -> list[str]:
    problems: list[str] = []
    unknown = sorted(spec.explicit - {o.field for o in SETTINGS})
    if unknown:
        problems.append(f"unknown explicit fields {unknown}")
    if spec.het_group is not None and not (
        isinstance(spec.het_group, int) and 0 <= spec.het_group <= MAX_HET_GROUP
    ):
        problems.append(f"het_group {spec.het_group!r} is not in 0..{MAX_HET_GROUP}")
    for opt in SETTINGS:
        value = getattr(spec, opt.field)
        if opt.kind is OptionKind.FLAG:
            if not isinstance(value, bool):
                problems.append(f"{opt.field} must be a bool")
            elif opt.field in spec.explicit and value == opt.default:
                problems.append(f"{opt.field} can only be set to {not opt.default} by a directive ({opt.option})")
        elif opt.kind is OptionKind.SIGNAL:
            if value not in SIGNALS:
                problems.append(f"{opt.field} {value!r} is not one of {', '.join(SIGNALS)}")
        elif value is None and opt.default is None and opt.field not in spec.explicit:
            pass  # max_nodes: "the submitted node count"; serving objectives, prewarm: none
        elif opt.kind is OptionKind.COMMAND:
            if not isinstance(value, str):
                problems.append(f"{opt.field} must be a command string, not {value!r}")
            else:
                try:
                    check_command(opt, value.encode("utf-8", "surrogateescape"))
                except InvalidValue as e:
                    problems.append(f"{opt.field}: {e.message}")
        elif isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{opt.field} must be an int, not {value!r}")
        elif opt.lo is not None and opt.hi is not None and not opt.lo <= value <= opt.hi:
            problems.append(f"{opt.field}={value} is not in {opt.lo}..{opt.hi}")
    if problems:
        return problems
    if spec.max_nodes is not None and spec.min_nodes > spec.max_nodes:
        problems.append(f"min_nodes={spec.min_nodes} is above max_nodes={spec.max_nodes}")
    band_given = {"scale_up_above", "scale_down_below"} <= spec.explicit  # one alone meets the site's other
    if band_given and spec.scale_down_below >= spec.scale_up_above:
        problems.append(
            f"scale_down_below={spec.scale_down_below} is not below scale_up_above={spec.scale_up_above}"
        )
    if not spec.grow and not spec.shrink:
        problems.append("grow and shrink are both off: the job could never be resized")
    has_objective = spec.slo_p99_ms is not None or spec.target_rps_per_replica is not None
    if spec.serving and not has_objective:
        problems.append("serving needs an objective: slo_p99_ms and/or target_rps_per_replica")
    if has_objective and not spec.serving:
        problems.append("slo_p99_ms and target_rps_per_replica are for serving jobs only")
    if "prewarm_timeout_s" in spec.explicit and spec.prewarm is None:
        problems.append("prewarm_timeout_s needs prewarm")
    return problems


# --- resolution: settings (from directives or normalized text) -> spec, with the rules between options ------


@dataclass(frozen=True)
class Setting:
    """A value a directive set, and where: line (1-based; 0 for normalized text) and token index."""

    value: Value
    line: int
    col: int

    @property
    def pos(self) -> tuple[int, int]:
        return (self.line, self.col)


def _where(s: Setting | None) -> str:
    if s is None:
        return "the default"
    return f"set on line {s.line}" if s.line > 0 else "as given"


def check_rules(settings: Mapping[str, Setting]) -> list[DirectiveError]:
    """Errors for rules between options (min <= max, down < up, not both --no-grow and --no-shrink, serving
    with an objective and objectives only with serving).

    Each is reported at the option that was set later (by line, then position on the line): that is the one
    the user most likely has to change. Unset options count with their built-in defaults.
    """
    errors: list[DirectiveError] = []

    def value(field: str) -> Any:
        s = settings.get(field)
        return s.value if s is not None else BY_FIELD[field].default

    mn, mx = settings.get("min_nodes"), settings.get("max_nodes")
    if mx is not None and value("min_nodes") > value("max_nodes"):
        assert mn is not None  # the default minimum (1) is never above a valid maximum
        if mx.pos > mn.pos:
            errors.append(DirectiveError(
                mx.line, "--max-nodes", f"{mx.value} is below --min-nodes {mn.value}, {_where(mn)}",
                f"{mn.value}..{MAX_NODES}"))
        else:
            errors.append(DirectiveError(
                mn.line, "--min-nodes", f"{mn.value} is above --max-nodes {mx.value}, {_where(mx)}",
                f"1..{mx.value}"))

    # Both thresholds given: they must make a band. One alone is combined with the site's policy for the job's
    # partition and account, which only the controller (and `slurm-elastic check --policy`) knows: the
    # option table's defaults are the packaged ones (20..90), not the site's, so they are not compared with here.
    up_s, down_s = settings.get("scale_up_above"), settings.get("scale_down_below")
    up, down = value("scale_up_above"), value("scale_down_below")
    if up_s is not None and down_s is not None and down >= up:
        if up_s.pos > down_s.pos:
            errors.append(DirectiveError(
                up_s.line, "--scale-up-above",
                f"{up} is not above --scale-down-below {down}, {_where(down_s)}",
                f"{down + 1}..100"))
        else:
            errors.append(DirectiveError(
                down_s.line, "--scale-down-below",
                f"{down} is not below --scale-up-above {up}, {_where(up_s)}", f"0..{up - 1}"))

    no_grow, no_shrink = settings.get("grow"), settings.get("shrink")
    if no_grow is not None and no_shrink is not None:
        later, earlier = (no_shrink, no_grow) if no_shrink.pos > no_grow.pos else (no_grow, no_shrink)
        later_opt = "--no-shrink" if later is no_shrink else "--no-grow"
        earlier_opt = "--no-grow" if later is no_shrink else "--no-shrink"
        errors.append(DirectiveError(
            later.line, later_opt,
            f"with {earlier_opt} ({_where(earlier)}) the job could never be resized", None))

    serving = settings.get("serving")
    objectives = [(o, settings[f]) for o, f in (("--slo-p99", "slo_p99_ms"),
                                                  ("--target-rps-per-replica", "target_rps_per_replica"))
                  if f in settings]
    if serving is not None and not objectives:
        errors.append(DirectiveError(
            serving.line, "--serving", "needs an objective: --slo-p99 and/or --target-rps-per-replica", None))
    if serving is None:
        for option, s in objectives:
            errors.append(DirectiveError(s.line, option, "is for serving jobs: add --serving", None))
    timeout = settings.get("prewarm_timeout_s")
    if timeout is not None and "prewarm" not in settings:
        errors.append(DirectiveError(timeout.line, "--prewarm-timeout", "needs --prewarm", None))
    return errors


def build_spec(settings: Mapping[str, Setting], het_group: int | None) -> ElasticSpec:
    """The spec for settings that passed :func:`check_rules`."""
    values: dict[str, Any] = {field: s.value for field, s in settings.items()}
    return ElasticSpec(het_group=het_group, explicit=frozenset(settings), **values)


# --- normalized text -> spec ------------------------------------------------------------------------------

_KEY_VALUE = re.compile(r"([a-z]+)=([0-9A-Z]+)")
_CANONICAL_NUMBER = re.compile(r"0|[1-9][0-9]{0,8}")
_HEX = re.compile(r"(?:[0-9A-F]{2})+")


def from_normalized(text: str) -> ElasticSpec:
    """Parse ``elastic:v1 ...`` (see the module docstring). Raises SpecFormatError on anything else."""
    if not isinstance(text, str):
        raise SpecFormatError(f"normalized spec must be text, not {type(text).__name__}")
    tokens = text.split(" ")
    head = tokens[0]
    if head != FORMAT_TAG:
        if head.startswith("elastic:v"):
            raise SpecFormatError(f"unsupported elastic spec version {head!r} (this is {FORMAT_TAG})")
        raise SpecFormatError(f"not an elastic spec: {text[:80]!r} (expected {FORMAT_TAG!r} first)")
    settings: dict[str, Setting] = {}
    het_group: int | None = None
    for col, token in enumerate(tokens[1:], start=1):
        m = _KEY_VALUE.fullmatch(token)
        if m is None or m.group(1) not in BY_KEY:
            raise SpecFormatError(f"bad item {token[:40]!r} in elastic spec {text[:80]!r}")
        opt, raw = BY_KEY[m.group(1)], m.group(2)
        value: Value
        if opt.kind is OptionKind.FLAG:
            if raw != _render(not opt.default):
                raise SpecFormatError(
                    f"{opt.key}= can only be {_render(not opt.default)} in elastic spec {text[:80]!r}")
            value = not opt.default
        elif opt.kind is OptionKind.SIGNAL:
            if raw not in SIGNALS:
                raise SpecFormatError(f"unknown signal {raw!r} in elastic spec {text[:80]!r}")
            value = raw
        elif opt.kind is OptionKind.COMMAND:
            if not _HEX.fullmatch(raw):
                raise SpecFormatError(f"bad command {token[:40]!r} in elastic spec {text[:80]!r}")
            command = bytes.fromhex(raw)
            try:
                check_command(opt, command)
            except InvalidValue as e:
                raise SpecFormatError(f"{opt.key}: {e.message} in elastic spec {text[:80]!r}") from None
            value = command.decode("utf-8", "surrogateescape")
        else:
            if not _CANONICAL_NUMBER.fullmatch(raw):
                raise SpecFormatError(f"bad number {token!r} in elastic spec {text[:80]!r}")
            value = int(raw)
            assert opt.lo is not None and opt.hi is not None
            if not opt.lo <= value <= opt.hi:
                raise SpecFormatError(f"{token!r} is out of range {opt.lo}..{opt.hi} in {text[:80]!r}")
        if opt.field == "het_group":
            assert isinstance(value, int)
            het_group = value
        else:
            settings[opt.field] = Setting(value, 0, col)
    problems = check_rules(settings)
    if problems:
        raise SpecFormatError(f"invalid elastic spec {text[:80]!r}: {problems[0].describe()}")
    spec = build_spec(settings, het_group)
    if spec.to_normalized() != text:
        raise SpecFormatError(
            f"elastic spec {text[:80]!r} is not in normal form (expected {spec.to_normalized()!r})")
    return spec
