"""Reads the ``#ELASTIC`` lines of a batch script, the way sbatch reads ``#SBATCH`` lines. Pure: no I/O.

Rules (docs/directives.md has the user's version):

- The script is split at ``\\n``; one trailing ``\\r`` per line is dropped. Lines are numbered from 1.
- Only the leading comment block is read: lines up to the first command, i.e. the first line whose first
  character other than space, tab, CR, VT or FF is not ``#``. Blank lines, ``#!``, ``#SBATCH`` and other
  comments belong to the block. ``#ELASTIC`` lines after the first command are ignored, with a warning.
- A directive line starts with exactly ``#ELASTIC`` in column 1, followed by a space, a tab or the end of the
  line. Its words are separated by spaces and tabs; a word starting with ``#`` starts a trailing comment; a
  word may be quoted (``'...'``, ``"..."``, no escapes; directives/words.py), as ``--prewarm`` needs.
- Options are long options only, written ``--opt VALUE`` or ``--opt=VALUE``; ``--no-grow``/``--no-shrink``
  take no value. No abbreviations. Unknown options are errors.
- ``--het-group N`` makes the options on its line apply to component N of a heterogeneous job. Lines without
  it apply to the whole job; with het groups present they are inherited by every group, which may override
  them. Setting an option twice for the same scope is an error (sbatch would silently take the last one;
  a resize policy should not depend on which of two lines wins).
- Every problem is reported (line, option, message, allowed), up to MAX_ERRORS. Any error means no spec.

plugins/job_submit.lua implements the same rules byte for byte; tests/vectors/directives.json holds the
cases both must agree on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from slurm_elastic.directives.options import (
    ALL_OPTIONS_TEXT,
    BY_OPTION,
    HET_GROUP_OPTION,
    MAX_DIRECTIVE_LINES,
    MAX_ERRORS,
    MAX_LINE_BYTES,
    MAX_WARNINGS,
    OptionDef,
    OptionKind,
)
from slurm_elastic.directives.spec import (
    DirectiveError,
    DirectiveWarning,
    ElasticSpec,
    Setting,
    Value,
    build_spec,
    check_rules,
)
from slurm_elastic.directives.values import InvalidValue, allowed_text, escape, parse_value, quote
from slurm_elastic.directives.words import Word, WordError, split_words

MAGIC = b"#ELASTIC"
LINE_OPTION = "#ELASTIC"  # the "option" of an error about a whole line

_BLANK = b" \t\r\x0b\x0c"
_NEAR_MISS = re.compile(rb"[ \t]*#+[ \t]*elastic[ \t]+--[a-z]", re.IGNORECASE)

AFTER_COMMAND_WARNING = "ignored: #ELASTIC lines after the first command (line {}) are not read"
NEAR_MISS_WARNING = "ignored: looks like a directive, but only lines that start with '#ELASTIC' are read"


@dataclass(frozen=True)
class ParseResult:
    """Everything a script's ``#ELASTIC`` lines say.

    ``specs``: one spec for the whole job (``het_group`` None), or one per ``--het-group`` in ascending
    order; empty when there is no directive or when there is any error.
    """

    specs: tuple[ElasticSpec, ...]
    errors: tuple[DirectiveError, ...]
    warnings: tuple[DirectiveWarning, ...]
    directive_lines: int  # how many #ELASTIC lines were read
    first_directive_line: int | None = None
    first_het_group_line: int | None = None  # first line with a valid --het-group

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def elastic(self) -> bool:
        """True when the script asks for elasticity and has no error."""
        return bool(self.specs)

    @property
    def het_groups(self) -> tuple[int, ...]:
        return tuple(s.het_group for s in self.specs if s.het_group is not None)


class _Stop(Exception):
    """Internal: a limit was hit; reading stops (never leaves this module)."""


@dataclass
class _State:
    errors: list[DirectiveError] = field(default_factory=list)
    warnings: list[DirectiveWarning] = field(default_factory=list)
    jobwide: dict[str, Setting] = field(default_factory=dict)
    groups: dict[int, dict[str, Setting]] = field(default_factory=dict)
    directive_lines: int = 0
    first_directive_line: int | None = None
    first_het_group_line: int | None = None

    def error(self, line: int, option: str, message: str, allowed: str | None = None) -> None:
        if len(self.errors) >= MAX_ERRORS:
            self.errors.append(DirectiveError(line, LINE_OPTION, "too many errors, stopped reading", None))
            raise _Stop
        self.errors.append(DirectiveError(line, option, message, allowed))

    def warn(self, line: int, message: str) -> None:
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(DirectiveWarning(line, message))


def to_bytes(script: str | bytes) -> bytes:
    """Scripts are bytes to Slurm; text is encoded as UTF-8 (undecodable bytes kept via surrogateescape)."""
    if isinstance(script, bytes):
        return script
    try:
        return script.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return script.encode("utf-8", "surrogatepass")


def _lines(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # "a\n" is one line, "" is none
    return lines


def _is_command(line: bytes) -> bool:
    stripped = line.lstrip(_BLANK)
    return bool(stripped) and not stripped.startswith(b"#")


def parse_script(script: str | bytes) -> ParseResult:
    """Parse a batch script's ``#ELASTIC`` directives. Never raises for any input."""
    st = _State()
    try:
        _read(to_bytes(script), st)
    except _Stop:
        return _result(st, (), stopped=True)
    specs: list[ElasticSpec] = []
    if st.directive_lines:
        scopes: list[tuple[int | None, dict[str, Setting]]]
        if st.groups:
            scopes = [(g, {**st.jobwide, **st.groups[g]}) for g in sorted(st.groups)]
        else:
            scopes = [(None, st.jobwide)]
        for het_group, settings in scopes:
            rule_errors = check_rules(settings)
            for e in rule_errors:
                if e not in st.errors:  # an inherited conflict is reported once, not once per group
                    try:
                        st.error(e.line, e.option, e.message, e.allowed)
                    except _Stop:
                        return _result(st, (), stopped=True)
            if not rule_errors:
                specs.append(build_spec(settings, het_group))
    return _result(st, () if st.errors else tuple(specs))


def _result(st: _State, specs: tuple[ElasticSpec, ...], stopped: bool = False) -> ParseResult:
    # Errors in line order (stable), so that they read like a compiler's; when reading stopped, the error
    # that stopped it stays last.
    body, tail = (st.errors[:-1], st.errors[-1:]) if stopped else (st.errors, [])
    return ParseResult(
        specs=specs,
        errors=tuple(sorted(body, key=lambda e: e.line)) + tuple(tail),
        warnings=tuple(st.warnings),
        directive_lines=st.directive_lines,
        first_directive_line=st.first_directive_line,
        first_het_group_line=st.first_het_group_line,
    )


def _read(data: bytes, st: _State) -> None:
    lines = _lines(data)
    command_line: int | None = None
    for lineno, raw in enumerate(lines, start=1):
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if line.startswith(MAGIC):
            _directive(lineno, line, st)
        elif _is_command(line):
            command_line = lineno
            break
        elif _NEAR_MISS.match(line):
            st.warn(lineno, NEAR_MISS_WARNING)
    if command_line is None:
        return
    for lineno in range(command_line + 1, len(lines) + 1):
        if len(st.warnings) >= MAX_WARNINGS:
            break
        if lines[lineno - 1].startswith(MAGIC):
            st.warn(lineno, AFTER_COMMAND_WARNING.format(command_line))


def _is_value(words: list[Word], i: int) -> bool:
    """Whether word ``i`` is the value of the option before it: quoted, or not starting with ``--``."""
    return i < len(words) and (words[i].quoted or not words[i].text.startswith(b"--"))


def _directive(lineno: int, line: bytes, st: _State) -> None:
    st.directive_lines += 1
    if st.first_directive_line is None:
        st.first_directive_line = lineno
    if st.directive_lines > MAX_DIRECTIVE_LINES:
        st.error(lineno, LINE_OPTION, "too many #ELASTIC lines", f"at most {MAX_DIRECTIVE_LINES}")
        raise _Stop
    if len(line) > MAX_LINE_BYTES:
        st.error(lineno, LINE_OPTION, f"line is too long ({len(line)} bytes)",
                 f"at most {MAX_LINE_BYTES} bytes")
        return
    rest = line[len(MAGIC):]
    if rest and rest[:1] not in (b" ", b"\t"):
        st.error(lineno, LINE_OPTION, "must be followed by a space or a tab", None)
        return
    try:
        words = split_words(rest)
    except WordError as e:
        st.error(lineno, LINE_OPTION, str(e), None)
        return
    items: list[tuple[OptionDef, Value, int]] = []
    het_group: int | None = None
    het_col: int | None = None
    het_bad = False
    i = 0
    while i < len(words):
        col, word = i, words[i].text
        quoted = words[i].quoted
        i += 1
        if quoted or not word.startswith(b"--"):
            st.error(lineno, LINE_OPTION, f"unexpected {quote(word)}: options start with --", None)
            continue
        name, eq, inline = word.partition(b"=")
        opt = BY_OPTION.get(name.decode("ascii")) if name.isascii() else None
        if opt is None:
            st.error(lineno, escape(name), "unknown option", ALL_OPTIONS_TEXT)
            # An unknown option's value would only cause a second, confusing error: skip it too.
            if not eq and _is_value(words, i):
                i += 1
            continue
        value: Value
        if opt.kind is OptionKind.FLAG:
            if eq:
                st.error(lineno, opt.option, "takes no value", None)
                continue
            value = not opt.default
        else:
            raw: bytes | None = inline if eq else None
            if not eq and _is_value(words, i):
                raw = words[i].text
                i += 1
            if raw is None or (not raw and opt.kind is not OptionKind.COMMAND):
                st.error(lineno, opt.option, "missing value", allowed_text(opt))
                if opt.option == HET_GROUP_OPTION:
                    het_bad = True
                continue
            try:
                value = parse_value(opt, raw)
            except InvalidValue as e:
                st.error(lineno, opt.option, e.message, e.allowed)
                if opt.option == HET_GROUP_OPTION:
                    het_bad = True
                continue
        if opt.option == HET_GROUP_OPTION:
            if het_col is not None:
                st.error(lineno, opt.option, f"set more than once (first on line {lineno})", None)
                het_bad = True
                continue
            assert isinstance(value, int)
            het_group, het_col = value, col
            continue
        items.append((opt, value, col))
    if het_bad:
        return  # the line's scope is unknown; its options were checked, but apply to nothing
    if het_group is not None:
        scope = st.groups.setdefault(het_group, {})
        if st.first_het_group_line is None:
            st.first_het_group_line = lineno
    else:
        scope = st.jobwide
    for opt, value, col in items:
        previous = scope.get(opt.field)
        if previous is not None:
            st.error(lineno, opt.option, f"set more than once (first on line {previous.line})", None)
        else:
            scope[opt.field] = Setting(value, lineno, col)


# --- which spec applies to which job or het component ----------------------------------------------------


@dataclass(frozen=True)
class ComponentSelection:
    """The spec for one job or het component (None: not elastic), or the errors that forbid the job."""

    spec: ElasticSpec | None
    errors: tuple[DirectiveError, ...]


NOT_HET_MESSAGE = "the job is not heterogeneous"
NEEDS_HET_GROUP_MESSAGE = "a heterogeneous job needs --het-group N on its #ELASTIC lines"


def select_component(result: ParseResult, het_job_offset: int | None) -> ComponentSelection:
    """Map a parsed script to one Slurm job record.

    ``het_job_offset`` is None for an ordinary job, else the component's offset (0 = the leader, the
    one whose record holds the script). The mapping:

    - ordinary job: the whole-job spec; ``--het-group`` lines are an error;
    - heterogeneous job: the spec of ``--het-group`` equal to the offset, or None (that component is not
      elastic); ``#ELASTIC`` lines without any ``--het-group`` are an error, since they do not say which
      component should be resized.
    """
    if result.errors:
        return ComponentSelection(None, ())
    if not result.specs:
        return ComponentSelection(None, ())
    grouped = result.first_het_group_line is not None
    if het_job_offset is None:
        if grouped:
            assert result.first_het_group_line is not None
            err = DirectiveError(result.first_het_group_line, HET_GROUP_OPTION, NOT_HET_MESSAGE, None)
            return ComponentSelection(None, (err,))
        return ComponentSelection(result.specs[0], ())
    if not grouped:
        assert result.first_directive_line is not None
        err = DirectiveError(result.first_directive_line, LINE_OPTION, NEEDS_HET_GROUP_MESSAGE, None)
        return ComponentSelection(None, (err,))
    for spec in result.specs:
        if spec.het_group == het_job_offset:
            return ComponentSelection(spec, ())
    return ComponentSelection(None, ())
