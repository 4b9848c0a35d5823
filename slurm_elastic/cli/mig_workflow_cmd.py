"""``slurm-elastic mig plan|apply|resume-workflows|workflows|suggest``: MIG changes on live nodes.

``plan`` changes nothing. ``apply`` runs the journaled workflow (:mod:`slurm_elastic.mig.workflow`); a workflow
left open by a process that died is finished first, on that node, or by ``resume-workflows``. Settings come
from ``--config`` / ``SLURM_ELASTIC_MIG_CONFIG`` (:mod:`slurm_elastic.mig.config`).

Exit status: 0 done (``apply``: layout applied), 1 failed or aborted (the node is left drained with a reason
that names the failed step, unless the workflow could put it back as it was), 2 usage.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from slurm_elastic.agent.mig_remote import HttpAgent, load_agent_auth
from slurm_elastic.cli.mig_cmd import fail, mig_cmd
from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.mig.adapters import (
    FAULT_ENV,
    CliSlurm,
    CommandDaemons,
    FileNodeLock,
    LocalFiles,
    MigStoreJournal,
    SystemClock,
    fault_hook,
    node_address,
)
from slurm_elastic.mig.config import MigConfig, load_mig_config
from slurm_elastic.mig.errors import LayoutError
from slurm_elastic.mig.model import Layout, NodeLayout
from slurm_elastic.mig.parted import node_layout_from_specs, parse_parted_config
from slurm_elastic.mig.plan import plan_node_change
from slurm_elastic.mig.ports import WorkflowPorts, WorkflowResult
from slurm_elastic.mig.steps import MigStepOutcome
from slurm_elastic.mig.suggest import GpuNodeView, PendingRequest, SuggestResult, suggest
from slurm_elastic.mig.validate import parse_layout
from slurm_elastic.mig.wire import MigWireError, NodeMigReport, layout_to_obj, node_layout_from_obj
from slurm_elastic.mig.workflow import MigWorkflow
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.store import SqlStore

config_option = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
    help="MIG workflow settings (TOML; env SLURM_ELASTIC_MIG_CONFIG, default /etc/slurm-elastic/mig.toml).")


def _config(ctx: click.Context, path: Path | None) -> MigConfig:
    try:
        return load_mig_config(path)
    except SlurmElasticError as exc:
        fail(ctx, str(exc))


@dataclass
class _Env:
    cfg: MigConfig
    workflow: MigWorkflow
    journal: Any
    ports: WorkflowPorts


@contextmanager
def _environment(ctx: click.Context, cfg: MigConfig, quiet: bool = False, *, journal: bool = True) -> Iterator[_Env]:
    """The workflow and its ports. ``journal=False`` (plan, suggest): no state DB is opened; nothing is written."""
    store: SqlStore | None = None
    try:
        key = load_agent_auth(cfg.agents, str(cfg.source))
        if journal:
            store = SqlStore.open(cfg.db_url, table_prefix=cfg.table_prefix)
    except SlurmElasticError as exc:
        fail(ctx, str(exc))
    try:
        jnl: Any = MigStoreJournal(store.journal) if store is not None else _NoJournal()
        ports = WorkflowPorts(
            journal=jnl,
            slurm=CliSlurm(),
            agent=HttpAgent(cfg.agents, key, address_of=node_address),
            files=LocalFiles(),
            daemons=CommandDaemons(cfg.commands),
            clock=SystemClock(),
            fault=fault_hook(os.environ.get(FAULT_ENV)),
            say=(lambda line: None) if quiet else (lambda line: click.echo(line, err=True)),
            lock=FileNodeLock(cfg.lock_dir),
        )
        yield _Env(cfg, MigWorkflow(ports, cfg.settings), jnl, ports)
    finally:
        if store is not None:
            store.close()


class _NoJournal:
    """For the read-only verbs: any attempt to journal is a bug."""

    def __getattr__(self, name: str) -> Any:
        raise SlurmElasticError(f"read-only command: the journal ({name}) is not available")


def _node_layout(ctx: click.Context, text: str | None, gpus: str | None, report: NodeMigReport, *,
                 parted: Path | None, parted_config: str | None) -> NodeLayout:
    """``--layout`` (one layout for --gpus, default every MIG-capable GPU; or per GPU {"0": ..., "1": "off"};
    or ``off``), or ``--parted FILE --parted-config NAME`` (a mig-parted config, matched on this node's GPUs)."""
    if parted is not None:
        if text is not None or not parted_config:
            raise click.UsageError("--parted needs --parted-config and excludes --layout", ctx)
        try:
            config = parse_parted_config(parted.read_text(encoding="utf-8"), str(parted))
            return node_layout_from_specs(config.get(parted_config),
                                          [(g.index, g.pci_device_id) for g in report.gpus if g.mig_capable],
                                          parted_config)
        except OSError as exc:
            fail(ctx, f"cannot read {parted}: {exc.strerror or exc}")
        except SlurmElasticError as exc:
            fail(ctx, str(exc))
    if text is None:
        raise click.UsageError("give --layout (or --parted with --parted-config)", ctx)
    if text.strip() == "off":
        raw: object = "off"
    else:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not valid JSON: {exc.msg} at column {exc.colno}", ctx,
                                     param_hint="--layout") from None
    if isinstance(raw, dict) and raw and all(isinstance(k, str) and k.isdigit() for k in raw):
        if gpus:
            raise click.UsageError("--gpus goes with a single layout, not a per-GPU one", ctx)
        try:
            return node_layout_from_obj(raw)
        except MigWireError as exc:
            fail(ctx, str(exc))
    if raw == "off":
        layout = Layout.disabled()
    elif isinstance(raw, dict):
        try:
            layout = parse_layout(raw)
        except LayoutError as exc:
            fail(ctx, str(exc))
    else:
        raise click.BadParameter('expected {"3g.40gb": 2}, {"0": {...}, "1": "off"} or off', ctx,
                                 param_hint="--layout")
    if gpus:
        try:
            indexes = sorted({int(x) for x in gpus.split(",") if x.strip()})
        except ValueError:
            raise click.BadParameter("expected GPU indexes such as 0,1", ctx, param_hint="--gpus") from None
    else:
        indexes = [g.index for g in report.gpus if g.mig_capable]
    if not indexes:
        fail(ctx, f"{report.node} has no MIG-capable GPU")
    return NodeLayout.of({i: layout for i in indexes})


_layout_options = [
    click.option("--layout", "layout_text", metavar="JSON|off",
                 help='One layout for the GPUs of --gpus (default: every MIG-capable GPU), e.g. \'{"3g.40gb": 2}\'; '
                      'a per-GPU object \'{"0": {"1g.10gb": 7}, "1": "off"}\'; or off.'),
    click.option("--gpus", metavar="0,1", help="GPU indexes for a single --layout."),
    click.option("--parted", type=click.Path(dir_okay=False, path_type=Path),
                 help="Take the layout from a mig-parted config file instead."),
    click.option("--parted-config", metavar="NAME", help="The mig-config of --parted to use."),
]


def _with_layout_options(fn: Any) -> Any:
    for opt in reversed(_layout_options):
        fn = opt(fn)
    return fn


@mig_cmd.command("plan")
@click.argument("node")
@_with_layout_options
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def plan_cmd(ctx: click.Context, *, node: str, layout_text: str | None, gpus: str | None, parted: Path | None,
             parted_config: str | None, config_path: Path | None, as_json: bool) -> None:
    """Show what `mig apply` would change on NODE: GPU instances, Slurm GRES, jobs it waits for. Changes nothing."""
    cfg = _config(ctx, config_path)
    with _environment(ctx, cfg, quiet=True, journal=False) as env:
        try:
            report = env.ports.agent.report(node)
            requested = _node_layout(ctx, layout_text, gpus, report, parted=parted, parted_config=parted_config)
            plan = plan_node_change(
                node, report, requested, cfg.settings,
                status=env.ports.slurm.node_status(node), jobs=env.ports.slurm.jobs_on(node),
                slurm_text=env.ports.files.read(cfg.settings.slurm_conf),
                gres_text=env.ports.files.read(cfg.settings.gres_conf),
            )
        except SlurmElasticError as exc:
            fail(ctx, str(exc))
    if as_json:
        click.echo(json.dumps({
            "node": node,
            "layout": {str(i): layout_to_obj(lay) for i, lay in requested.gpus},
            "changes": [line for d in plan.diffs for line in d.describe()],
            "gres_now": plan.conf_gres_now, "slurm_gres_now": plan.slurm_gres_now, "gres_after": plan.gres_after,
            "gres_lines_now": list(plan.lines_now), "gres_lines_after": list(plan.lines_after),
            "gres_lines_provisional": plan.lines_provisional,
            "jobs": [{"job_id": j.job_id, "user": j.user, "state": j.state} for j in plan.jobs],
            "notes": list(plan.notes),
        }, indent=2))
        return
    for line in plan.describe():
        click.echo(line)


def _print_result(r: WorkflowResult, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"workflow": r.workflow_id, "node": r.node, "outcome": r.outcome.value,
                               "message": r.message,
                               "steps": [{"step": s, "state": st, "message": m} for s, st, m in r.steps]}, indent=2))
        return
    click.echo(f"workflow #{r.workflow_id} on {r.node}: {r.outcome.value}: {r.message}")
    for step, state, message in r.steps:
        click.echo(f"  {step:<17} {state:<11} {message}")


@mig_cmd.command("apply")
@click.argument("node")
@_with_layout_options
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
@click.pass_context
def apply_cmd(ctx: click.Context, *, node: str, layout_text: str | None, gpus: str | None, parted: Path | None,
              parted_config: str | None, config_path: Path | None, as_json: bool) -> None:
    """Repartition NODE: drain, wait for its jobs, apply through the agent, write its GRES, restart Slurm's
    daemons as 22.05 needs, verify, resume. Every step is journaled; see `mig resume-workflows`."""
    cfg = _config(ctx, config_path)
    with _environment(ctx, cfg, quiet=as_json) as env:
        try:
            report = env.ports.agent.report(node)
            requested = _node_layout(ctx, layout_text, gpus, report, parted=parted, parted_config=parted_config)
            result = env.workflow.start(node, requested)
        except SlurmElasticError as exc:
            fail(ctx, str(exc))
    _print_result(result, as_json)
    if result.outcome is not MigStepOutcome.APPLIED:
        ctx.exit(1)


@mig_cmd.command("resume-workflows")
@config_option
@click.option("--node", help="Only this node's workflows.")
@click.option("--rollback", is_flag=True, help="Undo open workflows instead of finishing them.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable results.")
@click.pass_context
def resume_cmd(ctx: click.Context, config_path: Path | None, node: str | None, rollback: bool,
               as_json: bool) -> None:
    """Finish (or with --rollback, undo) MIG workflows that a dead process left open."""
    cfg = _config(ctx, config_path)
    with _environment(ctx, cfg, quiet=as_json) as env:
        try:
            results = env.workflow.resume_open(node=node, rollback=rollback)
        except SlurmElasticError as exc:
            fail(ctx, str(exc))
    if not results and not as_json:
        click.echo("no open MIG workflow")
    for r in results:
        _print_result(r, as_json)
    if any(r.outcome is MigStepOutcome.FAILED for r in results):
        ctx.exit(1)


@mig_cmd.command("workflows")
@config_option
@click.option("--limit", default=10, show_default=True, help="How many of the newest workflows.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def workflows_cmd(ctx: click.Context, config_path: Path | None, limit: int, as_json: bool) -> None:
    """The newest MIG workflows and their journaled steps."""
    cfg = _config(ctx, config_path)
    try:
        store = SqlStore.open(cfg.db_url, table_prefix=cfg.table_prefix)
    except SlurmElasticError as exc:
        fail(ctx, str(exc))
    try:
        journal = MigStoreJournal(store.journal)
        wf = MigWorkflow(WorkflowPorts(journal, CliSlurm(), _NoAgent(), LocalFiles(), CommandDaemons(cfg.commands),
                                       SystemClock()), cfg.settings)
        results = [wf.result(r.id) for r in journal.workflows(limit)]
    finally:
        store.close()
    for r in results:
        _print_result(r, as_json)


class _NoAgent:
    def report(self, node: str) -> NodeMigReport:
        raise SlurmElasticError("no agent access here")

    def apply(self, node: str, layout: NodeLayout) -> tuple[tuple[str, ...], NodeMigReport]:
        raise SlurmElasticError("no agent access here")


def _suggest_inputs(env: _Env, cli: SlurmCli) -> tuple[list[PendingRequest], list[GpuNodeView], list[str]]:
    jobs = cli.jobs()
    pending = [PendingRequest(j.job_id, g.type, g.count, max(j.node_count, 1))
               for j in jobs if j.is_pending for g in j.gres_per_node if g.name == "gpu"]
    busy = {n for j in jobs if not j.is_pending for n in j.nodes}
    views: list[GpuNodeView] = []
    problems: list[str] = []
    for n in cli.nodes():
        if n.gpus() == 0:
            continue
        free: dict[str, int] = {}
        if n.is_available:
            used = {(g.type or ""): g.count for g in n.gres_used if g.name == "gpu"}
            for g in n.gres:
                if g.name == "gpu":
                    free[g.type or ""] = free.get(g.type or "", 0) + g.count - used.get(g.type or "", 0)
        try:
            report: NodeMigReport | None = env.ports.agent.report(n.name)
        except SlurmElasticError as exc:
            report = None
            problems.append(f"{n.name}: no MIG report ({exc})")
        views.append(GpuNodeView(n.name, n.is_available and n.name not in busy and n.gpus_used() == 0, free, report))
    return pending, views, problems


@mig_cmd.command("suggest")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def suggest_cmd(ctx: click.Context, config_path: Path | None, as_json: bool) -> None:
    """Propose repartitioning idle GPUs for pending jobs that ask for MIG types (or whole GPUs). Changes nothing:
    each suggestion is applied by an administrator with the `mig apply` command it prints."""
    cfg = _config(ctx, config_path)
    with _environment(ctx, cfg, quiet=True, journal=False) as env:
        try:
            pending, views, problems = _suggest_inputs(env, SlurmCli())
        except SlurmElasticError as exc:
            fail(ctx, str(exc))
    result = suggest(pending, views)
    _print_suggestions(result, problems, as_json)


def _print_suggestions(result: SuggestResult, problems: list[str], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({
            "demand": dict(result.demand), "free": dict(result.free),
            "suggestions": [{"node": s.node, "layout": {str(i): layout_to_obj(lay) for i, lay in s.layout.gpus},
                             "reason": s.reason.value, "message": s.message, "covers": dict(s.covers)}
                            for s in result.suggestions],
            "unmet": [{"type": u.gpu_type, "missing": u.missing, "reason": u.reason.value, "message": u.message}
                      for u in result.unmet],
            "problems": problems,
        }, indent=2))
        return
    click.echo("pending GPU requests by type: " + (", ".join(f"{t}={n}" for t, n in result.demand.items()) or "none"))
    click.echo("free in service: " + (", ".join(f"{t}={n}" for t, n in result.free.items()) or "none"))
    for s in result.suggestions:
        layout = json.dumps({str(i): layout_to_obj(lay) for i, lay in s.layout.gpus})
        click.echo(f"{s.node}: {s.reason.value}: {s.message}")
        click.echo(f"  slurm-elastic mig apply {s.node} --layout '{layout}'")
    for u in result.unmet:
        click.echo(f"{u.reason.value}: {u.message}")
    for p in problems:
        click.echo(f"warning: {p}", err=True)
    if not result.suggestions and not result.unmet:
        click.echo("nothing to repartition")
