"""Serving units (``#ELASTIC --serving``): replicas from published latency and load, and the demand forecast.

Pure. A serving unit's size follows its objective, not GPU utilization:

* **Out, fast** (SLO_AT_RISK): over the short window (``serving_up_window_s``) the worst p99 is above
  ``serving_risk_percent`` of ``--slo-p99``, or the peak requests/s per replica above that percent of the
  replica capacity (``--target-rps-per-replica``, else what the caller measured one replica to carry within
  the SLO). It grows to the replicas the peak load needs at that percent, at least ``step``. No cooldown: only
  replicas added less than a cold start ago make it wait (REPLICA_WARMING), since they are not serving yet.
* **Ahead of a peak** (SLO_PEAK_AHEAD): the caller's forecast for one cold start ahead needs more replicas.
* **In, slowly** (SLO_HEADROOM): the long window (``serving_down_window_s``) is covered, its worst p99 stayed
  below ``serving_headroom_percent`` of the SLO and its peak load below that percent of what one replica fewer
  carries, the forecast does not need the replica, and the last resize is ``serving_down_cooldown_s`` old.

The walk (policy/walk.py) then puts serving grows before pending jobs and training grows, and reclaims
training units' nodes above their min for them when no node is free (SERVING_RECLAIM).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from slurm_elastic.policy.config import UnitSettings
from slurm_elastic.policy.model import ElasticUnit, Scalar, ServingLoad, ServingPoint
from slurm_elastic.policy.reasons import Action, Reason
from slurm_elastic.policy.wording import ago


@dataclass(frozen=True)
class ServingCall:
    """What the serving rules want for one unit: a hold, or a grow or shrink by ``want`` replicas."""

    action: Action
    reason: Reason
    message: str
    want: int = 0
    inputs: dict[str, Scalar] = field(default_factory=dict)


def replica_capacity(unit: ElasticUnit, load: ServingLoad | None) -> tuple[float | None, str]:
    """Requests/s one replica should carry, and where that came from."""
    target = unit.spec.target_rps_per_replica
    if target is not None:
        return float(target), "directive"
    if load is not None and load.rps_per_replica is not None and load.rps_per_replica > 0:
        return load.rps_per_replica, "measured"
    return None, "unknown"


def replicas_for(rps: float, capacity: float, percent: int) -> int:
    """Replicas that carry ``rps`` with each at most ``percent`` of ``capacity``."""
    return max(1, math.ceil(rps / (capacity * percent / 100.0) - 1e-9))


def _window(points: Sequence[ServingPoint], since: datetime) -> list[ServingPoint]:
    return [p for p in points if p.at >= since]


def _worst_p99(points: Sequence[ServingPoint]) -> float | None:
    values = [p.p99_ms for p in points if p.p99_ms is not None]
    return max(values) if values else None


def serving_call(
    unit: ElasticUnit,
    load: ServingLoad | None,
    s: UnitSettings,
    now: datetime,
    *,
    current: int,
    last_resize: datetime | None,
    last_grow: datetime | None,
) -> ServingCall:
    """The serving rules for ``unit`` at ``now`` (see the module docstring)."""
    spec = unit.spec
    slo = spec.slo_p99_ms
    capacity, cap_source = replica_capacity(unit, load)
    inputs: dict[str, Scalar] = {
        "slo_p99_ms": slo,
        "rps_per_replica": None if capacity is None else round(capacity, 3),
        "rps_per_replica.source": cap_source,
        "serving_risk_percent": s.serving_risk_percent,
        "serving_headroom_percent": s.serving_headroom_percent,
    }
    points = load.points if load is not None else ()
    if not points:
        return ServingCall(Action.HOLD, Reason.NO_METRICS, "no serving load published", 0, inputs)
    newest = points[-1]
    age = (now - newest.at).total_seconds()
    inputs["metric_age_s"] = round(age, 1)
    if age > s.max_metric_age_s:
        return ServingCall(Action.HOLD, Reason.STALE_METRICS,
                           f"last serving point is {ago(age, s.max_metric_age_s)} old > max_metric_age_s "
                           f"{s.max_metric_age_s}s", 0, inputs)
    short = _window(points, now - timedelta(seconds=s.serving_up_window_s))
    p99 = _worst_p99(short)
    rps = max(p.requests_per_s for p in short) if short else 0.0
    inputs.update({
        "p99_ms": None if p99 is None else round(p99, 2),
        "requests_per_s": round(rps, 3),
        "queue_depth": newest.queue_depth,
        "replicas_reported": newest.replicas,
    })
    cold = load.cold_start_s if load is not None and load.cold_start_s is not None else float(s.serving_cold_start_s)
    inputs["cold_start_s"] = round(cold, 1)
    risk = s.serving_risk_percent

    at_risk: list[str] = []
    need = current
    if slo is not None and p99 is not None and p99 > slo * risk / 100.0:
        at_risk.append(f"p99 {p99:.1f}ms > {risk}% of SLO {slo}ms")
        need = max(need, math.ceil(current * p99 / (slo * risk / 100.0)))
    if capacity is not None and rps > capacity * current * risk / 100.0:
        at_risk.append(f"{rps:.1f} req/s > {risk}% of {current} x {capacity:.1f} req/s per replica")
        need = max(need, replicas_for(rps, capacity, risk))
    if at_risk:
        want = max(s.step, need - current)
        msg = f"{' and '.join(at_risk)} over the last {s.serving_up_window_s}s"
        if last_grow is not None:
            since = (now - last_grow).total_seconds()
            if since < cold:
                inputs["since_grow_s"] = round(since, 1)
                return ServingCall(Action.HOLD, Reason.REPLICA_WARMING,
                                   f"{msg}, but replicas added {ago(since, cold)} ago are still starting "
                                   f"(cold start {cold:.0f}s)", 0, inputs)
        return ServingCall(Action.GROW, Reason.SLO_AT_RISK, msg, want, inputs)

    forecast_need: int | None = None
    if load is not None and load.forecast_rps is not None and capacity is not None:
        forecast_need = replicas_for(load.forecast_rps, capacity, risk)
        inputs["forecast_rps"] = round(load.forecast_rps, 3)
        inputs["forecast_lead_s"] = None if load.forecast_lead_s is None else round(load.forecast_lead_s, 1)
        inputs["forecast_replicas"] = forecast_need
        if forecast_need > current:
            return ServingCall(Action.GROW, Reason.SLO_PEAK_AHEAD,
                               f"forecast {load.forecast_rps:.1f} req/s in {load.forecast_lead_s or cold:.0f}s "
                               f"needs {forecast_need} replicas at {risk}% of {capacity:.1f} req/s, {current} run",
                               forecast_need - current, inputs)

    met = f"p99 {p99:.1f}ms" if p99 is not None else "no latency"
    met += f", {rps:.1f} req/s on {current} replica(s)"
    if current <= unit.min_nodes:
        return ServingCall(Action.HOLD, Reason.SLO_MET, f"{met}: objective met, at min {unit.min_nodes}", 0, inputs)
    if last_resize is not None:
        since = (now - last_resize).total_seconds()
        if since < s.serving_down_cooldown_s:
            return ServingCall(Action.HOLD, Reason.SLO_MET,
                               f"{met}: objective met; last resize {ago(since, s.serving_down_cooldown_s)} ago < "
                               f"serving_down_cooldown_s "
                               f"{s.serving_down_cooldown_s}s", 0, inputs)
    long_start = now - timedelta(seconds=s.serving_down_window_s)
    long = _window(points, long_start)
    covered = (long[-1].at - long[0].at).total_seconds() if long else 0.0
    head = s.serving_headroom_percent
    if covered < s.serving_down_window_s * 0.9:
        return ServingCall(Action.HOLD, Reason.SLO_MET,
                           f"{met}: objective met; {covered:.0f}s of the {s.serving_down_window_s}s scale-in "
                           f"window covered", 0, inputs)
    worst = _worst_p99(long)
    peak = max(p.requests_per_s for p in long)
    fewer = current - min(s.step, current - unit.min_nodes)
    lat_ok = slo is None or (worst is not None and worst < slo * head / 100.0)
    load_ok = capacity is None or peak < capacity * fewer * head / 100.0
    forecast_ok = forecast_need is None or forecast_need <= fewer
    inputs["window_p99_ms"] = None if worst is None else round(worst, 2)
    inputs["window_peak_rps"] = round(peak, 3)
    if lat_ok and load_ok and forecast_ok and (slo is not None or capacity is not None):
        parts = []
        if slo is not None and worst is not None:
            parts.append(f"p99 <= {worst:.1f}ms < {head}% of SLO {slo}ms")
        if capacity is not None:
            parts.append(f"peak {peak:.1f} req/s < {head}% of {fewer} x {capacity:.1f} req/s")
        return ServingCall(Action.SHRINK, Reason.SLO_HEADROOM,
                           f"{' and '.join(parts)} over the last {s.serving_down_window_s}s", current - fewer,
                           inputs)
    why = "latency" if not lat_ok else "load" if not load_ok else "forecast"
    return ServingCall(Action.HOLD, Reason.SLO_MET,
                       f"{met}: objective met, not enough {why} headroom over {s.serving_down_window_s}s to give "
                       f"a replica back", 0, inputs)
