"""A serving unit's seasonal demand profile, learned from its recorded demand history. Pure.

The profile is a plain seasonal average: the demand history (requests/s, one value per ``bucket_s`` slot) is
grouped by slot of the week (day of week x time of day) and, where a slot of the week has fewer than
``min_weeks`` observations, by slot of the day across all days. The prediction for a time is a high quantile
(``quantile``, 0.9 by default) of its group, so that reserving by it covers most days' demand, not the average
day's. bench/serving_sim.py measures it against the same profile without the day of week and against the last
value (persistence); docs/serving.md has the numbers.

:func:`peak_ahead` is what the controller hands the policy: the highest predicted demand between now and one
replica cold start ahead, so that the serving unit scales out *before* a busier slot starts, by the time a
replica needs to start (SLO_PEAK_AHEAD).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

WEEK_S = 7 * 86400
DAY_S = 86400


@dataclass(frozen=True)
class DemandPoint:
    """Demand of one slot: the requests/s a serving unit carried (peak over the slot), at the slot's start."""

    at: datetime
    requests_per_s: float


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class SeasonalProfile:
    """Demand quantiles by slot of the week and by slot of the day (see the module docstring)."""

    bucket_s: int
    weekly: Mapping[int, float] = field(default_factory=dict)
    daily: Mapping[int, float] = field(default_factory=dict)
    observations: int = 0

    @classmethod
    def fit(cls, history: Iterable[DemandPoint], *, bucket_s: int = 900, min_weeks: int = 2,
            quantile: float = 0.9, use_week: bool = True) -> SeasonalProfile:
        if bucket_s <= 0 or DAY_S % bucket_s:
            raise ValueError(f"bucket_s must divide a day, not {bucket_s}")
        if not 0.0 <= quantile <= 1.0:
            raise ValueError(f"quantile must be within 0..1, not {quantile}")
        by_week: dict[int, list[float]] = {}
        by_day: dict[int, list[float]] = {}
        n = 0
        for p in history:
            if not math.isfinite(p.requests_per_s) or p.requests_per_s < 0:
                continue
            n += 1
            w, d = _slots(p.at, bucket_s)
            by_week.setdefault(w, []).append(p.requests_per_s)
            by_day.setdefault(d, []).append(p.requests_per_s)
        weekly = {w: _quantile(v, quantile) for w, v in by_week.items() if len(v) >= min_weeks} if use_week else {}
        daily = {d: _quantile(v, quantile) for d, v in by_day.items()}
        return cls(bucket_s, weekly, daily, n)

    def predict(self, at: datetime) -> float | None:
        """Predicted demand (req/s) in the slot of ``at``; None when the history has nothing for that time."""
        w, d = _slots(at, self.bucket_s)
        found = self.weekly.get(w)
        return found if found is not None else self.daily.get(d)


def _slots(at: datetime, bucket_s: int) -> tuple[int, int]:
    """(slot of the week, slot of the day) of ``at``, in its own time zone (UTC for aware UTC times)."""
    day_s = at.hour * 3600 + at.minute * 60 + at.second
    d = day_s // bucket_s
    return at.weekday() * (DAY_S // bucket_s) + d, d


def peak_ahead(profile: SeasonalProfile, now: datetime, lead_s: float) -> float | None:
    """The highest predicted demand of the slots from ``now`` to ``now + lead_s``; None without a prediction."""
    end = now + timedelta(seconds=max(0.0, lead_s))
    times = [now]
    t = now + timedelta(seconds=profile.bucket_s)
    while t < end:
        times.append(t)
        t += timedelta(seconds=profile.bucket_s)
    times.append(end)
    found = [v for v in (profile.predict(x) for x in times) if v is not None]
    return max(found) if found else None
