"""Cold start of a grow (``#ELASTIC --prewarm``): end the grows whose prewarm failed, time the ones that joined.

An extension job of a unit with ``--prewarm`` runs the command on each new node before joining
(slurm_elastic/prewarm.py) and appends ``launch`` / ``ready`` / ``failed`` / ``joined`` lines to
``<WorkDir>/.slurm-elastic/prewarm-<unit id>.jsonl``, which the controller reads here (safely, as the goodput
files: controller/goodput.py's read_job_file; only new bytes each cycle). Per extension job:

* **failed** on any node (the command exited non-zero, was not found, or ran past ``--prewarm-timeout``; or the
  other nodes were not ready in time): the extension job is cancelled if Slurm still holds it (a journaled
  ``cancel_extension`` the actuator carries out, controller/cancels.py), and a
  ``PREWARM_FAILED`` hold is recorded with the node and why. The extension never joined and the leader was never
  told (its launcher posts the grow notice only once every new node is ready), so the unit keeps its size.
* **joined** on all its nodes: a ``COLD_START`` hold on record with the grow's phases, back to back from the
  extension's submission (t0) to the last node joining:

  - ``resume``: the slowest of its nodes' resume (PowerTracker: POWERING_UP -> available) that ended after t0;
    0 when none of them was powered down;
  - ``start``: then until the launcher ran on every node (queue, Slurm's start, the batch script's setup);
  - ``prewarm``: then until every node was ready;
  - ``join``: then until the running workers acknowledged the grow notice and the new nodes' workers started.

  ``restart_cost_s`` = start + prewarm + join: what a grow costs the job beyond booting nodes. It is the unit's
  restart cost from then on (:meth:`ColdStarts.restart_s`, the median of its last five; read back from the
  decisions table, so it survives a restart): the policy charges it for every grow (``restart_s``), and for a
  grow onto powered-down nodes charges the resume estimate on top, so the boot is never counted twice.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from slurm_elastic.backoff import backoff_note, backoff_text, backoff_with, extension_ends
from slurm_elastic.controller.goodput import FileState, Refused, read_job_file
from slurm_elastic.controller.power import PowerTracker
from slurm_elastic.controller.rulings import LIVE_STATES, CancelExtension, Ruling
from slurm_elastic.goodput import DIR_NAME
from slurm_elastic.policy import Action, ElasticUnit, Reason
from slurm_elastic.policy.holds import Backoff
from slurm_elastic.policy.model import ExtensionEnd
from slurm_elastic.prewarm import Event, parse_event
from slurm_elastic.slurm.model import ClusterSnapshot
from slurm_elastic.store.protocols import ControllerStore
from slurm_elastic.store.records import DecisionFilter, ExtensionRecord, NewDecision, stored_nodes

log = logging.getLogger(__name__)

KEEP = 5  # cold starts per unit whose median is its restart cost
REMEMBER = timedelta(days=7)
PHASES = ("resume", "start", "prewarm", "join")


def parse_events(data: bytes, *, now: float) -> tuple[list[Event], int]:
    """read_file's parser for the prewarm file: its events, and how many lines were not one."""
    out: list[Event] = []
    bad = 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        e = parse_event(line)
        if e is None:
            bad += 1
        else:
            out.append(e)
    return out, bad


@dataclass(frozen=True)
class PrewarmOutcome:
    """What became of one extension job's prewarm (pure result of :func:`outcome`)."""

    kind: str  # "failed" | "joined" | "waiting"
    failed_node: str | None = None
    error: str | None = None
    rc: int | None = None
    phases: Mapping[str, float] = field(default_factory=dict)
    joined_at: float | None = None


def outcome(rec: ExtensionRecord, events: Iterable[Event], resumed: Mapping[str, tuple[datetime, float]]
            ) -> PrewarmOutcome:
    """The prewarm outcome of extension ``rec`` from the file's events and the nodes' measured resumes. Pure."""
    mine = [e for e in events if e.job == rec.job_id]
    for e in mine:
        if e.event == "failed":
            return PrewarmOutcome("failed", failed_node=e.node, error=e.error or "failed", rc=e.rc)
    by_event: dict[str, dict[str, float]] = {}
    for e in mine:
        by_event.setdefault(e.event, {})[e.node] = max(e.time, by_event.get(e.event, {}).get(e.node, e.time))
    need = max(1, rec.node_count)
    joined = by_event.get("joined", {})
    if len(joined) < need or len(by_event.get("launch", {})) < need or len(by_event.get("ready", {})) < need:
        return PrewarmOutcome("waiting")
    t0 = rec.created_at.timestamp()
    nodes = list(stored_nodes(rec.nodelist)) or list(joined)
    resume = max((took for n in nodes if (up := resumed.get(n)) is not None
                  for at, took in [up] if at.timestamp() >= t0), default=0.0)
    t1 = t0 + resume
    t2 = max(t1, *by_event["launch"].values())
    t3 = max(t2, *by_event["ready"].values())
    t4 = max(t3, *joined.values())
    phases = {"resume": resume, "start": t2 - t1, "prewarm": t3 - t2, "join": t4 - t3}
    return PrewarmOutcome("joined", phases={k: round(v, 1) for k, v in phases.items()}, joined_at=t4)


def restart_cost(phases: Mapping[str, float]) -> float:
    return round(sum(phases.get(p, 0.0) for p in ("start", "prewarm", "join")), 1)


def failed_decision(unit: ElasticUnit, rec: ExtensionRecord, o: PrewarmOutcome, timeout_s: int, *,
                    cancelled: bool = True, backoff: Backoff | None = None) -> NewDecision:
    size = unit.current_nodes
    error = o.error or "failed"
    # The timeout is named only where the failure was one (a command that exited 2 did not time out).
    bound = f" (--prewarm-timeout {timeout_s}s)" if "timed out" in error or "not ready after" in error else ""
    return NewDecision(
        job_id=unit.unit_id, action=str(Action.HOLD), reason=str(Reason.PREWARM_FAILED),
        message=(f"extension job {rec.job_id} ({rec.nodelist or '?'}): prewarm on {o.failed_node} {error}{bound}; "
                 f"extension job {'cancelled' if cancelled else 'ended'} before it joined, the unit stays at "
                 f"{size} node(s); {backoff_text(backoff)}"),
        inputs={"extension_job": rec.job_id, "extension_nodes": rec.nodelist, "node": o.failed_node,
                "error": o.error, "rc": o.rc, "prewarm_timeout_s": timeout_s, "basis": "job",
                "ended_by": "controller" if cancelled else "job", **backoff_note(backoff),
                "recorded_by": "controller (not the policy)"},
        current_nodes=size, target_nodes=size)


def cold_start_decision(unit: ElasticUnit, rec: ExtensionRecord, o: PrewarmOutcome) -> NewDecision:
    size = unit.current_nodes
    cost = restart_cost(o.phases)
    text = ", ".join(f"{p} {o.phases[p]:.1f}s" for p in PHASES)
    return NewDecision(
        job_id=unit.unit_id, action=str(Action.HOLD), reason=str(Reason.COLD_START),
        message=(f"extension job {rec.job_id} ({rec.nodelist or '?'}) joined: cold start {text}; restart cost "
                 f"{cost:.1f}s (start + prewarm + join)"),
        inputs={"extension_job": rec.job_id, "extension_nodes": rec.nodelist,
                **{f"{p}_s": o.phases[p] for p in PHASES}, "restart_cost_s": cost, "basis": "job",
                "recorded_by": "controller (not the policy)"},
        current_nodes=size, target_nodes=size)


def decide_prewarms(units: Mapping[int, ElasticUnit], outcomes: Sequence[tuple[ExtensionRecord, PrewarmOutcome]],
                    snap: ClusterSnapshot, now: datetime, *, ends: Iterable[ExtensionEnd],
                    dry_run: bool = False) -> list[Ruling]:
    """A PREWARM_FAILED hold (with the cancel of the extension while Slurm holds it; not in dry-run) or a
    COLD_START hold for each concluded prewarm in ``outcomes``. ``ends``: the grows that ended in the back-off's
    look-back (slurm_elastic/backoff.py). Pure."""
    seen = list(ends)
    out: list[Ruling] = []
    for rec, o in outcomes:
        unit = units[rec.parent_job_id]
        if o.kind != "failed":
            out.append(Ruling(cold_start_decision(unit, rec, o)))
            continue
        job = snap.job(rec.job_id)
        cancel = not dry_run and job is not None and job.state in LIVE_STATES
        end = ExtensionEnd(unit.unit_id, rec.job_id, "PREWARM_FAILED", rec.created_at, now, failure="PREWARM_FAILED")
        b = backoff_with(seen, unit.unit_id, end, now)
        seen.append(end)
        d = failed_decision(unit, rec, o, unit.spec.prewarm_timeout_s, cancelled=cancel, backoff=b)
        nodes = stored_nodes(rec.nodelist)
        out.append(Ruling(d, CancelExtension(unit.unit_id, rec.job_id, d.reason, nodes) if cancel else None))
    return out


@dataclass
class ColdStarts:
    """The shell: reads the prewarm files and records for :func:`decide_prewarms`, gives restart costs."""

    store: ControllerStore
    tracker: PowerTracker
    files: dict[str, FileState] = field(default_factory=dict)
    done: set[int] | None = None  # extension jobs already concluded (loaded from the decisions table once)

    def _recorded(self, now: datetime) -> list[Any]:
        out = []
        for reason in (Reason.COLD_START, Reason.PREWARM_FAILED):
            out += self.store.decisions.list_decisions(DecisionFilter(reason=str(reason), since=now - REMEMBER))
        return out

    def decide(self, units: Mapping[int, ElasticUnit], snap: ClusterSnapshot, now: datetime, *,
               dry_run: bool = False) -> list[Ruling]:
        """This cycle's concluded prewarms as rulings (:func:`decide_prewarms`); the cycle records them and has
        the actuator cancel. Reads the store's records and the prewarm files; writes nothing."""
        warm = {uid: u for uid, u in units.items() if u.spec.prewarm is not None and u.job.working_dir}
        if not warm:
            return []
        if self.done is None:
            self.done = {int(x) for d in self._recorded(now)
                         if isinstance(x := d.inputs.get("extension_job"), int)}
        records = [r for r in self.store.jobs.extensions(active_only=False, ended_since=now - timedelta(hours=1))
                   if r.parent_job_id in warm and r.job_id not in self.done]
        for path in set(self.files) - {self._path(u) for u in warm.values()}:
            del self.files[path]  # units that ended
        events = {uid: self._events(warm[uid], now) for uid in sorted({r.parent_job_id for r in records})}
        outcomes = [(rec, o) for rec in sorted(records, key=lambda r: (r.parent_job_id, r.job_id))
                    if (o := outcome(rec, events[rec.parent_job_id], self.tracker.last_up)).kind != "waiting"]
        if not outcomes:
            return []
        ends = extension_ends(self.store, now) if any(o.kind == "failed" for _, o in outcomes) else []
        rulings = decide_prewarms(warm, outcomes, snap, now, ends=ends, dry_run=dry_run)
        self.done.update(rec.job_id for rec, _ in outcomes)
        return rulings

    @staticmethod
    def _path(unit: ElasticUnit) -> str:
        return f"{unit.job.working_dir}/{DIR_NAME}/prewarm-{unit.unit_id}.jsonl"

    def _events(self, unit: ElasticUnit, now: datetime) -> Sequence[Event]:
        path = self._path(unit)
        try:
            state = read_job_file(unit, path, self.files.get(path), now=now.timestamp(), parse=parse_events)
        except Refused as e:
            log.info("job %s: not reading %s: %s", unit.job.display_id, path, e)
            return ()
        if state is None:
            self.files.pop(path, None)
            return ()
        self.files[path] = state
        return list(state.reports)

    def restart_s(self, now: datetime) -> dict[int, float]:
        """Each unit's restart cost from its last KEEP cold starts (median), from the decisions table."""
        per_unit: dict[int, list[tuple[datetime, float]]] = {}
        for d in self.store.decisions.list_decisions(DecisionFilter(reason=str(Reason.COLD_START),
                                                                    since=now - REMEMBER)):
            cost = d.inputs.get("restart_cost_s")
            if isinstance(cost, (int, float)) and not isinstance(cost, bool):
                per_unit.setdefault(d.job_id, []).append((d.time, float(cost)))
        return {uid: statistics.median(c for _, c in sorted(rows)[-KEEP:]) for uid, rows in per_unit.items()}
