"""Slurm power saving as the controller sees it (docs/power-saving.md): how long powered-down nodes take to come
back, and resumes that failed.

The policy counts a powered-down node (``IDLE+POWERED_DOWN``, sinfo's ``idle~``) as capacity with a resume
cost (``power_resume``, policy/walk.py). A grow onto it is an extension job that names the node; Slurm runs its
``ResumeProgram``, shows the node ``POWERING_UP`` (the job ``CONFIGURING``) and starts the job once the node's
slurmd registered. This module keeps what the policy needs for that:

* :class:`PowerTracker` (pure, in memory) watches each cycle's snapshot: a node seen ``POWERING_UP`` that is
  later available and not powered down took (now - first seen) to resume, an upper bound by one cycle. A node
  seen ``POWERING_UP`` that is later powered down or down did not come back: Slurm gave up after
  ``ResumeTimeout`` (measured on 22.05: "node n5 not resumed by ResumeTimeout(30) - marking down and power_save";
  the job on it is requeued, or ends ``NODE_FAIL`` when it may not be requeued).
* :func:`decide_resume_failures` (pure) turns such a failure under an extension job of a unit into: the extension
  job cancelled (a journaled ``cancel_extension`` the actuator carries out), a ``RESUME_FAILED`` hold on record
  (the unit keeps its size: the extension never ran on the node), and the node in
  :class:`~slurm_elastic.policy.PowerState`'s ``resume_failed`` for ``power_resume_backoff_s`` (read back from
  the decisions table, so the back-off survives a restart). A loss of the same
  (extension, node) is then not also recorded as ``NODE_FAILURE`` (controller/losses.py).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from slurm_elastic.backoff import backoff_note, backoff_text, backoff_with, extension_ends
from slurm_elastic.controller.rulings import LIVE_STATES, CancelExtension, Ruling
from slurm_elastic.policy import Action, ElasticUnit, PowerState, Reason
from slurm_elastic.policy.holds import Backoff
from slurm_elastic.policy.model import ExtensionEnd
from slurm_elastic.slurm.model import ClusterSnapshot, Node
from slurm_elastic.store.agents_sql import is_powered_down
from slurm_elastic.store.protocols import ControllerStore
from slurm_elastic.store.records import DecisionFilter, ExtensionRecord, NewDecision, stored_nodes

log = logging.getLogger(__name__)

#: Resume times kept per node (the median of these is the node's estimate).
KEEP_PER_NODE = 5


def _state(node: Node) -> str:
    return "+".join((node.state, *node.state_flags))


def _came_up(node: Node) -> bool:
    return node.is_available and "POWERED_DOWN" not in node.state_flags and "POWERING_UP" not in node.state_flags


@dataclass
class PowerTracker:
    """Resume times and failed resumes, from the node states of successive snapshots. Pure (no I/O)."""

    since: dict[str, datetime] = field(default_factory=dict)  # node -> first seen POWERING_UP
    resume_s: dict[str, list[float]] = field(default_factory=dict)
    last_up: dict[str, tuple[datetime, float]] = field(default_factory=dict)  # node -> (came up at, took s)

    def observe(self, snap: ClusterSnapshot, now: datetime) -> dict[str, str]:
        """Update from one snapshot; returns the nodes whose resume failed since the last one (-> their state)."""
        failed: dict[str, str] = {}
        for node in snap.nodes:
            if "POWERING_UP" in node.state_flags:
                self.since.setdefault(node.name, now)
                continue
            started = self.since.pop(node.name, None)
            if started is None:
                continue
            if _came_up(node):
                kept = self.resume_s.setdefault(node.name, [])
                kept.append((now - started).total_seconds())
                self.last_up[node.name] = (now, kept[-1])
                del kept[:-KEEP_PER_NODE]
            else:
                failed[node.name] = _state(node)
        for name in set(self.since) - {n.name for n in snap.nodes}:
            del self.since[name]
        return failed

    def estimates(self) -> dict[str, float]:
        """Median measured resume time per node."""
        return {name: statistics.median(values) for name, values in self.resume_s.items() if values}


@dataclass(frozen=True)
class ResumeFailure:
    unit_id: int
    extension_job: int
    nodes: tuple[str, ...]  # the extension's nodes
    failed: tuple[str, ...]  # those that did not come back
    node_states: Mapping[str, str]
    slurm_state: str  # the extension job's state (PENDING after a requeue, NODE_FAIL, ...)


def find_resume_failures(units: Mapping[int, ElasticUnit], records: Iterable[ExtensionRecord],
                         snap: ClusterSnapshot, failed: Mapping[str, str]) -> list[ResumeFailure]:
    """Extension jobs of ``units`` that asked for a node in ``failed`` and do not run on it. Pure."""
    out: list[ResumeFailure] = []
    for rec in sorted(records, key=lambda r: r.job_id):
        if rec.parent_job_id not in units:
            continue
        job = snap.job(rec.job_id)
        nodes = stored_nodes(rec.nodelist)
        if job is not None and job.nodes:
            nodes = tuple(dict.fromkeys((*nodes, *job.nodes)))
        lost = tuple(n for n in nodes if n in failed)
        if lost:
            out.append(ResumeFailure(unit_id=rec.parent_job_id, extension_job=rec.job_id, nodes=nodes, failed=lost,
                                     node_states={n: failed[n] for n in lost},
                                     slurm_state=job.state if job is not None else rec.state))
    return out


def failure_decision(unit: ElasticUnit, f: ResumeFailure, resume_timeout_s: float | None, *,
                     cancelled: bool, backoff_s: int | None = None, now: datetime | None = None,
                     backoff: Backoff | None = None) -> NewDecision:
    """The RESUME_FAILED hold for ``f``: the unit stays at its size; inputs name what failed and who ended the
    extension (``cancelled``: the controller; else Slurm, in ``slurm_state``). Pure."""
    bound = f"ResumeTimeout {resume_timeout_s:.0f}s" if resume_timeout_s is not None else "ResumeTimeout"
    size = unit.current_nodes
    ended = ("extension job cancelled by the controller" if cancelled
             else f"extension job ended by Slurm ({f.slurm_state})")
    until = (now + timedelta(seconds=backoff_s)) if backoff_s and now is not None else None
    nodes_note = (f"not grown onto again until {until.strftime('%Y-%m-%dT%H:%M:%SZ')} (power_resume_backoff_s "
                  f"{backoff_s}s)" if until is not None else "not grown onto again for power_resume_backoff_s")
    return NewDecision(
        job_id=unit.unit_id, action=str(Action.HOLD), reason=str(Reason.RESUME_FAILED),
        message=(f"extension job {f.extension_job} ({','.join(f.nodes)}): powered-down node(s) "
                 f"{','.join(f.failed)} did not come back within {bound} (now {', '.join(f.node_states.values())}); "
                 f"{ended}, the unit stays at {size} node(s); {','.join(f.failed)} {nodes_note}; "
                 f"{backoff_text(backoff)}"),
        inputs={"extension_job": f.extension_job, "extension_nodes": list(f.nodes), "lost_nodes": list(f.failed),
                "node_states": dict(f.node_states), "slurm_state": f.slurm_state,
                "ended_by": "controller" if cancelled else "slurm", **backoff_note(backoff),
                "node_backoff_until": until.isoformat() if until is not None else None,
                "resume_timeout_s": resume_timeout_s, "basis": "slurm", "recorded_by": "controller (not the policy)"},
        current_nodes=size, target_nodes=size)


def decide_resume_failures(units: Mapping[int, ElasticUnit], records: Sequence[ExtensionRecord],
                           snap: ClusterSnapshot, failed: Mapping[str, str], now: datetime, *,
                           ends: Iterable[ExtensionEnd], resume_timeout_s: float | None, dry_run: bool = False,
                           backoff_s: int | None = None) -> list[Ruling]:
    """The RESUME_FAILED holds for the resumes in ``failed`` (PowerTracker.observe), each with the cancel of its
    extension job while Slurm still holds it (not in dry-run). ``ends``: the grows that ended in the back-off's
    look-back (slurm_elastic/backoff.py), so each record names the back-off it starts. Pure."""
    seen = list(ends)
    out: list[Ruling] = []
    for f in find_resume_failures(units, records, snap, failed):
        job = snap.job(f.extension_job)
        cancel = not dry_run and job is not None and job.state in LIVE_STATES
        rec = next((r for r in records if r.job_id == f.extension_job), None)
        end = ExtensionEnd(f.unit_id, f.extension_job, "RESUME_FAILED", rec.created_at if rec else now, now,
                           failure="RESUME_FAILED")
        b = backoff_with(seen, f.unit_id, end, now)
        seen.append(end)
        d = failure_decision(units[f.unit_id], f, resume_timeout_s, cancelled=cancel, backoff_s=backoff_s, now=now,
                             backoff=b)
        out.append(Ruling(d, CancelExtension(f.unit_id, f.extension_job, d.reason, f.nodes) if cancel else None))
    return out


class ResumeFailures:
    """The shell: reads the facts for :func:`decide_resume_failures`, builds PowerState (writes nothing)."""

    def __init__(self, store: ControllerStore) -> None:
        self.store = store
        self.tracker = PowerTracker()

    def decide(self, units: Mapping[int, ElasticUnit], snap: ClusterSnapshot, now: datetime, *,
               resume_timeout_s: float | None, dry_run: bool = False, backoff_s: int | None = None
               ) -> list[Ruling]:
        """This snapshot's failed resumes as rulings; the cycle records them and has the actuator cancel."""
        failed = self.tracker.observe(snap, now)
        if not failed:
            return []
        records = self.store.jobs.extensions(active_only=False, ended_since=now - timedelta(hours=1))
        return decide_resume_failures(units, records, snap, failed, now, ends=extension_ends(self.store, now),
                                      resume_timeout_s=resume_timeout_s, dry_run=dry_run, backoff_s=backoff_s)

    def state(self, now: datetime, backoff_s: int, resume_timeout_s: float | None) -> PowerState:
        """What the policy gets: measured resume times, ResumeTimeout, and recent failures (from the store)."""
        failed: dict[str, datetime] = {}
        if backoff_s > 0:
            for d in self.store.decisions.list_decisions(DecisionFilter(reason=str(Reason.RESUME_FAILED),
                                                                        since=now - timedelta(seconds=backoff_s))):
                lost = d.inputs.get("lost_nodes")
                for name in lost if isinstance(lost, list) else []:
                    failed[str(name)] = max(d.time, failed.get(str(name), d.time))
        return power_state(self.tracker, resume_timeout_s, failed)


def power_state(tracker: PowerTracker, resume_timeout_s: float | None,
                resume_failed: Mapping[str, datetime]) -> PowerState:
    """The policy's power input (the controller's and the simulator's): the tracker's measured resume times,
    Slurm's ResumeTimeout, and the nodes whose resume failed within power_resume_backoff_s. Pure."""
    return PowerState(resume_s=tracker.estimates(), resume_timeout_s=resume_timeout_s,
                      resume_failed=dict(resume_failed))


def note_powered_down(store: ControllerStore, snap: ClusterSnapshot) -> list[str]:
    """Agents of nodes Slurm has switched off (or is booting) are shown as powered down, not as stale or
    unreachable (``agents``, ``status``): noted once per power-down (the next successful scrape clears it).
    Returns the nodes noted now."""
    off = {n.name: n for n in snap.nodes if n.is_powered_off}
    noted: list[str] = []
    for a in store.agents.list_agents() if off else ():
        n = off.get(a.node)
        if n is not None and not is_powered_down(a.last_error):
            store.agents.agent_powered_down(a.node, url=a.url, state=_state(n))
            noted.append(a.node)
    return noted
