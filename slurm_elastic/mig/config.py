"""Configuration of the MIG workflow (``/etc/slurm-elastic/mig.toml``; ``--config`` or ``SLURM_ELASTIC_MIG_CONFIG``).

Where Slurm's files live, how the node's daemons are restarted, how agents are reached, the timeouts and the
state DB are site facts, so they are configuration, never code. The file must say ``version = 1``; unknown keys,
wrong types and out-of-range values are errors naming the key. Nothing in it is evaluated; command templates
are argument lists in which only ``{node}`` is replaced. Example (the test cluster's values are in
docs/mig.md)::

    version = 1
    [mig]
    slurm_conf = "/etc/slurm/slurm.conf"      # default: $SLURM_CONF, else /etc/slurm/slurm.conf
    gres_conf = "/etc/slurm/gres.conf"        # default: gres.conf beside slurm_conf
    device_files = "nvidia-caps"              # or a template: "/dev/shim/{node}/gpu{ordinal}"
    mps_per_gpu = 100                         # gres/mps per whole GPU (0: none)
    db_url = "sqlite:////var/lib/slurm-elastic/state.db"
    [mig.commands]
    slurmd_stop = ["ssh", "{node}", "systemctl", "stop", "slurmd"]
    slurmd_start = ["ssh", "{node}", "systemctl", "start", "slurmd"]
    slurmctld_restart = ["systemctl", "restart", "slurmctld"]
    [agents]
    key_file = "/etc/slurm-elastic/agent.key"
    url_template = "http://{node}:9817"
"""

from __future__ import annotations

import os
import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_elastic.errors import ConfigError
from slurm_elastic.mig.workflow import WorkflowSettings

CONFIG_VERSION = 1
DEFAULT_CONFIG_PATH = Path("/etc/slurm-elastic/mig.toml")
CONFIG_ENV = "SLURM_ELASTIC_MIG_CONFIG"

# key: (type(s), doc, bounds)
_MIG_KEYS: dict[str, tuple[type | tuple[type, ...], str, tuple[float, float] | None]] = {
    "slurm_conf": (str, "slurm.conf whose NodeName= Gres= the workflow rewrites", None),
    "gres_conf": (str, "gres.conf whose gpu/mps lines the workflow rewrites per node", None),
    "device_files": (str, "'nvidia-caps' (real MIG nodes) or a device file template with {node} {gpu} "
                          "{ordinal} {gi} {ci}", None),
    "mps_per_gpu": (int, "gres/mps count per whole GPU written with the GPU lines (0: none)", (0, 100000)),
    "autodetect_off": (bool, "write 'NodeName=<node> AutoDetect=off' first (sites with AutoDetect=nvml)", None),
    "whole_gpu_type": (str, "Slurm type of whole GPUs whose model has none in the catalog", None),
    "apply_mode": (str, "'restart' (slurmd + slurmctld, measured necessary on 22.05) or 'reconfigure'", None),
    "reconfigure_after_restart": (bool, "scontrol reconfigure after the restarts (other slurmd re-read slurm.conf)",
                                  None),
    "wait_timeout_s": ((int, float), "longest wait for the node's jobs to end; then the workflow aborts",
                       (0, 30 * 86400)),
    "verify_timeout_s": ((int, float), "longest wait for the agent and Slurm to show the new layout", (1, 86400)),
    "poll_interval_s": ((int, float), "seconds between checks while waiting", (0.05, 3600)),
    "reason_prefix": (str, "start of the drain reasons the workflow sets", None),
    "auto_apply_idle": (bool, "mig suggest: apply suggestions to idle nodes automatically (controller)", None),
    "db_url": (str, "state DB holding the journal (SQLAlchemy URL)", None),
    "table_prefix": (str, "table prefix in the state DB", None),
    "lock_dir": (str, "directory of the per-node lock files (one workflow process per node on this host)", None),
}
_COMMAND_KEYS = ("slurmd_stop", "slurmd_start", "slurmctld_restart")
_AGENT_KEYS: dict[str, tuple[type | tuple[type, ...], str, tuple[float, float] | None]] = {
    "key_file": (str, "shared key of the agents (mode 0600)", None),
    "url_template": (str, "agent URL; {node} is replaced", None),
    "timeout_s": ((int, float), "timeout of one agent read", (0.1, 3600)),
    "apply_timeout_s": ((int, float), "timeout of one MIG apply on an agent", (1, 7200)),
    "urls": (dict, "per-node agent URLs that override url_template", None),
}


@dataclass(frozen=True)
class Commands:
    slurmd_stop: tuple[str, ...] = ("ssh", "{node}", "systemctl", "stop", "slurmd")
    slurmd_start: tuple[str, ...] = ("ssh", "{node}", "systemctl", "start", "slurmd")
    slurmctld_restart: tuple[str, ...] = ("systemctl", "restart", "slurmctld")
    timeout_s: float = 120.0


@dataclass(frozen=True)
class AgentAccess:
    key_file: Path = Path("/etc/slurm-elastic/agent.key")
    url_template: str = "http://{node}:9817"
    timeout_s: float = 10.0
    apply_timeout_s: float = 600.0
    urls: Mapping[str, str] = field(default_factory=dict)

    def url_for(self, node: str) -> str:
        return self.urls.get(node) or self.url_template.replace("{node}", node)


@dataclass(frozen=True)
class MigConfig:
    settings: WorkflowSettings
    commands: Commands = field(default_factory=Commands)
    agents: AgentAccess = field(default_factory=AgentAccess)
    auto_apply_idle: bool = False
    db_url: str = "sqlite:////var/lib/slurm-elastic/state.db"
    table_prefix: str = ""
    lock_dir: Path = Path("/run/slurm-elastic/mig-locks")
    source: str = "<defaults>"


def _default_slurm_conf(env: Mapping[str, str]) -> str:
    return env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"


def _check(table: Any, spec: Mapping[str, tuple[type | tuple[type, ...], str, tuple[float, float] | None]],
           where: str, problems: list[str]) -> dict[str, Any]:
    if not isinstance(table, dict):
        problems.append(f"{where}: must be a table")
        return {}
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in spec:
            problems.append(f"{where}.{key}: unknown key (known: {', '.join(sorted(spec))})")
            continue
        types, _, bounds = spec[key]
        if isinstance(value, bool) and types is not bool:
            problems.append(f"{where}.{key}: expected {getattr(types, '__name__', 'a number')}, got a boolean")
            continue
        if not isinstance(value, types):
            problems.append(f"{where}.{key}: wrong type {type(value).__name__}")
            continue
        if bounds is not None and isinstance(value, int | float) and not bounds[0] <= value <= bounds[1]:
            problems.append(f"{where}.{key}: {value} out of range {bounds[0]:g}..{bounds[1]:g}")
            continue
        out[key] = value
    return out


def _argv(value: Any, where: str, problems: list[str]) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        problems.append(f"{where}: must be a non-empty list of strings (an argument list; no shell)")
        return None
    for v in value:
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(v) if f is not None}
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            return None
        if fields - {"node"}:
            problems.append(f"{where}: only {{node}} may be used, not {sorted(fields - {'node'})}")
            return None
    return tuple(value)


def parse_mig_config(text: str, source: str = "<string>", env: Mapping[str, str] | None = None) -> MigConfig:
    environ = os.environ if env is None else env
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from exc
    problems: list[str] = []
    version = data.pop("version", None)
    if version != CONFIG_VERSION:
        problems.append(f"version: must be {CONFIG_VERSION} (got {version!r})")
    for key in data:
        if key not in ("mig", "agents"):
            problems.append(f"{key}: unknown section (known: agents, mig)")
    mig_raw = dict(data.get("mig", {})) if isinstance(data.get("mig", {}), dict) else {}
    commands_raw = mig_raw.pop("commands", {})
    mig = _check(mig_raw, _MIG_KEYS, "mig", problems)
    commands: dict[str, Any] = {}
    if not isinstance(commands_raw, dict):
        problems.append("mig.commands: must be a table")
        commands_raw = {}
    for key, value in commands_raw.items():
        if key == "timeout_s":
            if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= 3600:
                problems.append("mig.commands.timeout_s: must be a number within 1..3600")
            else:
                commands[key] = float(value)
        elif key in _COMMAND_KEYS:
            argv = _argv(value, f"mig.commands.{key}", problems)
            if argv is not None:
                commands[key] = argv
        else:
            problems.append(f"mig.commands.{key}: unknown key (known: {', '.join((*_COMMAND_KEYS, 'timeout_s'))})")
    agents = _check(data.get("agents", {}), _AGENT_KEYS, "agents", problems)
    for node, url in dict(agents.get("urls", {})).items():
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            problems.append(f"agents.urls.{node}: must be an http(s) URL")
    if mig.get("apply_mode", "restart") not in ("restart", "reconfigure"):
        problems.append("mig.apply_mode: must be 'restart' or 'reconfigure'")
    device_files = mig.get("device_files", "nvidia-caps")
    if device_files != "nvidia-caps" and not device_files.startswith("/"):
        problems.append("mig.device_files: 'nvidia-caps' or an absolute path template")
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))
    slurm_conf = mig.get("slurm_conf") or _default_slurm_conf(environ)
    settings = WorkflowSettings(
        slurm_conf=slurm_conf,
        gres_conf=mig.get("gres_conf") or str(Path(slurm_conf).with_name("gres.conf")),
        device_files=device_files,
        mps_per_gpu=int(mig.get("mps_per_gpu", 0)),
        autodetect_off=bool(mig.get("autodetect_off", False)),
        whole_gpu_type=mig.get("whole_gpu_type") or None,
        wait_timeout_s=float(mig.get("wait_timeout_s", 3600.0)),
        verify_timeout_s=float(mig.get("verify_timeout_s", 120.0)),
        poll_interval_s=float(mig.get("poll_interval_s", 5.0)),
        apply_mode=str(mig.get("apply_mode", "restart")),
        reconfigure_after_restart=bool(mig.get("reconfigure_after_restart", True)),
        reason_prefix=str(mig.get("reason_prefix", "slurm-elastic mig")),
    )
    return MigConfig(
        settings=settings,
        commands=Commands(**commands),
        agents=AgentAccess(
            key_file=Path(agents.get("key_file", AgentAccess.key_file)),
            url_template=str(agents.get("url_template", AgentAccess.url_template)),
            timeout_s=float(agents.get("timeout_s", 10.0)),
            apply_timeout_s=float(agents.get("apply_timeout_s", 600.0)),
            urls=dict(agents.get("urls", {})),
        ),
        auto_apply_idle=bool(mig.get("auto_apply_idle", False)),
        db_url=str(mig.get("db_url", MigConfig.db_url)),
        table_prefix=str(mig.get("table_prefix", "")),
        lock_dir=Path(mig.get("lock_dir", MigConfig.lock_dir)),
        source=source,
    )


def load_mig_config(path: Path | None, env: Mapping[str, str] | None = None) -> MigConfig:
    """The file at ``path`` (or ``$SLURM_ELASTIC_MIG_CONFIG``, or the default path if it exists), else defaults."""
    environ = os.environ if env is None else env
    chosen = path or (Path(environ[CONFIG_ENV]) if environ.get(CONFIG_ENV) else None)
    if chosen is None and DEFAULT_CONFIG_PATH.exists():
        chosen = DEFAULT_CONFIG_PATH
    if chosen is None:
        return parse_mig_config("version = 1\n", "<defaults>", environ)
    try:
        text = chosen.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{chosen}: cannot read: {exc.strerror or exc}") from exc
    return parse_mig_config(text, str(chosen), environ)


def describe() -> str:
    """One line per key, for the docs and ``--help``."""
    lines = [f"[mig] {k}: {doc}" for k, (_, doc, _) in _MIG_KEYS.items()]
    lines += [f"[mig.commands] {k}: argument list, {{node}} replaced" for k in _COMMAND_KEYS]
    lines += ["[mig.commands] timeout_s: timeout of each command"]
    lines += [f"[agents] {k}: {doc}" for k, (_, doc, _) in _AGENT_KEYS.items()]
    return "\n".join(lines)
