"""Configuration of the MIG workflow (``/etc/slurm-elastic/mig.toml``; ``--config`` or ``SLURM_ELASTIC_MIG_CONFIG``).

Where Slurm's files live, how the node's daemons are restarted, how agents are reached, the timeouts and the
state DB are site facts, so they are configuration, never code. The file must say ``version = 1``; unknown keys
(with a "did you mean"), wrong types and out-of-range values are errors naming the key and its line
(slurm_elastic/configfile.py). ``[agents]`` and ``[store]`` mean the same as in controller.toml. Nothing in it is
evaluated; command templates are argument lists in which only ``{node}`` is replaced. Example (the test
cluster's values are in docs/mig.md)::

    version = 1
    [mig]
    slurm_conf = "/etc/slurm/slurm.conf"      # default: $SLURM_CONF, else /etc/slurm/slurm.conf
    gres_conf = "/etc/slurm/gres.conf"        # default: gres.conf beside slurm_conf
    device_files = "nvidia-caps"              # or a template: "/dev/shim/{node}/gpu{ordinal}"
    mps_per_gpu = 100                         # gres/mps per whole GPU (0: none)
    [mig.commands]
    slurmd_stop = ["ssh", "{node}", "systemctl", "stop", "slurmd"]
    slurmd_start = ["ssh", "{node}", "systemctl", "start", "slurmd"]
    slurmctld_restart = ["systemctl", "restart", "slurmctld"]
    [agents]
    key_file = "/etc/slurm-elastic/agent.key"
    url_template = "http://{address}:9817"   # {node}: the node name, {address}: its NodeAddr
    [store]
    url = "sqlite:////var/lib/slurm-elastic/state.db"   # the journal (the controller's state DB)
"""

from __future__ import annotations

import os
import string
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_elastic import configfile
from slurm_elastic.configfile import (
    AGENT_KEYS,
    STORE_KEYS,
    Key,
    KeyLines,
    Kind,
    Problems,
    agent_values,
    check_sections,
    check_table,
    suggest,
    take_moved,
)
from slurm_elastic.errors import ConfigError
from slurm_elastic.mig.ports import WorkflowSettings

CONFIG_VERSION = 1
DEFAULT_CONFIG_PATH = Path("/etc/slurm-elastic/mig.toml")
CONFIG_ENV = "SLURM_ELASTIC_MIG_CONFIG"

_APPLY_MODES = ("restart", "reconfigure")

MIG_KEYS: dict[str, Key] = {
    "slurm_conf": Key(Kind.STR, None, "slurm.conf whose NodeName= Gres= the workflow rewrites (default: $SLURM_CONF, "
                      "else /etc/slurm/slurm.conf)"),
    "gres_conf": Key(Kind.STR, None, "gres.conf whose gpu/mps lines the workflow rewrites per node (default: beside "
                     "slurm_conf)"),
    "device_files": Key(Kind.STR, "nvidia-caps", "'nvidia-caps' (real MIG nodes) or an absolute device file template "
                        "with {node} {gpu} {ordinal} {gi} {ci}",
                        check=lambda v: None if v == "nvidia-caps" or v.startswith("/")
                        else "'nvidia-caps' or an absolute path template"),
    "mps_per_gpu": Key(Kind.INT, 0, "gres/mps count per whole GPU written with the GPU lines (0: none)", 0, 100000),
    "autodetect_off": Key(Kind.BOOL, False, "write 'NodeName=<node> AutoDetect=off' first (sites with "
                          "AutoDetect=nvml)"),
    "whole_gpu_type": Key(Kind.STR, None, "Slurm type of whole GPUs whose model has none in the catalog"),
    "apply_mode": Key(Kind.STR, "restart", "'restart' (slurmd + slurmctld, measured necessary on 22.05) or "
                      "'reconfigure'", check=lambda v: None if v in _APPLY_MODES else "must be 'restart' or "
                      "'reconfigure'"),
    "reconfigure_after_restart": Key(Kind.BOOL, True, "scontrol reconfigure after the restarts (other slurmd re-read "
                                     "slurm.conf)"),
    "wait_timeout_s": Key(Kind.NUMBER, 3600.0, "longest wait for the node's jobs to end; then the workflow aborts",
                          0, 30 * 86400),
    "verify_timeout_s": Key(Kind.NUMBER, 120.0, "longest wait for the agent and Slurm to show the new layout",
                            1, 86400),
    "poll_interval_s": Key(Kind.NUMBER, 5.0, "seconds between checks while waiting", 0.05, 3600),
    "reason_prefix": Key(Kind.STR, "slurm-elastic mig", "start of the drain reasons the workflow sets"),
    "lock_dir": Key(Kind.STR, "/run/slurm-elastic/mig-locks", "directory of the per-node lock files (one workflow "
                    "process per node on this host)"),
}
_COMMAND_KEYS = ("slurmd_stop", "slurmd_start", "slurmctld_restart")
#: Keys that are gone, with what to do instead (a clearer error than "unknown key").
_REMOVED = {
    "mig.auto_apply_idle": "nothing applies MIG suggestions automatically; remove the line and apply a suggestion "
                           "with `slurm-elastic mig apply` (docs/mig.md)",
}
MIG_AGENT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Commands:
    slurmd_stop: tuple[str, ...] = ("ssh", "{node}", "systemctl", "stop", "slurmd")
    slurmd_start: tuple[str, ...] = ("ssh", "{node}", "systemctl", "start", "slurmd")
    slurmctld_restart: tuple[str, ...] = ("systemctl", "restart", "slurmctld")
    timeout_s: float = 120.0


@dataclass(frozen=True)
class AgentAccess:
    key_file: Path = Path(AGENT_KEYS["key_file"].default)
    auth: str = AGENT_KEYS["auth"].default
    munge_socket: str = AGENT_KEYS["munge_socket"].default
    munge_agent_user: str = AGENT_KEYS["munge_agent_user"].default
    munge_ttl_s: int = AGENT_KEYS["munge_ttl_s"].default
    url_template: str = AGENT_KEYS["url_template"].default
    timeout_s: float = MIG_AGENT_TIMEOUT_S
    apply_timeout_s: float = AGENT_KEYS["apply_timeout_s"].default
    urls: Mapping[str, str] = field(default_factory=dict)

    def url_for(self, node: str, address: str | None = None) -> str:
        """``{address}`` is the node's NodeAddr; Slurm's default NodeAddr is the node name."""
        return self.urls.get(node) or self.url_template.format(node=node, address=address or node)

    @property
    def needs_address(self) -> bool:
        return "{address}" in self.url_template


@dataclass(frozen=True)
class MigConfig:
    settings: WorkflowSettings
    commands: Commands = field(default_factory=Commands)
    agents: AgentAccess = field(default_factory=AgentAccess)
    db_url: str = STORE_KEYS["url"].default
    table_prefix: str = ""
    lock_dir: Path = Path(MIG_KEYS["lock_dir"].default)
    source: str = "<defaults>"


def _default_slurm_conf(env: Mapping[str, str]) -> str:
    return env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"


def _argv(value: Any, where: str, problems: Problems) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        problems.add(where, "must be a non-empty list of strings (an argument list; no shell)")
        return None
    for v in value:
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(v) if f is not None}
        except ValueError as exc:
            problems.add(where, str(exc))
            return None
        if fields - {"node"}:
            problems.add(where, f"only {{node}} may be used, not {sorted(fields - {'node'})}")
            return None
    return tuple(value)


def parse_mig_config(text: str, source: str = "<string>", env: Mapping[str, str] | None = None,
                     warn: Callable[[str], None] | None = None) -> MigConfig:
    """``warn`` gets deprecation warnings (default: logged)."""
    environ = os.environ if env is None else env
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from exc
    problems = Problems(source, KeyLines(text))
    version = data.pop("version", None)
    if version != CONFIG_VERSION:
        problems.add("version", f"must be {CONFIG_VERSION} (got {version!r})")
    check_sections(data, ("mig", "agents", "store"), problems)
    take_moved(data, problems, warn)
    mig_raw = dict(data.get("mig", {})) if isinstance(data.get("mig", {}), dict) else {}
    for path, instead in _REMOVED.items():
        if path.split(".")[1] in mig_raw:
            mig_raw.pop(path.split(".")[1])
            problems.add(path, f"removed: {instead}")
    commands_raw = mig_raw.pop("commands", {})
    mig = check_table(mig_raw, MIG_KEYS, "mig", problems)
    commands: dict[str, Any] = {}
    if not isinstance(commands_raw, dict):
        problems.add("mig.commands", "must be a table")
        commands_raw = {}
    for key, value in commands_raw.items():
        if key == "timeout_s":
            if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= 3600:
                problems.add("mig.commands.timeout_s", "must be a number within 1..3600")
            else:
                commands[key] = float(value)
        elif key in _COMMAND_KEYS:
            argv = _argv(value, f"mig.commands.{key}", problems)
            if argv is not None:
                commands[key] = argv
        else:
            known = (*_COMMAND_KEYS, "timeout_s")
            problems.add(f"mig.commands.{key}", f"unknown key{suggest(key, known)} (known: {', '.join(known)})")
    agents = check_table(data.get("agents", {}), AGENT_KEYS, "agents", problems)
    store = check_table(data.get("store", {}), STORE_KEYS, "store", problems)
    problems.raise_if_any()

    def get(key: str) -> Any:
        return mig.get(key, MIG_KEYS[key].default)

    slurm_conf = mig.get("slurm_conf") or _default_slurm_conf(environ)
    settings = WorkflowSettings(
        slurm_conf=slurm_conf,
        gres_conf=mig.get("gres_conf") or str(Path(slurm_conf).with_name("gres.conf")),
        device_files=get("device_files"),
        mps_per_gpu=int(get("mps_per_gpu")),
        autodetect_off=bool(get("autodetect_off")),
        whole_gpu_type=mig.get("whole_gpu_type") or None,
        wait_timeout_s=float(get("wait_timeout_s")),
        verify_timeout_s=float(get("verify_timeout_s")),
        poll_interval_s=float(get("poll_interval_s")),
        apply_mode=str(get("apply_mode")),
        reconfigure_after_restart=bool(get("reconfigure_after_restart")),
        reason_prefix=str(get("reason_prefix")),
    )
    return MigConfig(
        settings=settings,
        commands=Commands(**commands),
        agents=AgentAccess(**agent_values(agents, MIG_AGENT_TIMEOUT_S),
                           apply_timeout_s=float(agents.get("apply_timeout_s", AgentAccess.apply_timeout_s))),
        db_url=str(store.get("url", MigConfig.db_url)),
        table_prefix=str(store.get("table_prefix", "")),
        lock_dir=Path(get("lock_dir")),
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
    lines = configfile.describe("mig", MIG_KEYS)
    lines += [f"[mig.commands] {k}: argument list, {{node}} replaced" for k in _COMMAND_KEYS]
    lines += ["[mig.commands] timeout_s: timeout of each command"]
    lines += configfile.describe("agents", AGENT_KEYS) + configfile.describe("store", STORE_KEYS)
    return "\n".join(lines)
