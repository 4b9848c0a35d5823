"""``mig apply`` as a journaled workflow: a pure step machine, and the loop that runs it through ports.

Forward steps, each recorded in the journal before it acts (intent -> in_progress -> applied/failed)::

    drain -> wait_jobs -> apply_layout -> write_gres -> restart_slurm -> verify -> resume

Every step is idempotent, so a workflow whose process died (``in_progress`` step, or a step not yet recorded)
is finished by running the interrupted step again (``slurm-elastic mig resume-workflows``, or automatically
before the next ``mig apply`` on that node). What happens when a step fails is decided by :func:`next_move`
from the journal alone:

* ``wait_jobs`` timed out: the node is put back as it was (``restore_node``); outcome ``aborted``.
* ``drain`` failed: ``restore_node``; outcome ``failed``.
* ``resume`` failed: the node stays drained (``hold_drained``); outcome ``failed``.
* any other step failed: what was done is undone (``rollback_layout``, ``rollback_gres``,
  ``rollback_restart``, then ``rollback_verify``) and the node stays drained with a reason that names the
  failed step (``hold_drained``); outcome ``failed``. It is never resumed with GRES that do not match.
* an operator asked for a rollback (``resume-workflows --rollback``): the interrupted step is recorded as
  ``aborted``, the same undo steps run, and if they all succeed and verify, the node goes back to the state it
  had before (``restore_node``); outcome ``aborted``.

Why ``restart_slurm`` restarts slurmctld and the node's slurmd instead of ``scontrol reconfigure``: measured on
Slurm 22.05.8 (docs/mig.md, "What Slurm 22.05 needs"). The order (stop slurmd, restart slurmctld, start slurmd)
keeps the node's DRAIN across the restart; restarting slurmctld while the node was INVAL lost it.

The module is pure: every side effect goes through the ports in :class:`WorkflowPorts` (journal, Slurm, agent,
config files, daemons, clock, fault hook). The adapters live in :mod:`slurm_elastic.controller.mig_adapters`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from slurm_elastic.mig.diff import diff_node
from slurm_elastic.mig.errors import MigError
from slurm_elastic.mig.gres import NodeGresConfig, render_node_gres_config
from slurm_elastic.mig.model import Layout, NodeLayout, describe_counts
from slurm_elastic.mig.slurmconf import (
    gres_summary,
    node_gres_lines,
    node_gres_value,
    set_node_gres,
    set_node_gres_lines,
)
from slurm_elastic.mig.wire import NodeMigReport, node_layout_from_obj, node_layout_to_obj

log = logging.getLogger("slurm_elastic.mig.workflow")

WORKFLOW_KIND = "mig_workflow"
STEP_KIND = "mig_step"
REASON_MAX = 200  # Slurm keeps longer reasons, but sinfo columns and humans do not


class Step(StrEnum):
    DRAIN = "drain"
    WAIT_JOBS = "wait_jobs"
    APPLY_LAYOUT = "apply_layout"
    WRITE_GRES = "write_gres"
    RESTART_SLURM = "restart_slurm"
    VERIFY = "verify"
    RESUME = "resume"
    ROLLBACK_LAYOUT = "rollback_layout"
    ROLLBACK_GRES = "rollback_gres"
    ROLLBACK_RESTART = "rollback_restart"
    ROLLBACK_VERIFY = "rollback_verify"
    HOLD_DRAINED = "hold_drained"
    RESTORE_NODE = "restore_node"


FORWARD: tuple[Step, ...] = (Step.DRAIN, Step.WAIT_JOBS, Step.APPLY_LAYOUT, Step.WRITE_GRES, Step.RESTART_SLURM,
                             Step.VERIFY, Step.RESUME)
UNDO: tuple[Step, ...] = (Step.ROLLBACK_LAYOUT, Step.ROLLBACK_GRES, Step.ROLLBACK_RESTART, Step.ROLLBACK_VERIFY)


class RecordState(StrEnum):
    """The journal's states (same values as :class:`slurm_elastic.store.ActionState`)."""

    INTENT = "intent"
    IN_PROGRESS = "in_progress"
    APPLIED = "applied"
    FAILED = "failed"
    ABORTED = "aborted"

    @property
    def is_open(self) -> bool:
        return self in (RecordState.INTENT, RecordState.IN_PROGRESS)


class Outcome(StrEnum):
    APPLIED = "applied"
    FAILED = "failed"
    ABORTED = "aborted"


@dataclass(frozen=True)
class Record:
    """One journal row, as the workflow sees it."""

    id: int
    key: str
    kind: str
    state: RecordState
    params: Mapping[str, Any]
    message: str = ""


@dataclass(frozen=True)
class RunStep:
    step: Step
    rerun: bool  # the step has a record already: the process died in it (or before marking it done)


@dataclass(frozen=True)
class Finish:
    outcome: Outcome
    message: str


Move = RunStep | Finish


# ---- the pure step machine -----------------------------------------------------------------------------------


def _stopped(steps: Mapping[Step, Record]) -> Step | None:
    """The forward step that failed (or was aborted by an operator), if any."""
    for s in FORWARD:
        r = steps.get(s)
        if r is not None and r.state in (RecordState.FAILED, RecordState.ABORTED):
            return s
    return None


def undo_plan(stopped: Step, steps: Mapping[Step, Record]) -> tuple[Step, ...]:
    """The undo steps a workflow stopped at ``stopped`` needs, in order (without the final node step)."""
    if stopped in (Step.DRAIN, Step.WAIT_JOBS):
        return ()
    if stopped is Step.RESUME and steps[stopped].state is RecordState.FAILED:
        return ()  # the node is right; only Slurm's resume failed
    plan: list[Step] = []
    if Step.APPLY_LAYOUT in steps:
        plan.append(Step.ROLLBACK_LAYOUT)
    if Step.WRITE_GRES in steps:
        plan += [Step.ROLLBACK_GRES, Step.ROLLBACK_RESTART]
    if plan:
        plan.append(Step.ROLLBACK_VERIFY)
    return tuple(plan)


def final_step(stopped: Step, steps: Mapping[Step, Record]) -> Step:
    """``restore_node`` when the node may go back to how it was, else ``hold_drained``."""
    record = steps[stopped]
    undo = undo_plan(stopped, steps)
    undone = all(steps.get(u) is not None and steps[u].state is RecordState.APPLIED for u in undo)
    if stopped is Step.WAIT_JOBS or stopped is Step.DRAIN:
        return Step.RESTORE_NODE
    if record.state is RecordState.ABORTED and undone:
        return Step.RESTORE_NODE
    return Step.HOLD_DRAINED


def next_move(steps: Mapping[Step, Record]) -> Move:
    """What to do next, from the step records alone (pure; the whole recovery logic lives here)."""
    stopped = _stopped(steps)
    if stopped is None:
        for s in FORWARD:
            r = steps.get(s)
            if r is None:
                return RunStep(s, rerun=False)
            if r.state.is_open:
                return RunStep(s, rerun=True)
        return Finish(Outcome.APPLIED, "layout applied, GRES verified, node back in its previous state")
    undo = undo_plan(stopped, steps)
    skip_verify = any(steps.get(u) is not None and steps[u].state is RecordState.FAILED for u in undo)
    for s in undo:
        if s is Step.ROLLBACK_VERIFY and skip_verify:
            continue
        r = steps.get(s)
        if r is None:
            return RunStep(s, rerun=False)
        if r.state.is_open:
            return RunStep(s, rerun=True)
    last = final_step(stopped, steps)
    r = steps.get(last)
    if r is None:
        return RunStep(last, rerun=False)
    if r.state.is_open:
        return RunStep(last, rerun=True)
    return Finish(*_outcome(stopped, steps, last, r))


def _outcome(stopped: Step, steps: Mapping[Step, Record], last: Step, last_record: Record) -> tuple[Outcome, str]:
    cause = steps[stopped]
    what = (f"rollback requested at {stopped}" if cause.state is RecordState.ABORTED
            else f"{stopped} failed: {cause.message}")
    failed_undo = [f"{s} failed: {steps[s].message}" for s in UNDO
                   if s in steps and steps[s].state is RecordState.FAILED]
    parts = [what, *failed_undo]
    if last_record.state is not RecordState.APPLIED:
        parts.append(f"{last} failed: {last_record.message}")
        return Outcome.FAILED, "; ".join(parts)
    if last is Step.RESTORE_NODE and stopped is Step.WAIT_JOBS and cause.state is RecordState.FAILED:
        return Outcome.ABORTED, "; ".join([*parts, "node restored as it was"])
    if last is Step.RESTORE_NODE and cause.state is RecordState.ABORTED:
        return Outcome.ABORTED, "; ".join([*parts, "rolled back, node restored as it was"])
    if last is Step.RESTORE_NODE:
        return Outcome.FAILED, "; ".join([*parts, "node restored as it was"])
    return Outcome.FAILED, "; ".join([*parts, "node left drained"])


def hold_reason(prefix: str, workflow_id: int, steps: Mapping[Step, Record]) -> str:
    """The drain reason after a failure: names the failed step (and a failed rollback step)."""
    stopped = _stopped(steps)
    if stopped is None:
        return f"{prefix} #{workflow_id}: failed"
    cause = steps[stopped]
    text = (f"rollback requested at {stopped}" if cause.state is RecordState.ABORTED
            else f"{stopped} failed: {cause.message}")
    bad = [s for s in UNDO if s in steps and steps[s].state is RecordState.FAILED]
    if bad:
        text += f"; {bad[0]} failed too"
    return one_line(f"{prefix} #{workflow_id}: {text}", REASON_MAX)


def one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# ---- settings and the values the ports exchange ------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowSettings:
    """What a workflow needs from the site's configuration; stored with the workflow so a resume uses the same."""

    slurm_conf: str
    gres_conf: str
    device_files: str = "nvidia-caps"  # or a template such as /var/tmp/cl/dev/{node}/gpu{ordinal}
    mps_per_gpu: int = 0  # gres/mps count per whole GPU (0: no mps lines)
    autodetect_off: bool = False
    whole_gpu_type: str | None = None  # Slurm type of whole GPUs when the model has none
    wait_timeout_s: float = 3600.0
    verify_timeout_s: float = 120.0
    poll_interval_s: float = 5.0
    apply_mode: str = "restart"  # "restart" (measured on 22.05) or "reconfigure"
    reconfigure_after_restart: bool = True
    reason_prefix: str = "slurm-elastic mig"

    def to_obj(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> WorkflowSettings:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in obj.items() if k in known})


@dataclass(frozen=True)
class NodeStatus:
    name: str
    state: str  # base state, upper case (IDLE, MIXED, ...)
    flags: tuple[str, ...]
    reason: str | None
    gres: str  # Slurm's view, e.g. "gpu:4,mps:400"
    slurmd_started_at: float | None = None  # when the node's current slurmd started (Unix seconds, node clock)

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in {"DRAIN", "DRAINED", "DRAINING"}

    @property
    def registered(self) -> bool:
        """slurmd registered with a valid configuration (not INVAL, not down, responding)."""
        bad_states = {"DOWN", "UNKNOWN", "INVAL", "FAIL", "FUTURE"}
        bad_flags = {"NOT_RESPONDING", "INVALID_REG", "INVAL", "FAIL"}
        return self.state not in bad_states and not bad_flags.intersection(self.flags)


@dataclass(frozen=True)
class JobOnNode:
    job_id: int
    user: str
    state: str


class WorkflowError(MigError):
    """A workflow step could not be done; the message becomes the step's journal message."""


class InjectedFault(WorkflowError):
    """Raised by the test-only fault hook (``SLURM_ELASTIC_MIG_FAULT=fail:<step>``)."""


class WorkflowBusyError(WorkflowError):
    """Another workflow on the node is still open."""


# ---- ports -----------------------------------------------------------------------------------------------------


class WorkflowJournal(Protocol):
    def create(self, key: str, kind: str, params: Mapping[str, object], gpus: int) -> Record: ...
    def get(self, record_id: int) -> Record: ...
    def find(self, key: str) -> Record | None: ...
    def start(self, record_id: int) -> Record: ...
    def finish(self, record_id: int, message: str) -> Record: ...
    def fail(self, record_id: int, message: str) -> Record: ...
    def abort(self, record_id: int, message: str) -> Record: ...
    def open_workflows(self) -> list[Record]: ...


class SlurmPort(Protocol):
    def node_status(self, node: str) -> NodeStatus: ...
    def jobs_on(self, node: str) -> tuple[JobOnNode, ...]: ...
    def drain(self, node: str, reason: str) -> None: ...
    def resume(self, node: str) -> None: ...
    def reconfigure(self) -> None: ...


class AgentPort(Protocol):
    def report(self, node: str) -> NodeMigReport: ...
    def apply(self, node: str, layout: NodeLayout) -> tuple[tuple[str, ...], NodeMigReport]: ...


class FilesPort(Protocol):
    def read(self, path: str) -> str: ...
    def write(self, path: str, text: str) -> None: ...


class DaemonsPort(Protocol):
    def stop_slurmd(self, node: str) -> None: ...
    def start_slurmd(self, node: str) -> None: ...
    def restart_slurmctld(self) -> None: ...


class ClockPort(Protocol):
    def now(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class NodeLockPort(Protocol):
    """One workflow process per node at a time: ``hold`` raises :class:`WorkflowBusyError` when another live
    process holds the node (the lock must die with its process, so that a crash never blocks a resume)."""

    def hold(self, node: str) -> AbstractContextManager[None]: ...


class NoLock:
    def hold(self, node: str) -> AbstractContextManager[None]:
        return nullcontext()


@dataclass
class WorkflowPorts:
    journal: WorkflowJournal
    slurm: SlurmPort
    agent: AgentPort
    files: FilesPort
    daemons: DaemonsPort
    clock: ClockPort
    fault: Callable[[str], None] = field(default=lambda point: None)
    say: Callable[[str], None] = field(default=lambda line: None)
    lock: NodeLockPort = field(default_factory=NoLock)


@dataclass(frozen=True)
class WorkflowResult:
    workflow_id: int
    node: str
    outcome: Outcome
    message: str
    steps: tuple[tuple[str, str, str], ...]  # (step, state, message), in journal order


# ---- pure helpers the shell uses -------------------------------------------------------------------------------


def layout_matches(report: NodeMigReport, requested: NodeLayout) -> list[str]:
    """Mismatches between what the agent reports and ``requested`` (empty when they agree)."""
    out = []
    for index, layout in requested.gpus:
        g = report.gpu(index)
        if g is None:
            out.append(f"GPU {index} missing")
            continue
        have = g.state.layout()
        if have != layout:
            out.append(f"GPU {index}: {_describe(have)} instead of {_describe(layout)}")
    return out


def _describe(layout: Layout) -> str:
    return "MIG off" if not layout.mig_enabled else describe_counts(layout.counts)


SLURMD_START_SLACK_S = 2.0  # the node's clock against ours (NTP-synced hosts); slurmd reports its own start time


def gres_mismatch(expected: str, status: NodeStatus, restarted_at: float | None = None) -> str | None:
    """Why Slurm does not (yet) show ``expected`` for the node. ``restarted_at``: the slurmd must have started
    since then, i.e. registered its new gres.conf (slurmctld shows the new Gres= from slurm.conf before that)."""
    want, have = gres_summary(expected), gres_summary(status.gres)
    if want != have:
        return f"Slurm shows Gres={status.gres or '(none)'} for {status.name}, expected {expected}"
    if restarted_at is not None and (status.slurmd_started_at is None
                                     or status.slurmd_started_at < restarted_at - SLURMD_START_SLACK_S):
        return f"slurmd on {status.name} has not registered since the restart"
    if not status.registered:
        return f"{status.name} is {status.state}+{'+'.join(status.flags)} (not registered with its new GRES yet)"
    return None


@dataclass(frozen=True)
class GresEdit:
    """The two file rewrites of ``write_gres`` (texts before and after), and what Slurm should then show."""

    slurm_conf: str
    gres_conf: str
    slurm_before: str
    slurm_after: str
    gres_before: str
    gres_after: str
    node_gres: str
    gres_lines: tuple[str, ...]
    old_node_gres: str | None
    old_gres_lines: tuple[str, ...]

    def to_obj(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["gres_lines"] = list(self.gres_lines)
        d["old_gres_lines"] = list(self.old_gres_lines)
        return d

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> GresEdit:
        known = set(cls.__dataclass_fields__)
        d = {k: v for k, v in obj.items() if k in known}
        d["gres_lines"] = tuple(d.get("gres_lines", ()))
        d["old_gres_lines"] = tuple(d.get("old_gres_lines", ()))
        return cls(**d)


def plan_gres_edit(node: str, config: NodeGresConfig, settings: WorkflowSettings, *, slurm_text: str,
                   gres_text: str, note: str) -> GresEdit:
    """The rewrite of both files for the node's new GRES (pure)."""
    return GresEdit(
        slurm_conf=settings.slurm_conf,
        gres_conf=settings.gres_conf,
        slurm_before=slurm_text,
        slurm_after=set_node_gres(slurm_text, node, config.node_gres, note),
        gres_before=gres_text,
        gres_after=set_node_gres_lines(gres_text, node, config.gres_lines, note),
        node_gres=config.node_gres,
        gres_lines=config.gres_lines,
        old_node_gres=node_gres_value(slurm_text, node),
        old_gres_lines=node_gres_lines(gres_text, node),
    )


def node_config_for(node: str, report: NodeMigReport, settings: WorkflowSettings) -> NodeGresConfig:
    return render_node_gres_config(
        node, report, device_files=settings.device_files, mps_per_gpu=settings.mps_per_gpu,
        autodetect_off=settings.autodetect_off, whole_gpu_type=settings.whole_gpu_type,
    )


# ---- the shell -------------------------------------------------------------------------------------------------


class MigWorkflow:
    """Runs workflows through the ports. ``start`` journals a new one and runs it; ``run`` continues one."""

    def __init__(self, ports: WorkflowPorts, settings: WorkflowSettings) -> None:
        self.p = ports
        self.settings = settings

    # -- starting ---------------------------------------------------------------------------------------------
    def open_for(self, node: str) -> list[Record]:
        return [r for r in self.p.journal.open_workflows() if r.params.get("node") == node]

    def start(self, node: str, requested: NodeLayout) -> WorkflowResult:
        """Journal and run a new workflow. Open workflows on the node are finished (or rolled back) first."""
        with self.p.lock.hold(node):
            for old in self.open_for(node):
                self.p.say(f"finishing open workflow #{old.id} on {node} first")
                self._run(old.id)
            return self._start(node, requested)

    def _start(self, node: str, requested: NodeLayout) -> WorkflowResult:
        report = self.p.agent.report(node)
        diff_node(report.models(), report.states(), requested)  # LayoutError: refuse before journaling anything
        status = self.p.slurm.node_status(node)
        original = NodeLayout.of({i: g.state.layout() for i, _ in requested.gpus
                                  if (g := report.gpu(i)) is not None})
        params = {
            "node": node,
            "layout": node_layout_to_obj(requested),
            "original_layout": node_layout_to_obj(original),
            "original": {"drained": status.drained, "reason": status.reason, "gres": status.gres,
                         "state": status.state},
            "settings": self.settings.to_obj(),
        }
        key = f"mig:{node}:{uuid.uuid4().hex[:16]}"
        wf = self.p.journal.create(key, WORKFLOW_KIND, params, gpus=len(requested.gpus))
        self.p.say(f"workflow #{wf.id}: {node} -> {node_layout_to_obj(requested)}")
        return self._run(wf.id)

    def resume_open(self, *, node: str | None = None, rollback: bool = False) -> list[WorkflowResult]:
        results = []
        for wf in self.p.journal.open_workflows():
            if node is not None and wf.params.get("node") != node:
                continue
            with self.p.lock.hold(str(wf.params.get("node"))):
                if rollback:
                    self.request_rollback(wf.id)
                results.append(self._run(wf.id))
        return results

    def request_rollback(self, workflow_id: int) -> None:
        """Record the operator's rollback: the in-flight forward step (or the next one) becomes ``aborted``."""
        wf = self.p.journal.get(workflow_id)
        steps = self._steps(wf)
        if _stopped(steps) is not None:
            return  # already undoing
        move = next_move(steps)
        if not isinstance(move, RunStep):
            return
        rec = steps.get(move.step) or self._create_step(wf, move.step, {})
        self.p.journal.abort(rec.id, "rollback requested by the operator")

    # -- running ----------------------------------------------------------------------------------------------
    def _step_key(self, wf: Record, step: Step) -> str:
        return f"{wf.key}:{step}"

    def _steps(self, wf: Record) -> dict[Step, Record]:
        out: dict[Step, Record] = {}
        for s in Step:
            r = self.p.journal.find(self._step_key(wf, s))
            if r is not None:
                out[s] = r
        return out

    def _create_step(self, wf: Record, step: Step, params: Mapping[str, object]) -> Record:
        return self.p.journal.create(self._step_key(wf, step), STEP_KIND,
                                     {"workflow": wf.id, "step": step.value, **params}, gpus=0)

    def run(self, workflow_id: int) -> WorkflowResult:
        """Continue one workflow to its end (holding its node's lock)."""
        with self.p.lock.hold(str(self.p.journal.get(workflow_id).params.get("node"))):
            return self._run(workflow_id)

    def _run(self, workflow_id: int) -> WorkflowResult:
        wf = self.p.journal.get(workflow_id)
        if not wf.state.is_open:
            return self.result(wf.id)
        if wf.state is RecordState.INTENT:
            wf = self.p.journal.start(wf.id)
        settings = WorkflowSettings.from_obj(wf.params.get("settings", {})) if wf.params.get("settings") \
            else self.settings
        while wf.state.is_open:
            steps = self._steps(wf)
            move = next_move(steps)
            if isinstance(move, Finish):
                wf = self._finish(wf, move)
                break
            self._run_step(wf, settings, move, steps)
        return self.result(wf.id)

    def _finish(self, wf: Record, move: Finish) -> Record:
        self.p.say(f"workflow #{wf.id}: {move.outcome}: {move.message}")
        if move.outcome is Outcome.APPLIED:
            return self.p.journal.finish(wf.id, move.message)
        if move.outcome is Outcome.ABORTED:
            return self.p.journal.abort(wf.id, move.message)
        return self.p.journal.fail(wf.id, move.message)

    def _run_step(self, wf: Record, settings: WorkflowSettings, move: RunStep, steps: Mapping[Step, Record]) -> None:
        step = move.step
        rec = steps.get(step)
        if rec is None:
            try:
                params = self._prepare(wf, settings, step)
            except Exception as exc:  # noqa: BLE001 - any failure to prepare is this step's failure
                rec = self._create_step(wf, step, {"prepare_error": str(exc)})
                self._fail(rec, step, exc)
                return
            rec = self._create_step(wf, step, params)
        if rec.state is RecordState.INTENT:
            rec = self.p.journal.start(rec.id)
        self.p.say(f"workflow #{wf.id}: {step}{' (again)' if move.rerun else ''} ...")
        try:
            self.p.fault(f"before:{step}")
            message = self._execute(wf, settings, step, rec, steps)
            self.p.fault(f"during:{step}")
        except Exception as exc:  # noqa: BLE001 - every failure is journaled and decides the next move
            self._fail(rec, step, exc)
            return
        self.p.journal.finish(rec.id, message)
        self.p.say(f"workflow #{wf.id}: {step}: {message}")
        self.p.fault(f"after:{step}")

    def _fail(self, rec: Record, step: Step, exc: Exception) -> None:
        if not isinstance(exc, MigError | WorkflowError):
            log.exception("step %s failed unexpectedly", step)
        message = one_line(str(exc) or type(exc).__name__, 2000)
        self.p.journal.fail(rec.id, message)
        self.p.say(f"{step} FAILED: {message}")

    # -- what each step does --------------------------------------------------------------------------------
    def _prepare(self, wf: Record, settings: WorkflowSettings, step: Step) -> dict[str, object]:
        if step is Step.WAIT_JOBS:
            return {"deadline": self.p.clock.now() + settings.wait_timeout_s}
        if step in (Step.VERIFY, Step.ROLLBACK_VERIFY):
            return {"deadline": self.p.clock.now() + settings.verify_timeout_s}
        if step in (Step.RESTART_SLURM, Step.ROLLBACK_RESTART):
            return {"started_at": self.p.clock.now()}
        if step is Step.WRITE_GRES:
            node = str(wf.params["node"])
            report = self.p.agent.report(node)
            config = node_config_for(node, report, settings)
            edit = plan_gres_edit(node, config, settings, slurm_text=self.p.files.read(settings.slurm_conf),
                                  gres_text=self.p.files.read(settings.gres_conf), note=f"workflow={wf.id}")
            return {"edit": edit.to_obj()}
        return {}

    def _execute(self, wf: Record, settings: WorkflowSettings, step: Step, rec: Record,
                 steps: Mapping[Step, Record]) -> str:
        node = str(wf.params["node"])
        prefix = f"{settings.reason_prefix} #{wf.id}"
        if step is Step.DRAIN:
            self.p.slurm.drain(node, f"{prefix}: draining to change the MIG layout")
            return f"{node} drained"
        if step is Step.WAIT_JOBS:
            return self._wait_jobs(node, float(rec.params["deadline"]), settings)
        if step is Step.APPLY_LAYOUT:
            changes, _ = self.p.agent.apply(node, node_layout_from_obj(wf.params["layout"]))
            return "; ".join(changes) if changes else "the GPUs already had the layout"
        if step is Step.WRITE_GRES:
            return self._write_gres(GresEdit.from_obj(rec.params["edit"]))
        if step in (Step.RESTART_SLURM, Step.ROLLBACK_RESTART):
            return self._restart(node, settings, f"{prefix}: MIG layout change in progress")
        if step is Step.VERIFY:
            edit = GresEdit.from_obj(steps[Step.WRITE_GRES].params["edit"])
            return self._verify(node, node_layout_from_obj(wf.params["layout"]), edit.node_gres,
                                float(rec.params["deadline"]), settings,
                                _restarted(steps, Step.RESTART_SLURM, settings))
        if step is Step.RESUME or step is Step.RESTORE_NODE:
            return self._restore(node, wf.params["original"])
        if step is Step.ROLLBACK_LAYOUT:
            changes, _ = self.p.agent.apply(node, node_layout_from_obj(wf.params["original_layout"]))
            return "; ".join(changes) if changes else "the GPUs already had the original layout"
        if step is Step.ROLLBACK_GRES:
            write = steps.get(Step.WRITE_GRES)
            if write is None or "edit" not in write.params:
                return "the GRES files were never rewritten"
            return self._revert_gres(node, GresEdit.from_obj(write.params["edit"]))
        if step is Step.ROLLBACK_VERIFY:
            return self._verify(node, node_layout_from_obj(wf.params["original_layout"]),
                                str(wf.params["original"]["gres"]), float(rec.params["deadline"]), settings,
                                _restarted(steps, Step.ROLLBACK_RESTART, settings))
        if step is Step.HOLD_DRAINED:
            reason = hold_reason(settings.reason_prefix, wf.id, steps)
            self.p.slurm.drain(node, reason)
            return f"{node} left drained: {reason}"
        raise WorkflowError(f"unknown step {step}")  # pragma: no cover

    def _wait_jobs(self, node: str, deadline: float, settings: WorkflowSettings) -> str:
        while True:
            jobs = self.p.slurm.jobs_on(node)
            if not jobs:
                return f"no jobs left on {node}"
            now = self.p.clock.now()
            if now >= deadline:
                ids = ", ".join(str(j.job_id) for j in jobs)
                raise WorkflowError(
                    f"jobs {ids} still on {node} after the {settings.wait_timeout_s:g} s wait timeout")
            self.p.clock.sleep(min(settings.poll_interval_s, max(deadline - now, 0.0)))

    def _write_gres(self, edit: GresEdit) -> str:
        done = []
        for path, before, after in ((edit.slurm_conf, edit.slurm_before, edit.slurm_after),
                                    (edit.gres_conf, edit.gres_before, edit.gres_after)):
            current = self.p.files.read(path)
            if current == after:
                continue
            if current != before:
                raise WorkflowError(f"{path} changed since the workflow read it; not overwriting it")
            self.p.files.write(path, after)
            done.append(path)
        return f"Gres={edit.node_gres}; wrote {', '.join(done) if done else 'nothing (already written)'}"

    def _revert_gres(self, node: str, edit: GresEdit) -> str:
        done = []
        for path, before, after, kind in ((edit.slurm_conf, edit.slurm_before, edit.slurm_after, "slurm"),
                                          (edit.gres_conf, edit.gres_before, edit.gres_after, "gres")):
            current = self.p.files.read(path)
            if current == before:
                continue
            if current == after:
                self.p.files.write(path, before)
            elif kind == "slurm":  # someone else edited the file meanwhile: put only this node back
                self.p.files.write(path, set_node_gres(current, node, edit.old_node_gres, marker=False))
            else:
                self.p.files.write(path, set_node_gres_lines(current, node, edit.old_gres_lines, marker=False))
            done.append(path)
        return f"restored {', '.join(done) if done else 'nothing (already original)'}"

    def _restart(self, node: str, settings: WorkflowSettings, reason: str) -> str:
        if settings.apply_mode == "reconfigure":
            self.p.slurm.reconfigure()
            self.p.slurm.drain(node, reason)
            return "scontrol reconfigure"
        # Measured on 22.05: stop the node's slurmd first, so that it never registers its new gres.conf with a
        # slurmctld that still has the old Gres= (INVAL), and so the DRAIN survives the slurmctld restart.
        self.p.daemons.stop_slurmd(node)
        self.p.daemons.restart_slurmctld()
        self.p.daemons.start_slurmd(node)
        self.p.slurm.drain(node, reason)
        done = f"stopped slurmd on {node}, restarted slurmctld, started slurmd on {node}"
        if settings.reconfigure_after_restart:
            self.p.slurm.reconfigure()  # the other slurmd read the new slurm.conf too
            done += ", scontrol reconfigure"
        return done

    def _verify(self, node: str, layout: NodeLayout, expected_gres: str, deadline: float,  # noqa: PLR0917
                settings: WorkflowSettings, restarted_at: float | None) -> str:
        while True:
            problems = layout_matches(self.p.agent.report(node), layout)
            status = self.p.slurm.node_status(node)
            slurm_problem = gres_mismatch(expected_gres, status, restarted_at)
            if slurm_problem:
                problems.append(slurm_problem)
            if not problems:
                return f"agent reports the layout; Slurm shows Gres={status.gres}"
            now = self.p.clock.now()
            if now >= deadline:
                raise WorkflowError("verification failed: " + "; ".join(problems))
            self.p.clock.sleep(min(settings.poll_interval_s, max(deadline - now, 0.0)))

    def _restore(self, node: str, original: Mapping[str, Any]) -> str:
        if original.get("drained"):
            reason = original.get("reason") or "drained before the MIG change"
            self.p.slurm.drain(node, str(reason))
            return f"{node} stays drained (it was before): {reason}"
        self.p.slurm.resume(node)
        return f"{node} resumed"

    # -- reading ----------------------------------------------------------------------------------------------
    def result(self, workflow_id: int) -> WorkflowResult:
        wf = self.p.journal.get(workflow_id)
        steps = self._steps(wf)
        ordered = sorted(steps.items(), key=lambda kv: kv[1].id)
        outcome = {RecordState.APPLIED: Outcome.APPLIED, RecordState.ABORTED: Outcome.ABORTED}.get(
            wf.state, Outcome.FAILED)
        if wf.state.is_open:
            outcome = Outcome.FAILED
        return WorkflowResult(
            workflow_id=wf.id, node=str(wf.params.get("node")), outcome=outcome,
            message=wf.message or ("open" if wf.state.is_open else ""),
            steps=tuple((s.value, r.state.value, r.message) for s, r in ordered),
        )


def _restarted(steps: Mapping[Step, Record], step: Step, settings: WorkflowSettings) -> float | None:
    """When the restart step began (its slurmd must have started since), or None without a slurmd restart."""
    r = steps.get(step)
    if settings.apply_mode != "restart" or r is None or "started_at" not in r.params:
        return None
    return float(r.params["started_at"])


def requested_gpus(layout: NodeLayout) -> Sequence[int]:
    return [i for i, _ in layout.gpus]
