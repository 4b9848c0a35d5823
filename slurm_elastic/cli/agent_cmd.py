"""``slurm-elastic agent``: the per-node GPU telemetry agent (one per GPU node, under systemd)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import click

from slurm_elastic.agent.auth import (
    AUTH_KINDS,
    MetricsAccess,
    RequestVerifier,
    Verifier,
    generate_key_file,
    load_key,
    load_token,
)
from slurm_elastic.agent.config import AgentConfig, describe, load_config
from slurm_elastic.agent.errors import NvmlUnavailableError
from slurm_elastic.agent.mig_service import MigService, NvmlDevices, nvml_mig_service
from slurm_elastic.agent.mps import MpsReader
from slurm_elastic.agent.munge import Munge
from slurm_elastic.agent.munge_auth import MungeRequestVerifier, resolve_uid
from slurm_elastic.agent.payload import NodeReport, to_dict
from slurm_elastic.agent.procfs import GpuMapReader, ProcJobResolver
from slurm_elastic.agent.reader import NvmlGpuReader
from slurm_elastic.agent.sampler import Sampler
from slurm_elastic.agent.server import AgentApp, serve
from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.mig.catalog import load_catalog

log = logging.getLogger("slurm_elastic.agent")


def _fail(message: str) -> None:
    click.echo(f"slurm-elastic agent: error: {message}", err=True)
    sys.exit(1)


def build_sampler(config: AgentConfig) -> Sampler:
    mps = MpsReader(config.mps_dir, config.node, config.mps_control)
    return Sampler(
        node=config.node,
        reader=NvmlGpuReader(),
        resolver=ProcJobResolver(config.proc_root),
        gpu_map=GpuMapReader(config.gpu_map_dir, config.node),
        interval_s=config.interval_s,
        window_s=config.window_s,
        nvml_timeout_s=config.nvml_timeout_s,
        degraded_ok=config.on_nvml_missing == "degraded",
        mps=mps,
    )


def _mig_service(config: AgentConfig, sampler: Sampler) -> tuple[MigService | None, NvmlDevices | None]:
    """The MIG endpoints' service, unless the agent runs without NVML (degraded)."""
    if sampler.latest_nvml_status() == "degraded":
        return None, None
    try:
        catalog = load_catalog(os.environ.get("SLURM_ELASTIC_MIG_CATALOG") or None)
    except SlurmElasticError as exc:
        _fail(f"MIG catalog: {exc}")
        raise
    return nvml_mig_service(config.node, catalog, mig_minors_file=config.mig_minors_file,
                            allow_apply=config.mig_apply)


def _fmt(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.0f}{unit}"


def format_report(r: NodeReport) -> str:
    """A short human summary of one report (``--once`` without ``--json``)."""
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(r.sampled_at)) if r.sampled_at else "-"
    lines = [f"node {r.node}  nvml {r.nvml.status}"
             + (f" (driver {r.nvml.driver_version})" if r.nvml.driver_version else "")
             + (f": {r.nvml.message}" if r.nvml.message and r.nvml.status != "ok" else "") + f"  sampled {when}"]
    lines.append(f"{'DEVICE':<8} {'UTIL':>5} {'MEM(MiB)':>15} {'JOB':>8} {'USER':<10} {'PROCS':>5}  NAME")
    for g in r.gpus:
        mem = f"{_fmt(g.memory_used_mib)}/{_fmt(g.memory_total_mib)}"
        lines.append(f"{g.id:<8} {_fmt(g.utilization_percent, '%'):>5} {mem:>15} {_fmt(g.job_id):>8} "
                     f"{(g.user or '-'):<10} {len(g.processes):>5}  {g.name or g.error or '-'}"
                     + (f" [{g.profile}]" if g.profile else "")
                     + (f" (utilization: {g.utilization_reason})" if g.utilization_percent is None else ""))
    if r.jobs:
        lines.append(f"{'JOB':>8} {'USER':<10} {'ALLOC':>5} {'IN USE':>6} {'UTIL':>5} {'MEM(MiB)':>9}")
        for j in r.jobs:
            lines.append(f"{j.job_id:>8} {(j.user or '-'):<10} {j.gpus_allocated:>5} {j.gpus_in_use:>6} "
                         f"{_fmt(j.util_last_percent, '%'):>5} {j.memory_used_mib:>9}"
                         + (f" (utilization: {j.utilization_reason})" if j.util_last_percent is None else ""))
    lines += [f"error: {e.code}: {e.message}" for e in r.errors]
    return "\n".join(lines)


def build_verifier(config: AgentConfig) -> Verifier:
    """The check of the controller's requests that ``auth`` names. With MUNGE, one credential is made at start-up
    so that a munged that does not answer stops the agent here, not every request later."""
    if config.auth == "munge":
        munge = Munge(str(config.munge_socket))
        munge.encode(b"slurm-elastic agent start-up", 1)
        uid = resolve_uid(config.munge_controller_user, "munge_controller_user")
        log.info("requests authenticated with MUNGE (%s); controller uid %d", config.munge_socket, uid)
        return MungeRequestVerifier(munge, uid, max_ttl_s=config.munge_max_ttl_s,
                                    max_skew_s=config.max_clock_skew_s)
    return RequestVerifier(load_key(config.key_file), config.max_clock_skew_s)


@click.command("agent", epilog="Configuration keys (TOML, 'version = 1'):\n\n" + describe().replace("\n", "\n\n"))
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="TOML configuration file.")
@click.option("--node", help="Slurm node name of this host [default: short hostname].")
@click.option("--listen", help="Address to listen on.")
@click.option("--port", type=int, help="TCP port.")
@click.option("--interval", "interval_s", type=float, help="Seconds between samples.")
@click.option("--window", "window_s", type=float, help="Seconds of samples behind per-job statistics.")
@click.option("--key-file", type=click.Path(path_type=Path), help="Shared key (mode 0600).")
@click.option("--gpu-map-dir", type=click.Path(path_type=Path), help="Prolog map directory.")
@click.option("--proc-root", type=click.Path(path_type=Path), help="procfs mount.")
@click.option("--nvml-timeout", "nvml_timeout_s", type=float, help="Longest wait for one NVML sample, seconds.")
@click.option("--on-nvml-missing", type=click.Choice(["fail", "degraded"]),
              help="Without NVML: exit (fail) or report no GPUs (degraded).")
@click.option("--metrics-listen", help="Address of the /metrics listener (default 127.0.0.1: this host only).")
@click.option("--metrics-port", type=int, help="TCP port of /metrics; 0 disables it.")
@click.option("--metrics-token-file", type=click.Path(path_type=Path),
              help="Bearer token (mode 0600) that gets the per-job series from /metrics.")
@click.option("--metrics-anonymous", type=click.Choice(["reduced", "none", "all"]),
              help="/metrics without a token: series without job/user/account labels, 401, or every series.")
@click.option("--max-clock-skew", "max_clock_skew_s", type=float, help="Accepted request timestamp skew, seconds.")
@click.option("--auth", type=click.Choice(list(AUTH_KINDS)), help="Request authentication: shared key or MUNGE.")
@click.option("--munge-socket", type=click.Path(path_type=Path), help="munged's socket (--auth munge).")
@click.option("--munge-controller-user", help="User (name or uid) the controller runs as (--auth munge).")
@click.option("--mig-apply/--no-mig-apply", default=None, help="Serve POST /v1/mig/apply (signed).")
@click.option("--mps-dir", type=click.Path(path_type=Path), help="The prolog's MPS directory (SLURM_ELASTIC_MPS_DIR).")
@click.option("--mps-control", help="nvidia-cuda-mps-control to query MPS daemons with.")
@click.option("--once", is_flag=True, help="Take one sample, print it and exit (no server, no key needed).")
@click.option("--json", "as_json", is_flag=True, help="With --once: print the JSON payload.")
@click.option("--generate-key", type=click.Path(path_type=Path, dir_okay=False),
              help="Write a new random key (or metrics token) file (mode 0600) and exit.")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def agent_cmd(config_path: Path | None, once: bool, as_json: bool, generate_key: Path | None, verbose: int,
              **flags: Any) -> None:
    """Per-node GPU telemetry agent: samples NVML, maps GPUs and processes to Slurm jobs, and serves signed
    JSON on /v1/node and Prometheus metrics on /metrics (own listener, 127.0.0.1 unless opened)."""
    logging.basicConfig(level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if generate_key is not None:
        try:
            generate_key_file(generate_key)
        except OSError as exc:
            _fail(f"cannot write key file {generate_key}: {exc.strerror}")
        click.echo(str(generate_key))
        return
    if as_json and not once:
        raise click.UsageError("--json needs --once")
    try:
        config = load_config(config_path, flags, socket.gethostname().split(".")[0])
        verifier = None if once else build_verifier(config)
        token = None if once or config.metrics_token_file is None else load_token(config.metrics_token_file)
        sampler = build_sampler(config)
        sampler.start()
    except NvmlUnavailableError as exc:
        _fail(f"NVML unavailable ({exc.reason}): {exc} (run with --on-nvml-missing degraded to report no GPUs)")
        return
    except SlurmElasticError as exc:
        _fail(str(exc))
        return
    try:
        if verifier is None:  # --once
            report = sampler.sample_once()
            click.echo(json.dumps(to_dict(report), indent=2) if as_json else format_report(report))
            return
        mig, mig_devices = _mig_service(config, sampler)
        app = AgentApp(sampler, verifier, metrics_access=MetricsAccess(token, config.metrics_anonymous), mig=mig)
        metrics = (config.metrics_listen, config.metrics_port) if config.metrics_port else None
        try:
            asyncio.run(serve(app, config.listen, config.port, metrics=metrics))
        except OSError as exc:
            _fail(f"cannot listen on {config.listen}:{config.port}: {exc.strerror or exc}")
        finally:
            if mig_devices is not None:
                mig_devices.close()
    finally:
        sampler.close()
