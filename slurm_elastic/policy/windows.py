"""Time windows of config profiles: ``"Mon-Fri 08:00-20:00"``, ``"Sat,Sun 00:00-24:00"``, ``"22:00-06:00"``.

Grammar: ``[DAYS ]HH:MM-HH:MM`` where DAYS is ``*``, a day (``Mon``), a range (``Mon-Fri``, wrapping allowed:
``Fri-Mon``) or a comma list of those; no DAYS means every day. The end may be ``24:00``. A window whose end
is not after its start runs overnight and belongs to the day it starts on (``Fri 22:00-06:00`` covers Friday
night until Saturday 06:00). Windows are checked against ``now`` as given: the caller passes it in the
site's time zone when windows are meant in local time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from slurm_elastic.errors import ConfigError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WINDOW = re.compile(r"(?:(?P<days>[A-Za-z*,\-]+)\s+)?(?P<start>\d{1,2}:\d{2})-(?P<end>\d{1,2}:\d{2})")


class WindowError(ConfigError):
    """A time window that does not follow the grammar."""


@dataclass(frozen=True)
class Window:
    days: frozenset[int]  # 0 = Monday
    start_min: int
    end_min: int  # 1..1440; <= start_min: overnight
    text: str

    def contains(self, now: datetime) -> bool:
        minute = now.hour * 60 + now.minute
        if self.start_min < self.end_min:
            return now.weekday() in self.days and self.start_min <= minute < self.end_min
        if now.weekday() in self.days and minute >= self.start_min:
            return True
        yesterday = (now - timedelta(days=1)).weekday()
        return yesterday in self.days and minute < self.end_min


def _minutes(text: str, whole: str, *, end: bool) -> int:
    hours, mins = (int(p) for p in text.split(":"))
    if mins >= 60 or hours > 24 or (hours == 24 and (mins or not end)):
        raise WindowError(f"bad time {text!r} in window {whole!r} (HH:MM, 00:00..24:00)")
    return hours * 60 + mins


def _days(text: str, whole: str) -> frozenset[int]:
    if text == "*":
        return frozenset(range(7))
    out: set[int] = set()
    for part in text.lower().split(","):
        ends = part.split("-")
        if len(ends) > 2 or any(e not in DAYS for e in ends):
            raise WindowError(f"bad days {part!r} in window {whole!r} (use Mon..Sun, ranges like Mon-Fri, or *)")
        first, last = DAYS.index(ends[0]), DAYS.index(ends[-1])
        day = first
        out.add(day)
        while day != last:
            day = (day + 1) % 7
            out.add(day)
    return frozenset(out)


def parse_window(text: str) -> Window:
    """Parse one window; raises WindowError (a ConfigError) with the accepted forms."""
    m = _WINDOW.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise WindowError(f"bad window {text!r} (expected '[DAYS ]HH:MM-HH:MM', e.g. 'Mon-Fri 08:00-20:00')")
    days = _days(m.group("days"), text) if m.group("days") else frozenset(range(7))
    start = _minutes(m.group("start"), text, end=False)
    end = _minutes(m.group("end"), text, end=True)
    if start == end:
        raise WindowError(f"window {text!r} is empty (start equals end)")
    return Window(days, start, end, text.strip())
