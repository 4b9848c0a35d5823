"""Numbers in decision messages as they decided: never rounded onto the threshold they were compared with, never a
negative age.

A message says the comparison that decided (``mean util 39.6% < 40%``); printed with no decimals, 39.6 reads
``40% < 40%``. :func:`vs` prints a value with as few decimals as tell it apart from its threshold (none, one, two,
at most three; or from a given minimum: an efficiency ``0.698 < 0.70``, not ``0.70 < 0.70``). :func:`ago` prints
an age in seconds that is never below 0 (a journal time a moment after the cycle's ``now`` reads ``0s``, not
``-0s``) and, when a threshold is given, is told apart from it the same way.
"""

from __future__ import annotations

MAX_DIGITS = 3


def _fixed(value: float, digits: int) -> str:
    text = f"{value:.{digits}f}"
    return "0" + text[2:] if text.startswith("-0") and float(text) == 0 else text  # "-0.0" -> "0.0"


def vs(value: float, threshold: float | None = None, digits: int = 0) -> str:
    """``value`` with the fewest decimals (``digits`` up to 3, or ``digits``) at which it does not print as
    ``threshold``; no unit."""
    if threshold is None or value == threshold:
        return _fixed(value, digits)
    for d in range(digits, max(digits, MAX_DIGITS) + 1):
        text = _fixed(value, d)
        if float(text) != round(float(threshold), d):
            return text
    return _fixed(value, max(digits, MAX_DIGITS))


def pct(value: float, threshold: float | None = None) -> str:
    """A percentage (0..100) told apart from ``threshold`` (a percentage too): ``39.6%`` against 40."""
    return f"{vs(value, threshold)}%"


def ago(seconds: float, threshold: float | None = None) -> str:
    """An age in seconds, ``12s``, never negative, told apart from ``threshold`` (seconds)."""
    return f"{vs(max(0.0, seconds), threshold)}s"
