"""Value syntax of ``#ELASTIC`` options: whole numbers, percentages, durations and signals.

Everything works on bytes, exactly like plugins/job_submit.lua does, so that both produce the same values and
the same messages for the same script (the shared vectors in tests/vectors/directives.json check that).
"""

from __future__ import annotations

import re

from slurm_elastic.directives.options import (
    SIGNALS,
    UNCATCHABLE_SIGNALS,
    OptionDef,
    OptionKind,
)
from slurm_elastic.directives.words import WordError, split_words
from slurm_elastic.errors import SlurmElasticError

QUOTE_MAX_BYTES = 32
_MAX_DIGITS = 9  # keeps every number exact in Lua (doubles) and bounded everywhere
_HUGE = 10**12  # stands for "more than 9 digits": above every bound, so reported as out of range

_DIGITS = re.compile(rb"[0-9]+")
_UNITS = re.compile(rb"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_CLOCK = re.compile(rb"(?:([0-9]+)-)?([0-9]+):([0-9]{1,2})(?::([0-9]{1,2}))?")


class InvalidValue(SlurmElasticError):
    """A directive's value is malformed or out of range. ``allowed`` says what would be accepted."""

    def __init__(self, message: str, allowed: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.allowed = allowed


def escape(raw: bytes) -> str:
    """Printable ASCII as is, every other byte as ``\\xNN``; at most QUOTE_MAX_BYTES bytes, then ``...``."""
    cut = raw[:QUOTE_MAX_BYTES]
    out = []
    for b in cut:
        if b == 0x5C:
            out.append("\\\\")
        elif 0x20 <= b <= 0x7E:
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "".join(out) + ("..." if len(raw) > QUOTE_MAX_BYTES else "")


def quote(raw: bytes) -> str:
    return "'" + escape(raw) + "'"


def format_duration(seconds: int) -> str:
    """Compact human form used in messages: 0s, 10s, 10m, 1h30m, 1d."""
    if seconds == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, seconds = divmod(seconds, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)


SIGNALS_TEXT = ", ".join(SIGNALS) + " as NAME, SIGNAME or number"


def allowed_text(opt: OptionDef) -> str | None:
    """The 'allowed' part of a message for an option on its own (cross-option limits come on top)."""
    if opt.kind in (OptionKind.INT, OptionKind.PERCENT):
        return f"{opt.lo}..{opt.hi}"
    if opt.kind is OptionKind.DURATION:
        assert opt.lo is not None and opt.hi is not None
        return f"{format_duration(opt.lo)}..{format_duration(opt.hi)}"
    if opt.kind is OptionKind.SIGNAL:
        return SIGNALS_TEXT
    if opt.kind is OptionKind.MILLIS:
        return f"{opt.lo}ms..{opt.hi}ms as 50ms, 50 (milliseconds) or 2s"
    if opt.kind is OptionKind.COMMAND:
        return f"a command of {opt.lo}..{opt.hi} bytes, quoted: 'python stage.py --to /tmp'"
    return None


def _number(raw: bytes) -> int | None:
    """Decimal digits only (no sign, no spaces, no '_', ASCII only); None when not a whole number."""
    if not _DIGITS.fullmatch(raw):
        return None
    return int(raw)


def _bounded(opt: OptionDef, raw: bytes, value: int | None) -> int:
    assert opt.lo is not None and opt.hi is not None
    if value is None or not opt.lo <= value <= opt.hi:
        raise InvalidValue(f"{quote(raw)} is out of range", allowed_text(opt))
    return value


def parse_int(opt: OptionDef, raw: bytes) -> int:
    if _number(raw) is None:
        raise InvalidValue(f"{quote(raw)} is not a whole number", allowed_text(opt))
    value = int(raw) if len(raw.lstrip(b"0")) <= _MAX_DIGITS else None
    return _bounded(opt, raw, value)


def parse_percent(opt: OptionDef, raw: bytes) -> int:
    digits = raw[:-1] if raw.endswith(b"%") else raw
    if _number(digits) is None:
        raise InvalidValue(f"{quote(raw)} is not a whole percentage", allowed_text(opt))
    value = int(digits) if len(digits.lstrip(b"0")) <= _MAX_DIGITS else None
    return _bounded(opt, raw, value)


def _duration_seconds(raw: bytes) -> int | None:
    """Seconds in ``raw``, or None when it is not a duration (_HUGE when a number has over 9 digits)."""
    groups: tuple[bytes | None, ...]
    if _DIGITS.fullmatch(raw):
        groups = (None, None, None, raw)
    elif (m := _CLOCK.fullmatch(raw)) is not None:
        days, first, second, third = m.groups()
        if third is None:  # MM:SS
            if days is not None or int(second) >= 60:
                return None
            groups = (None, None, first, second)
        else:  # [D-]HH:MM:SS
            if int(second) >= 60 or int(third) >= 60 or (days is not None and int(first) >= 24):
                return None
            groups = (days, first, second, third)
    elif raw and (m := _UNITS.fullmatch(raw)) is not None:
        groups = m.groups()
    else:
        return None
    total = 0
    for part, size in zip(groups, (86400, 3600, 60, 1), strict=True):
        if part is not None:
            if len(part.lstrip(b"0")) > _MAX_DIGITS:
                return _HUGE
            total += int(part) * size
    return total


def parse_duration(opt: OptionDef, raw: bytes) -> int:
    seconds = _duration_seconds(raw)
    if seconds is None:
        assert opt.lo is not None and opt.hi is not None
        raise InvalidValue(
            f"{quote(raw)} is not a duration",
            f"{format_duration(opt.lo)}..{format_duration(opt.hi)} as 90, 90s, 10m, 1h30m, MM:SS or HH:MM:SS",
        )
    return _bounded(opt, raw, seconds)


def parse_millis(opt: OptionDef, raw: bytes) -> int:
    """A latency in whole milliseconds: ``50ms``, ``50`` or ``2s``."""
    digits, scale = raw, 1
    if raw.endswith(b"ms"):
        digits = raw[:-2]
    elif raw.endswith(b"s"):
        digits, scale = raw[:-1], 1000
    if _number(digits) is None:
        raise InvalidValue(f"{quote(raw)} is not a latency", allowed_text(opt))
    value = int(digits) * scale if len(digits.lstrip(b"0")) <= _MAX_DIGITS else None
    return _bounded(opt, raw, value)


def parse_signal(opt: OptionDef, raw: bytes) -> str:
    number = _number(raw)
    name: str | None = None
    if number is not None:
        if len(raw) <= 3:
            for table in (SIGNALS, UNCATCHABLE_SIGNALS):
                for sig, num in table.items():
                    if num == number:
                        name = sig
    elif raw.isascii():
        name = raw.decode("ascii").upper()
        if name.startswith("SIG"):
            name = name[3:]
    if name in UNCATCHABLE_SIGNALS:
        raise InvalidValue(f"SIG{name} can not be caught, so the job could not checkpoint", SIGNALS_TEXT)
    if name is None or name not in SIGNALS:
        raise InvalidValue(f"{quote(raw)} is not a supported signal", SIGNALS_TEXT)
    return name


def check_command(opt: OptionDef, raw: bytes) -> None:
    """Raises InvalidValue unless ``raw`` is a command the launcher can split into an argument list."""
    assert opt.hi is not None
    if not raw.strip(b" \t"):
        raise InvalidValue("empty command", allowed_text(opt))
    if len(raw) > opt.hi:
        raise InvalidValue(f"command is too long ({len(raw)} bytes)", allowed_text(opt))
    try:
        split_words(raw, comments=False)
    except WordError as e:
        raise InvalidValue(f"{e} in the command {quote(raw)}", allowed_text(opt)) from None


def parse_command(opt: OptionDef, raw: bytes) -> str:
    check_command(opt, raw)
    return raw.decode("utf-8", "surrogateescape")


def parse_value(opt: OptionDef, raw: bytes) -> int | str:
    """The value of ``opt`` written as ``raw``; raises InvalidValue. Not for FLAG options."""
    if opt.kind is OptionKind.INT:
        return parse_int(opt, raw)
    if opt.kind is OptionKind.PERCENT:
        return parse_percent(opt, raw)
    if opt.kind is OptionKind.DURATION:
        return parse_duration(opt, raw)
    if opt.kind is OptionKind.SIGNAL:
        return parse_signal(opt, raw)
    if opt.kind is OptionKind.MILLIS:
        return parse_millis(opt, raw)
    if opt.kind is OptionKind.COMMAND:
        return parse_command(opt, raw)
    raise AssertionError(f"{opt.option} takes no value")
