"""``mig apply`` as a journaled workflow: the loop that runs the step machine (:mod:`slurm_elastic.mig.steps`)
through the ports (:mod:`slurm_elastic.mig.ports`), recording each step in the journal before it acts.

Why ``restart_slurm`` restarts slurmctld and the node's slurmd instead of ``scontrol reconfigure``: measured on
Slurm 22.05.8 (docs/mig.md, "What Slurm 22.05 needs"). The order (stop slurmd, restart slurmctld, start slurmd)
keeps the node's DRAIN across the restart; restarting slurmctld while the node was INVAL lost it.

The module does no I/O itself: every side effect goes through :class:`~slurm_elastic.mig.ports.WorkflowPorts`;
the adapters live in :mod:`slurm_elastic.mig.adapters`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from slurm_elastic.mig.diff import diff_node
from slurm_elastic.mig.errors import MigError, WorkflowError
from slurm_elastic.mig.gres_edit import GresEdit, node_config_for, plan_gres_edit
from slurm_elastic.mig.model import NodeLayout
from slurm_elastic.mig.ports import WorkflowPorts, WorkflowResult, WorkflowSettings
from slurm_elastic.mig.slurmconf import set_node_gres, set_node_gres_lines
from slurm_elastic.mig.steps import (
    Finish,
    MigStepOutcome,
    Record,
    RecordState,
    RunStep,
    Step,
    hold_reason,
    next_move,
    one_line,
    stopped_step,
)
from slurm_elastic.mig.verify import gres_mismatch, layout_matches
from slurm_elastic.mig.wire import node_layout_from_obj, node_layout_to_obj

log = logging.getLogger("slurm_elastic.mig.workflow")

WORKFLOW_KIND = "mig_workflow"
STEP_KIND = "mig_step"


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
        if stopped_step(steps) is not None:
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
        if move.outcome is MigStepOutcome.APPLIED:
            return self.p.journal.finish(wf.id, move.message)
        if move.outcome is MigStepOutcome.ABORTED:
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
        outcome = {RecordState.APPLIED: MigStepOutcome.APPLIED, RecordState.ABORTED: MigStepOutcome.ABORTED}.get(
            wf.state, MigStepOutcome.FAILED)
        if wf.state.is_open:
            outcome = MigStepOutcome.FAILED
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
