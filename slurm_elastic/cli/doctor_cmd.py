"""``slurm-elastic doctor``: is this site set up for elastic jobs? One line per check (and per agent): OK, WARN or
FAIL, what was found and, for WARN/FAIL, what to change and where.

Run it on the head node as the controller's user (root), with the controller's config. Slurm's settings come
from ``scontrol show config``. Output: an aligned table, ``-P`` ('|'-separated) or ``--json``.
Exit status: 0 every check OK, 1 warnings (no failure), 2 at least one FAIL (a usage error is 2 as well, with
click's message on stderr and nothing on stdout).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import click

from slurm_elastic import __version__
from slurm_elastic.cli.output import emit, output_options
from slurm_elastic.controller.config import DEFAULT_CONFIG_PATH, ControllerConfig, load_controller_config
from slurm_elastic.doctor import probes
from slurm_elastic.doctor.model import Finding, fail, ok, parse_show_config, value, warn, worst
from slurm_elastic.doctor.site_checks import agents, clock, database, operator
from slurm_elastic.doctor.slurm_checks import slurm_checks
from slurm_elastic.errors import ConfigError, SlurmElasticError
from slurm_elastic.store import CURRENT_SCHEMA_VERSION


def _shipped(sub: str, in_source: str) -> str:
    """Where this installation keeps a file it ships beside the package: ``<prefix>/share/slurm-elastic/SUB`` from
    the wheel (pyproject.toml's data-files), else its place in the source tree."""
    share = Path(sys.prefix) / "share" / "slurm-elastic" / sub
    return str(share) if share.exists() else in_source


def _controller_config(path: Path) -> tuple[ControllerConfig | None, Finding]:
    try:
        cfg = load_controller_config(path)
    except ConfigError as e:
        example = _shipped("etc/controller.toml", "packaging/etc/slurm-elastic/controller.toml")
        return None, fail("controller_config", str(e), f"install -m 0600 {example} {path} and edit it "
                          "(docs/deployment.md, section 6)")
    mode = path.stat().st_mode & 0o7777
    if mode & 0o077 and "@" in cfg.db_url and ":" in cfg.db_url.split("@")[0].split("//")[-1]:
        return cfg, warn("controller_config", f"{path} has mode {mode:04o} and holds the DB password",
                         f"chmod 0600 {path}")
    return cfg, ok("controller_config", f"{path} (mode {mode:04o})")


def _agent_findings(cfg: ControllerConfig, cmd: probes.ProbeCommands, source: str) -> list[Finding]:
    from slurm_elastic.agent.client import client_auth
    from slurm_elastic.slurm.adapter import SlurmCli
    from slurm_elastic.slurm.runner import RetryPolicy, SlurmCommands

    if cfg.metrics_source.kind != "agents":
        return [ok("agents", f"[metrics_source] kind = {cfg.metrics_source.kind!r}: no agents needed")]
    a = cfg.agents
    key_note = f"key_file {a.key_file}" if a.auth == "hmac" else f"munge_agent_user {a.munge_agent_user}"
    try:
        auth = client_auth(a.auth, key_file=a.key_file, munge_socket=a.munge_socket,
                           munge_agent_user=a.munge_agent_user, munge_ttl_s=a.munge_ttl_s, source=source)
    except SlurmElasticError as e:
        mode = ""
        if a.key_file.exists():
            mode = f" (mode {stat.S_IMODE(a.key_file.stat().st_mode):04o})"
        return [fail("agents", f"{e}{mode}", f"{source} [agents]: a key file of mode 0600 "
                     "(slurm-elastic agent --generate-key FILE), the same on every node; or auth = \"munge\"")]
    try:
        nodes = SlurmCli(SlurmCommands(runner=cmd.runner, retry=RetryPolicy(attempts=1))).nodes()
    except SlurmElasticError as e:
        return [fail("agents", f"cannot list Slurm's nodes: {e}", "see the slurm_config check")]
    urls = {n.name: a.url_for(n.name, n.address) for n in nodes if not n.is_powered_off}
    results = probes.agents(urls, auth, a.timeout_s)
    return [*agents(results, auth=a.auth, key_note=key_note, package_version=__version__, source=source),
            clock(results)]


def run_doctor(config_path: Path, cmd: probes.ProbeCommands) -> list[Finding]:
    findings: list[Finding] = []
    rc, out, err = cmd.run(["scontrol", "show", "config"])
    if rc != 0:
        findings.append(fail("slurm_config", f"scontrol show config failed: {(err or out).strip()}",
                             "start slurmctld; SLURM_CONF must name this cluster's slurm.conf"))
        config: dict[str, str] = {}
    else:
        config = parse_show_config(out)
        findings.append(ok("slurm_config", f"Slurm {value(config, 'SLURM_VERSION')}, "
                           f"cluster {value(config, 'ClusterName')}, {value(config, 'SLURM_CONF')}"))
        lua = probes.lua_path(config)
        findings += slurm_checks(
            config, lua_path=lua, lua_text=probes.read_text(lua), package_version=__version__,
            prolog=probes.hook_files(config, "Prolog"), epilog=probes.hook_files(config, "Epilog"),
            sacct_error=cmd.error_of(probes.SACCT_ARGV),
            munge_error=probes.munge_error(os.environ.get("SLURM_ELASTIC_MUNGE_SOCKET",
                                                          "/run/munge/munge.socket.2"))
            if value(config, "AuthType") == "auth/munge" else None,
            plugins_dir=_shipped("plugins", "plugins"))
    cfg, finding = _controller_config(config_path)
    findings.append(finding)
    if cfg is None:
        return findings
    if config:
        findings += operator(config, probes.identity(cmd), cfg.api.slurm_user)
    findings.append(database(probes.database(cfg.db_url, cfg.table_prefix), CURRENT_SCHEMA_VERSION))
    findings += _agent_findings(cfg, cmd, str(config_path))
    return findings


@click.command("doctor")
@click.option("-c", "--config", "config_path", type=click.Path(path_type=Path), default=DEFAULT_CONFIG_PATH,
              show_default=True, help="the controller's TOML config")
@output_options
@click.pass_context
def doctor_cmd(ctx: click.Context, config_path: Path, parsable: bool, as_json: bool, noheader: bool) -> None:
    """Check Slurm and slurm-elastic's setup: each check OK, WARN or FAIL, with what to change and where.

    Exit status: 0 all OK, 1 warnings only, 2 a failure."""
    # The Slurm commands' runner: recorded replies in the unit tests (CliRunner.invoke(..., obj=ProbeCommands(...))).
    cmd = ctx.obj if isinstance(ctx.obj, probes.ProbeCommands) else probes.ProbeCommands()
    findings = run_doctor(config_path, cmd)
    emit(["check", "status", "detail", "fix"], [(f.check, f.status.name, f.detail, f.fix) for f in findings],
         parsable=parsable, as_json=as_json, noheader=noheader, json_rows=[f.to_dict() for f in findings])
    ctx.exit(int(worst(findings)))
