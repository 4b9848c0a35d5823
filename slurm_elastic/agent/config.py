"""Agent configuration: packaged defaults with a doc line per key, then an optional TOML file, then flags.

The file must say ``version = 1``; an unknown key, a wrong type or an out-of-range value is a
:class:`ConfigError` naming the key. Nothing from the configuration is ever evaluated. Example::

    version = 1
    node = "gpu017"
    port = 9817
    interval_s = 5.0
    key_file = "/etc/slurm-elastic/agent.key"   # auth = "hmac" (the default)
    # auth = "munge"                       # or the site's MUNGE key instead of key_file:
    # munge_controller_user = "root"
    metrics_listen = "0.0.0.0"            # /metrics for a Prometheus on another host (default 127.0.0.1)
    metrics_token_file = "/etc/slurm-elastic/metrics.token"
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from slurm_elastic.agent.auth import AUTH_KINDS, METRICS_ANONYMOUS
from slurm_elastic.configfile import KeyLines, suggest
from slurm_elastic.errors import ConfigError

CONFIG_VERSION = 1
DEFAULT_PORT = 9817
DEFAULT_METRICS_PORT = 9819
#: Keys that existed once, with what replaced them (a clearer error than "unknown key").
_REPLACED = {"metrics_auth": "metrics_token_file and metrics_anonymous (docs/agent.md, /metrics)"}


@dataclass(frozen=True)
class AgentConfig:
    node: str
    listen: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    interval_s: float = 5.0
    window_s: float = 300.0
    key_file: Path = Path("/etc/slurm-elastic/agent.key")
    gpu_map_dir: Path = Path("/run/slurm-elastic/gpu-map")
    proc_root: Path = Path("/proc")
    nvml_timeout_s: float = 10.0
    on_nvml_missing: str = "fail"
    metrics_listen: str = "127.0.0.1"
    metrics_port: int = DEFAULT_METRICS_PORT
    metrics_token_file: Path | None = None
    metrics_anonymous: str = "reduced"
    max_clock_skew_s: float = 30.0
    auth: str = "hmac"
    munge_socket: Path = Path("/run/munge/munge.socket.2")
    munge_controller_user: str = "root"
    munge_max_ttl_s: int = 300
    mig_apply: bool = True
    mig_minors_file: Path = Path("/proc/driver/nvidia-caps/mig-minors")
    mps_dir: Path = Path("/run/slurm-elastic/mps")
    mps_control: str = "nvidia-cuda-mps-control"


@dataclass(frozen=True)
class KeySpec:
    kind: type
    doc: str
    check: Callable[[Any], str | None] = lambda v: None


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be > 0"


KEYS: dict[str, KeySpec] = {
    "node": KeySpec(str, "Slurm node name of this host (the map directory's subdirectory)",
                    lambda v: None if v and "/" not in v and not v.startswith(".") else "must be a plain node name"),
    "listen": KeySpec(str, "address to listen on", lambda v: None if v else "must not be empty"),
    "port": KeySpec(int, "TCP port of the signed JSON endpoints (the controller's side)",
                    lambda v: None if 1 <= v <= 65535 else "must be within 1..65535"),
    "interval_s": KeySpec(float, "seconds between samples", lambda v: None if v >= 0.05 else "must be >= 0.05"),
    "window_s": KeySpec(float, "seconds of samples behind each job's mean/max utilization", _positive),
    "key_file": KeySpec(Path, "auth = \"hmac\": shared key for request signing; mode 0600, checked at start-up"),
    "gpu_map_dir": KeySpec(Path, "directory of the prolog's per-GPU map files (<dir>/<node>/<gpu index>)"),
    "proc_root": KeySpec(Path, "procfs mount to read processes from"),
    "nvml_timeout_s": KeySpec(float, "longest wait for one NVML sample before it is reported as timed out", _positive),
    "on_nvml_missing": KeySpec(str, "'fail': exit at start-up without NVML; 'degraded': run reporting no GPUs",
                               lambda v: None if v in ("fail", "degraded") else "must be 'fail' or 'degraded'"),
    "metrics_listen": KeySpec(str, "address of the /metrics listener; 127.0.0.1 keeps it on this host, "
                                   "\"0.0.0.0\" lets a Prometheus on another host scrape",
                              lambda v: None if v else "must not be empty"),
    "metrics_port": KeySpec(int, "TCP port of /metrics (Prometheus); 0 disables it",
                            lambda v: None if 0 <= v <= 65535 else "must be within 0..65535"),
    "metrics_token_file": KeySpec(Path, "bearer token (mode 0600) that gets the per-job series (job, user, "
                                        "account labels) from /metrics; unset: no token is accepted"),
    "metrics_anonymous": KeySpec(str, "/metrics without a token: 'reduced' (series without job/user/account "
                                      "labels), 'none' (401) or 'all' (every series)",
                                 lambda v: None if v in METRICS_ANONYMOUS else "must be 'reduced', 'none' or 'all'"),
    "max_clock_skew_s": KeySpec(float, "largest accepted difference between a request's timestamp and our clock",
                                _positive),
    "auth": KeySpec(str, "how the controller's requests are authenticated: 'hmac' (key_file, shared with the "
                         "controller) or 'munge' (the site's MUNGE key; see docs/agent.md)",
                    lambda v: None if v in AUTH_KINDS else "must be 'hmac' or 'munge'"),
    "munge_socket": KeySpec(Path, "munged's socket (auth = \"munge\")"),
    "munge_controller_user": KeySpec(str, "auth = \"munge\": the user (name or uid) the controller runs as; "
                                          "credentials of any other uid are refused",
                                     lambda v: None if v.strip() else "must not be empty"),
    "munge_max_ttl_s": KeySpec(int, "auth = \"munge\": longest credential TTL accepted",
                               lambda v: None if 1 <= v <= 3600 else "must be within 1..3600"),
    "mig_apply": KeySpec(bool, "serve POST /v1/mig/apply (signed): let the controller repartition MIG GPUs"),
    "mig_minors_file": KeySpec(Path, "the driver's MIG capability minors, reported for gres.conf"),
    "mps_dir": KeySpec(Path, "the prolog's MPS directories (<dir>/<node>/gpu<i>/{pipe,log,jobs}); same as "
                             "SLURM_ELASTIC_MPS_DIR of plugins/prolog.sh"),
    "mps_control": KeySpec(str, "nvidia-cuda-mps-control to ask each GPU's MPS daemon for its servers",
                           lambda v: None if v else "must not be empty"),
}


def _coerce(key: str, value: Any, where: str) -> Any:
    spec = KEYS[key]
    if spec.kind is bool:
        ok = isinstance(value, bool)
    elif spec.kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif spec.kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif spec.kind is Path:
        ok = isinstance(value, str | Path) and str(value) != ""
        value = Path(value) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:
        raise ConfigError(f"{where}: {key} must be a {spec.kind.__name__.lower()}, got {value!r}")
    problem = spec.check(value)
    if problem:
        raise ConfigError(f"{where}: {key} {problem} (got {value!r})")
    return value


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    version = data.pop("version", None)
    if version != CONFIG_VERSION:
        raise ConfigError(f"config file {path}: needs 'version = {CONFIG_VERSION}' (got {version!r})")
    replaced = sorted(set(data) & set(_REPLACED))
    if replaced:
        raise ConfigError(f"config file {path}: {replaced[0]} is gone; use {_REPLACED[replaced[0]]}")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        lines = KeyLines(text)
        where = [f"{k}{suggest(k, KEYS)}" + (f" (line {lines.line([k])})" if lines.line([k]) else "") for k in unknown]
        raise ConfigError(f"config file {path}: unknown key(s) {', '.join(where)}; known: {', '.join(KEYS)}")
    return data


def load_config(path: Path | None, overrides: Mapping[str, Any], default_node: str) -> AgentConfig:
    """Defaults, then the file at ``path`` (if any), then ``overrides`` (flags; None values are skipped)."""
    values: dict[str, Any] = {}
    if path is not None:
        values.update({k: _coerce(k, v, f"config file {path}") for k, v in read_config_file(path).items()})
    for k, v in overrides.items():
        if k not in KEYS:
            raise ConfigError(f"unknown setting {k}")
        if v is not None:
            values[k] = _coerce(k, v, "command line")
    values.setdefault("node", _coerce("node", default_node, "hostname"))
    config = AgentConfig(**values)
    if config.window_s < config.interval_s:
        raise ConfigError(f"window_s ({config.window_s:g}) must be at least interval_s ({config.interval_s:g})")
    return config


def describe() -> str:
    """One line per key, for ``--help`` and the docs."""
    def toml(value: object) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        return str(value) if isinstance(value, int | float) else f'"{value}"'

    defaults = {f.name: toml(f.default) for f in fields(AgentConfig) if f.default not in (MISSING, None)}
    return "\n".join(f"{k} = {defaults.get(k, '<short hostname>' if k == 'node' else '(unset)')}: {spec.doc}"
                     for k, spec in KEYS.items())
