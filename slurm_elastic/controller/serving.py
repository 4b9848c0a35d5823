"""Reading what serving units publish (slurm_elastic/serving.py, docs/serving.md) into the policy input.

For each serving unit (``#ELASTIC --serving``) the controller reads
``<WorkDir>/.slurm-elastic/serving-<unit id>.jsonl`` with the goodput reader's file rules
(:func:`slurm_elastic.controller.goodput.read_file`: no symlinks, a regular file owned by the job's user,
appended bytes only, at most the last 64 KiB at a time). A line that is not a JSON object with a finite
``time`` and a finite ``requests_per_s`` >= 0 (optional finite ``p50_ms``/``p99_ms`` >= 0, integer
``queue_depth``/``replicas`` >= 0) is skipped and counted, and so is a time in the future.

Besides the points of the unit's long window it hands the policy:

* **Demand history and forecast.** Every completed 15-minute slot is stored once per service (``user/job
  name``, so a resubmitted service keeps its history: store table ``serving_demand``) with its peak requests/s,
  worst p99 and replicas. The seasonal profile (:class:`~slurm_elastic.policy.forecast.SeasonalProfile`) is
  refitted from the last five weeks of it once per slot, and the forecast is its peak one cold start ahead.
* **Cold start.** After an extension job of the unit started, the first point that reports more replicas
  than the last point before it gives the time a replica took to serve; the median of those observed wins
  over ``serving_cold_start_s``.
* **Replica capacity.** The most requests/s per replica a stored slot carried with its p99 within the SLO
  (a lower bound, so the forecast errs towards more replicas); ``--target-rps-per-replica`` wins in the policy.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from slurm_elastic.controller.goodput import FUTURE_SLACK_S, FileState, Refused, read_job_file
from slurm_elastic.policy import ElasticUnit, ServingLoad, ServingPoint
from slurm_elastic.policy.config import UnitSettings
from slurm_elastic.policy.forecast import DemandPoint, SeasonalProfile, peak_ahead
from slurm_elastic.serving import serving_path
from slurm_elastic.store.errors import StoreError
from slurm_elastic.store.protocols import DemandStore
from slurm_elastic.store.records import DemandRecord

log = logging.getLogger(__name__)

SLOT_S = 900
HISTORY = timedelta(weeks=5)
MAX_COLD_STARTS = 20


def _finite(v: object, *, minimum: float = 0.0) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) and f >= minimum else None


def _count(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def parse_point(raw: bytes) -> ServingPoint | None:
    """One published line, or None when it is not a valid one."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    at = _finite(obj.get("time"), minimum=-math.inf)
    rps = _finite(obj.get("requests_per_s"))
    if at is None or rps is None:
        return None
    opt: dict[str, float | int | None] = {}
    for key in ("p50_ms", "p99_ms"):
        if key in obj:
            opt[key] = _finite(obj[key])
            if opt[key] is None:
                return None
    for key in ("queue_depth", "replicas"):
        if key in obj:
            opt[key] = _count(obj[key])
            if opt[key] is None:
                return None
    try:
        when = datetime.fromtimestamp(at, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return ServingPoint(when, rps, p50_ms=_opt_float(opt.get("p50_ms")), p99_ms=_opt_float(opt.get("p99_ms")),
                        queue_depth=_opt_int(opt.get("queue_depth")), replicas=_opt_int(opt.get("replicas")))


def _opt_float(v: float | int | None) -> float | None:
    return None if v is None else float(v)


def _opt_int(v: float | int | None) -> int | None:
    return None if v is None else int(v)


def parse_points(data: bytes, *, now: float) -> tuple[list[ServingPoint], int]:
    """The points in ``data`` (complete lines), and how many non-empty lines were skipped."""
    points: list[ServingPoint] = []
    bad = 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        p = parse_point(raw)
        if p is None or p.at.timestamp() > now + FUTURE_SLACK_S:
            bad += 1
        else:
            points.append(p)
    return points, bad


def slot_of(at: datetime) -> datetime:
    return datetime.fromtimestamp(at.timestamp() // SLOT_S * SLOT_S, tz=UTC)


def service_of(unit: ElasticUnit) -> str:
    return f"{unit.job.user}/{unit.job.name}"[:255]


def capacity_from(history: list[DemandRecord], slo_ms: int | None) -> float | None:
    """The most requests/s per replica a slot carried within the SLO (None: no such slot)."""
    best: float | None = None
    for r in history:
        if not r.replicas or r.requests_per_s <= 0:
            continue
        if slo_ms is not None and (r.p99_ms is None or r.p99_ms > slo_ms):
            continue
        per = r.requests_per_s / r.replicas
        best = per if best is None or per > best else best
    return best


@dataclass
class ServingReader:
    """Per-controller state: the files read so far, the slots stored, fitted profiles and cold starts."""

    demand: DemandStore | None
    files: dict[str, FileState] = field(default_factory=dict)
    stored_slot: dict[str, datetime] = field(default_factory=dict)  # service -> newest slot stored
    profiles: dict[str, tuple[datetime, SeasonalProfile, float | None]] = field(default_factory=dict)
    cold: dict[int, dict[int, float]] = field(default_factory=dict)  # unit -> extension job -> cold start
    _logged: set[tuple[str, str]] = field(default_factory=set)

    def path_for(self, unit: ElasticUnit) -> str | None:
        work_dir = unit.job.working_dir
        if not work_dir or not os.path.isabs(work_dir):
            return None
        return serving_path(work_dir, unit.unit_id)

    def read_unit(self, unit: ElasticUnit, settings: UnitSettings, now: datetime, since: datetime
                  ) -> ServingLoad | None:
        path = self.path_for(unit)
        if path is None:
            return None
        prev = self.files.get(path)
        try:
            state = read_job_file(unit, path, prev, now=now.timestamp(), parse=parse_points)
        except Refused as e:
            self._refused(unit, path, str(e))
            return None
        if state is None:
            self.files.pop(path, None)
            return None
        self.files[path] = state
        points: list[ServingPoint] = sorted(state.reports, key=lambda p: p.at)
        self._store_slots(unit, points, now)
        cold = self._cold_start(unit, points)
        lead = cold if cold is not None else float(settings.serving_cold_start_s)
        forecast, capacity = self._forecast(unit, now, lead)
        return ServingLoad(unit.unit_id, tuple(p for p in points if p.at >= since), forecast_rps=forecast,
                           forecast_lead_s=lead if forecast is not None else None, cold_start_s=cold,
                           rps_per_replica=capacity)

    def _refused(self, unit: ElasticUnit, path: str, why: str) -> None:
        if (path, why) not in self._logged:
            self._logged.add((path, why))
            log.warning("job %s: not reading its serving file %s: %s", unit.job.display_id, path, why)
        self.files.pop(path, None)

    def _store_slots(self, unit: ElasticUnit, points: list[ServingPoint], now: datetime) -> None:
        """Store each completed slot of the points once (the newest complete slot and any before it)."""
        if self.demand is None or not points:
            return
        service = service_of(unit)
        done = self.stored_slot.get(service)
        current = slot_of(now)
        by_slot: dict[datetime, list[ServingPoint]] = {}
        for p in points:
            s = slot_of(p.at)
            if s < current and (done is None or s > done):
                by_slot.setdefault(s, []).append(p)
        for slot in sorted(by_slot):
            pts = by_slot[slot]
            p99s = [p.p99_ms for p in pts if p.p99_ms is not None]
            reps = [p.replicas for p in pts if p.replicas is not None]
            rec = DemandRecord(service, unit.unit_id, slot, max(p.requests_per_s for p in pts),
                               p99_ms=max(p99s) if p99s else None, replicas=min(reps) if reps else None)
            try:
                self.demand.add_demand(rec)
            except StoreError as e:
                log.error("job %s: could not store its demand for %s: %s", unit.job.display_id, slot, e)
                return
            self.stored_slot[service] = slot

    def _forecast(self, unit: ElasticUnit, now: datetime, lead_s: float) -> tuple[float | None, float | None]:
        if self.demand is None:
            return None, None
        service = service_of(unit)
        slot = slot_of(now)
        cached = self.profiles.get(service)
        if cached is None or cached[0] != slot:
            try:
                history = self.demand.demand(service, since=now - HISTORY)
            except StoreError as e:
                log.error("job %s: could not read its demand history: %s", unit.job.display_id, e)
                return None, None
            profile = SeasonalProfile.fit((DemandPoint(r.slot, r.requests_per_s) for r in history), bucket_s=SLOT_S)
            cached = self.profiles[service] = (slot, profile, capacity_from(history, unit.spec.slo_p99_ms))
        _, profile, capacity = cached
        return peak_ahead(profile, now, lead_s), capacity

    def _cold_start(self, unit: ElasticUnit, points: list[ServingPoint]) -> float | None:
        seen = self.cold.setdefault(unit.unit_id, {})
        for ext in unit.running_extensions:
            if ext.job_id in seen or ext.start_time is None:
                continue
            before = [p.replicas for p in points if p.at < ext.start_time and p.replicas is not None]
            if not before:
                continue
            after = next((p for p in points if p.at >= ext.start_time and p.replicas is not None
                          and p.replicas > before[-1]), None)
            if after is not None:
                seen[ext.job_id] = (after.at - ext.start_time).total_seconds()
                while len(seen) > MAX_COLD_STARTS:
                    seen.pop(next(iter(seen)))
        return statistics.median(seen.values()) if seen else None

    def forget(self, units: list[ElasticUnit]) -> None:
        """Drop the state of units that are gone (their files, cold starts)."""
        live = {u.unit_id for u in units}
        paths = {self.path_for(u) for u in units}
        for unit_id in [u for u in self.cold if u not in live]:
            self.cold.pop(unit_id, None)
        for path in [p for p in self.files if p not in paths]:
            self.files.pop(path, None)
