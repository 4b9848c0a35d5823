"""The policy's input, built in one place from plain facts: the controller and the simulator both call this.

The callers do the I/O (the controller: agents, the store, goodput files; the simulator: its model) and hand
over what they found; :class:`PolicyInputBuilder` turns it into a :class:`~slurm_elastic.policy.PolicyInput`.
The rules that used to live twice are here once:

* **Window.** A unit's utilization is the mean and max of its samples taken at or after
  :func:`window_start`, ``window_s + 2 x interval_s`` before now, where ``window_s`` is the unit's
  :func:`~slurm_elastic.policy.resolve_unit` value under the profile in force at ``now``. Two cycles of slack
  because each stored sample carries the *oldest* agent sample time of the unit's nodes, which lags the cycle by
  up to one interval: with one cycle of slack a window could read as not filled by a phase accident. The
  simulator (samples exactly at cycle times) uses the same rule, so that it predicts what the controller does.
* **Goodput.** A unit's throughput samples and observed restart time are attached only when its settings use
  them (``goodput``, ``restart_cost_aware`` or ``speedup_growth``), and only to a unit that has utilization.
* **Serving.** A serving unit's (``--serving``) published points are read from :attr:`UnitReads.serving_since`
  on (its long window plus the same slack), and the caller's load for units that are not serving is dropped.
* **Canonical order.** Units are sorted by id, history, actions in progress and extension ends by time, so the
  same facts give an equal input whatever order the caller found them in.

Back-off and blocking are policy rules (policy/holds.py); the builder only carries their facts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol

from slurm_elastic.batchsize import AdaptiveState
from slurm_elastic.policy.config import PolicyConfig, SettingsResolver, UnitSettings
from slurm_elastic.policy.model import (
    ActionInProgress,
    ElasticUnit,
    ExtensionEnd,
    JobUtilization,
    PolicyInput,
    PowerState,
    ResizeRecord,
    ServingLoad,
    ThroughputSample,
)
from slurm_elastic.slurm.model import ClusterSnapshot

#: Cycles of samples read before a unit's window (see the module docstring).
WINDOW_SLACK_CYCLES = 2


class UtilizationSample(Protocol):
    """One stored utilization sample of a unit (the store's SampleRecord is one, :class:`Sample` another)."""

    @property
    def time(self) -> datetime: ...

    @property
    def util_mean(self) -> float: ...

    @property
    def util_max(self) -> float: ...


@dataclass(frozen=True)
class Sample:
    """A utilization sample: the unit's mean and max GPU utilization (percent) over one cycle."""

    time: datetime
    util_mean: float
    util_max: float


@dataclass(frozen=True)
class UnitMeasure:
    """What this cycle measured of a unit besides its samples: GPUs allocated and in use, and what the job
    published (throughput samples and its observed restart time; empty when unknown or not read)."""

    gpus_allocated: int = 0
    gpus_in_use: int = 0
    throughput: tuple[ThroughputSample, ...] = ()
    restart_s: float | None = None
    adaptive: AdaptiveState | None = None  # an opted-in job's adaptive-batch state (slurm_elastic.batchsize)
    cold_start_s: float | None = None  # measured grows' restart cost (controller/coldstart.py), for every unit


@dataclass(frozen=True)
class UnitReads:
    """What a caller has to read for one unit: its samples from ``since`` on, and its goodput when ``goodput``
    (the builder drops goodput otherwise, so reading it would be wasted)."""

    since: datetime
    goodput: bool
    serving_since: datetime | None = None  # a serving unit: read its published points from here on


def window_start(now: datetime, window_s: float, interval_s: float) -> datetime:
    """The time from which a unit's samples count (see the module docstring for the two cycles of slack)."""
    return now - timedelta(seconds=window_s + WINDOW_SLACK_CYCLES * interval_s)


def uses_goodput(settings: UnitSettings) -> bool:
    return settings.goodput or settings.restart_cost_aware or settings.speedup_growth


def utilization(unit_id: int, samples: Iterable[UtilizationSample], since: datetime,
                measure: UnitMeasure | None = None) -> JobUtilization | None:
    """Mean and max over the samples taken at or after ``since``, how much time they cover and when the newest
    was taken; None without samples. ``measure`` adds this cycle's GPU counts and the published goodput."""
    ordered = sorted((s for s in samples if s.time >= since), key=lambda s: s.time)
    if not ordered:
        return None
    m = measure or UnitMeasure()
    return JobUtilization(
        unit_id=unit_id,
        mean_util=sum(s.util_mean for s in ordered) / len(ordered),
        max_util=max(s.util_max for s in ordered),
        window_s=(ordered[-1].time - ordered[0].time).total_seconds(),
        samples=len(ordered),
        last_sample_at=ordered[-1].time,
        gpus_allocated=m.gpus_allocated,
        gpus_in_use=m.gpus_in_use,
        throughput=m.throughput,
        restart_s=max((r for r in (m.restart_s, m.cold_start_s) if r is not None), default=None),
        adaptive=m.adaptive,
    )


@dataclass
class PolicyInputBuilder:
    """Builds one cycle's policy input under ``cfg`` at ``now``; ``interval_s`` is the cycle interval.

    Pure: ask :meth:`reads` what to read for each unit, read it, then call :meth:`build`.
    """

    cfg: PolicyConfig
    now: datetime
    interval_s: float
    _resolver: SettingsResolver = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._resolver = SettingsResolver(self.cfg.at(self.now))

    def settings(self, unit: ElasticUnit) -> UnitSettings:
        """The unit's settings under the profile in force at ``now`` (what ``decide`` will use)."""
        return self._resolver.unit(unit)

    def reads(self, unit: ElasticUnit) -> UnitReads:
        s = self.settings(unit)
        serving_since = None
        if unit.spec.serving:
            serving_since = window_start(self.now, max(s.serving_down_window_s, s.serving_up_window_s),
                                         self.interval_s)
        return UnitReads(since=window_start(self.now, s.window_s, self.interval_s), goodput=uses_goodput(s),
                         serving_since=serving_since)

    def build(
        self,
        snapshot: ClusterSnapshot,
        units: Iterable[ElasticUnit],
        *,
        samples: Mapping[int, Sequence[UtilizationSample]],
        measures: Mapping[int, UnitMeasure] | None = None,
        history: Iterable[ResizeRecord] = (),
        in_progress: Iterable[ActionInProgress] = (),
        extension_ends: Iterable[ExtensionEnd] = (),
        account_shares: Mapping[str, float] | None = None,
        gpu_limits: Mapping[str, int] | None = None,
        extension_qos: str | None = None,
        serving: Mapping[int, ServingLoad] | None = None,
        power: PowerState | None = None,
        pending_min_nodes: Mapping[int, int] | None = None,
    ) -> PolicyInput:
        """The input of ``decide``. ``samples`` and ``measures`` are by unit id; samples older than the unit's
        window start are ignored, goodput of a unit whose settings do not use it is dropped, and facts about
        units not in ``units`` are left out."""
        ordered = tuple(sorted(units, key=lambda u: u.unit_id))
        ids = {u.unit_id for u in ordered}
        measures = measures or {}
        util: dict[int, JobUtilization] = {}
        for u in ordered:
            r = self.reads(u)
            m = measures.get(u.unit_id)
            if m is not None and not r.goodput and (m.throughput or m.restart_s is not None or m.adaptive):
                m = UnitMeasure(m.gpus_allocated, m.gpus_in_use, cold_start_s=m.cold_start_s)
            found = utilization(u.unit_id, samples.get(u.unit_id, ()), r.since, m)
            if found is not None:
                util[u.unit_id] = found
        loads: dict[int, ServingLoad] = {}
        for u in ordered:
            load = (serving or {}).get(u.unit_id)
            since = self.reads(u).serving_since
            if load is not None and since is not None:
                kept = tuple(sorted((p for p in load.points if p.at >= since), key=lambda p: p.at))
                loads[u.unit_id] = replace(load, points=kept)
        return PolicyInput(
            snapshot=snapshot,
            units=ordered,
            utilization=util,
            history=tuple(sorted((h for h in history if h.unit_id in ids), key=_history_key)),
            account_shares=dict(account_shares or {}),
            gpu_limits=dict(gpu_limits or {}),
            extension_qos=extension_qos,
            serving=loads,
            power=power if power is not None else PowerState(),
            pending_min_nodes=dict(pending_min_nodes or {}),
            in_progress=tuple(sorted((a for a in in_progress if a.unit_id in ids),
                                     key=lambda a: (a.since, a.unit_id, a.kind))),
            extension_ends=tuple(sorted((e for e in extension_ends if e.unit_id in ids),
                                        key=lambda e: (e.ended_at, e.unit_id, e.job_id))),
        )


def _history_key(r: ResizeRecord) -> tuple[datetime, int, str, int, int, int, str, str]:
    return (r.at, r.unit_id, str(r.action), -1 if r.for_job is None else r.for_job, r.from_nodes, r.to_nodes,
            str(r.outcome), r.reason)
