"""Holds stored by change: a unit's hold is written when what matters about it changed, and then again every
``hold_heartbeat_s`` (controller config) while it stays the same. Grows, shrinks and Slurm-side losses are
always written.

Writing every hold of every unit each cycle is ~5.8 M rows a day at 2,000 units and a 30 s cycle, nearly all
repeating the row before. What matters about a hold (its :class:`HoldKey`):

* the reason code, the basis, the unit's current and target size, ``paused``, ``signal``, ``profile`` and
  ``dry_run``;
* every input the policy recorded, except those that move each cycle by themselves (:data:`VOLATILE_INPUTS`:
  ages, countdowns, sample counts, measured throughput, GPU-seconds attained). An input not listed there counts
  as it is, so an input added to the policy later is stored on change by default;
* the measured levels (:data:`BANDED_INPUTS`: mean and max utilization, marginal efficiencies) count when they
  moved by a band (:data:`UTIL_BAND_PCT` points of utilization, :data:`EFFICIENCY_BAND` of efficiency) from the
  value in the unit's last stored row, or appeared or vanished: a window mean that jitters around a value never
  writes, one that climbs from 50% to 75% writes about twice.

The message is not compared (it carries the same ages and counts) but is stored with each row written. A row
written because nothing changed for ``hold_heartbeat_s`` (a *heartbeat*) carries ``unchanged_since`` in its
inputs: the time of the first row of that unchanged run, so ``explain`` tells how long the job has been held.

What was last written per unit lives in memory. It is seeded from the store (the last decision of each unit)
whenever this controller starts holding a lease epoch, so neither a restart nor an HA handover rewrites every
hold, and a controller taking over never trusts what it remembered from before another one held the lease.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from slurm_elastic.store.errors import StoreError
from slurm_elastic.store.protocols import ControllerStore
from slurm_elastic.store.records import UNCHANGED_SINCE, DecisionRecord, FencingToken, NewDecision

log = logging.getLogger(__name__)

HOLD = "hold"
#: Inputs that change every cycle on their own; left out of the comparison (still stored on written rows).
VOLATILE_INPUTS = frozenset({
    "running_s", "since_resize_s", "metric_age_s", "window_covered_s", "samples", "remaining_s",
    "expected_gain_s", "throughput", "attained_gpu_s", "unchanged_since", "shrunk_s", "life_s", "grow_gain_s",
    # a serving unit's published numbers move every report; its hold reason and size say when it matters
    "p99_ms", "requests_per_s", "queue_depth", "window_p99_ms", "window_peak_rps", "forecast_rps",
    "since_grow_s", "replicas_reported", "rps_per_replica", "cold_start_s",
    # adaptive batch size: the job's statistics and the model's goodput move with every report
    "noise_scale", "goodput_now", "goodput_next",
    "last_node_loss_s",  # victim_by_goodput / goodput_moves: shrinks with the time left every cycle
})
UTIL_BAND_PCT = 10.0
EFFICIENCY_BAND = 0.1
#: Inputs compared by distance: a change when the value moved by at least this much from the stored one.
BANDED_INPUTS: Mapping[str, float] = {
    "mean_util": UTIL_BAND_PCT, "max_util": UTIL_BAND_PCT,
    "marginal_efficiency_last": EFFICIENCY_BAND, "marginal_efficiency_next": EFFICIENCY_BAND,
    "shrunk_share": EFFICIENCY_BAND,  # tail_protection: the share of its life a unit ran shrunk
    "speedup_efficiency": EFFICIENCY_BAND,  # speedup_growth: the next step's modelled marginal efficiency
    "next_speedup": EFFICIENCY_BAND,
    "last_node_slowdown": EFFICIENCY_BAND,  # victim_by_goodput / goodput_moves: what the last node is worth
    "batch_efficiency_now": EFFICIENCY_BAND, "batch_efficiency_next": EFFICIENCY_BAND,  # adaptive batch size
}
_NOT_SEEDED = object()


def _level(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class HoldKey:
    """What matters about a hold: ``fingerprint``, everything compared for equality (the measured levels only as
    present or not), and ``levels``, the measured levels compared by distance."""

    fingerprint: str
    levels: Mapping[str, float]

    @classmethod
    def of(cls, d: NewDecision | DecisionRecord) -> HoldKey:
        levels = {k: v for k in BANDED_INPUTS if (v := _level(d.inputs.get(k))) is not None}
        inputs = {k: ("<level>" if k in levels else v) for k, v in d.inputs.items() if k not in VOLATILE_INPUTS}
        fingerprint = json.dumps([d.action, d.reason, d.current_nodes, d.target_nodes, d.paused, d.signal,
                                  d.profile, d.dry_run, inputs], sort_keys=True, default=str)
        return cls(fingerprint, levels)

    def differs(self, stored: HoldKey) -> bool:
        """Worth a new row after ``stored``: something compared for equality changed, or a level moved a band."""
        return self.fingerprint != stored.fingerprint or any(
            abs(v - stored.levels[k]) >= BANDED_INPUTS[k] for k, v in self.levels.items())


@dataclass(frozen=True)
class _Written:
    key: HoldKey  # of the unit's last stored row
    at: datetime  # when the last row of the run was written (its heartbeat clock)
    since: datetime  # when the first row of the run was written


@dataclass(frozen=True)
class Recorded:
    """One cycle's decisions after :meth:`HoldFilter.record`: per decision, its row id where something refers to
    it (a grow or shrink: the journal; None for a hold), and how many rows were written (holds that changed or
    were due a heartbeat included)."""

    ids: list[int | None]
    written: int

    @property
    def skipped(self) -> int:
        return len(self.ids) - self.written


class HoldFilter:
    """Decides which of a cycle's holds are written, writes the cycle's rows, and remembers what was written."""

    def __init__(self, heartbeat_s: float) -> None:
        if not heartbeat_s >= 0:
            raise ValueError(f"heartbeat_s must be >= 0, got {heartbeat_s}")
        self.heartbeat_s = heartbeat_s
        self._last: dict[int, _Written] = {}
        self._epoch: object = _NOT_SEEDED  # the lease epoch (holder, epoch) the memory belongs to

    def forget(self, unit_id: int) -> None:
        """Something else was written for the unit (a loss): its next hold is written."""
        self._last.pop(unit_id, None)

    def record(self, store: ControllerStore, cycle_id: int, decisions: Sequence[NewDecision], now: datetime, *,
               fencing: FencingToken | None = None) -> Recorded:
        """Write the cycle's non-hold decisions and the holds that changed or are due a heartbeat, in one
        transaction (as ``record_decisions``); the memory changes only once the write succeeded."""
        epoch = None if fencing is None else (fencing.holder, fencing.epoch)
        if epoch != self._epoch:
            self._seed(store, [d.job_id for d in decisions if d.action == HOLD])
            self._epoch = epoch
        actions: list[NewDecision] = []
        slots: list[int] = []
        holds: list[NewDecision] = []
        nxt: dict[int, _Written] = {}
        for i, d in enumerate(decisions):
            if d.action != HOLD:
                actions.append(d)
                slots.append(i)
                continue
            key = HoldKey.of(d)
            prev = self._last.get(d.job_id)
            if prev is None or key.differs(prev.key):
                holds.append(d)
                nxt[d.job_id] = _Written(key, now, now)
            elif (now - prev.at).total_seconds() >= self.heartbeat_s:
                holds.append(replace(d, inputs={**d.inputs, UNCHANGED_SINCE: prev.since.isoformat()}))
                nxt[d.job_id] = _Written(key, now, prev.since)
            else:
                nxt[d.job_id] = prev
        # Nothing refers to a hold's row by id: holds go in without asking for their ids (record_rows says why).
        written = store.decisions.record_rows(cycle_id, actions, holds, fencing=fencing)
        self._last = nxt  # units that ended, and units that grew or shrank, start afresh
        ids: list[int | None] = [None] * len(decisions)
        for slot, row_id in zip(slots, written, strict=True):
            ids[slot] = row_id
        return Recorded(ids, len(actions) + len(holds))

    def _seed(self, store: ControllerStore, unit_ids: Iterable[int]) -> None:
        """Start from the store: each unit's last decision, if it is a hold (any other: its next hold is new)."""
        self._last = {}
        ids = list(unit_ids)
        if not ids:
            return
        try:
            last = store.decisions.last_decisions_per_job(1, ids)
        except StoreError as e:
            log.warning("cannot read the last holds, this cycle writes every hold: %s", e)
            return
        for unit_id, (d, *_) in last.items():
            if d.action == HOLD:
                since = _parse_time(d.inputs.get(UNCHANGED_SINCE)) or d.time
                self._last[unit_id] = _Written(HoldKey.of(d), d.time, since)


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo is not None else None
