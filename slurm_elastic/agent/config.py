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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_elastic.agent.auth import AUTH_KINDS, METRICS_ANONYMOUS
from slurm_elastic.configfile import KeyLines, suggest
from slurm_elastic.errors import ConfigError
from slurm_elastic.keyschema import AGENT_KEY_FILE, Key, Kind

CONFIG_VERSION = 1
DEFAULT_PORT = 9817
DEFAULT_METRICS_PORT = 9819
#: Keys that existed once, with what replaced them (a clearer error than "unknown key").
_REPLACED = {"metrics_auth": "metrics_token_file and metrics_anonymous (docs/agent.md, /metrics)"}


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be > 0"


def _plain_node(v: str) -> str | None:
    return None if v and "/" not in v and not v.startswith(".") else "must be a plain node name"


def _one_of(choices: tuple[str, ...], text: str) -> Callable[[str], str | None]:
    return lambda v: None if v in choices else f"must be {text}"


def _not_empty(v: str) -> str | None:
    return None if v.strip() else "must not be empty"


KEYS: dict[str, Key] = {
    "node": Key(Kind.STR, None, "Slurm node name of this host (the map directory's subdirectory); unset: the "
                "short hostname", check=_plain_node),
    "listen": Key(Kind.STR, "0.0.0.0", "address to listen on", check=_not_empty),
    "port": Key(Kind.INT, DEFAULT_PORT, "TCP port of the signed JSON endpoints (the controller's side)", 1, 65535),
    "interval_s": Key(Kind.NUMBER, 5.0, "seconds between samples", 0.05),
    "window_s": Key(Kind.NUMBER, 300.0, "seconds of samples behind each job's mean/max utilization",
                    check=_positive),
    "key_file": Key(Kind.PATH, AGENT_KEY_FILE, "auth = \"hmac\": shared key for request signing; "
                    "mode 0600, checked at start-up"),
    "gpu_map_dir": Key(Kind.PATH, "/run/slurm-elastic/gpu-map", "directory of the prolog's per-GPU map files "
                       "(<dir>/<node>/<gpu index>)"),
    "proc_root": Key(Kind.PATH, "/proc", "procfs mount to read processes from"),
    "nvml_timeout_s": Key(Kind.NUMBER, 10.0, "longest wait for one NVML sample before it is reported as timed out",
                          check=_positive),
    "on_nvml_missing": Key(Kind.STR, "fail", "'fail': exit at start-up without NVML; 'degraded': run reporting no "
                           "GPUs", check=_one_of(("fail", "degraded"), "'fail' or 'degraded'")),
    "metrics_listen": Key(Kind.STR, "127.0.0.1", "address of the /metrics listener; 127.0.0.1 keeps it on this "
                          "host, \"0.0.0.0\" lets a Prometheus on another host scrape", check=_not_empty),
    "metrics_port": Key(Kind.INT, DEFAULT_METRICS_PORT, "TCP port of /metrics (Prometheus); 0 disables it", 0, 65535),
    "metrics_token_file": Key(Kind.PATH, None, "bearer token (mode 0600) that gets the per-job series (job, user, "
                              "account labels) from /metrics; unset: no token is accepted"),
    "metrics_anonymous": Key(Kind.STR, "reduced", "/metrics without a token: 'reduced' (series without "
                             "job/user/account labels), 'none' (401) or 'all' (every series)",
                             check=_one_of(METRICS_ANONYMOUS, "'reduced', 'none' or 'all'")),
    "max_clock_skew_s": Key(Kind.NUMBER, 30.0, "largest accepted difference between a request's timestamp and "
                            "our clock", check=_positive),
    "auth": Key(Kind.STR, "hmac", "how the controller's requests are authenticated: 'hmac' (key_file, shared "
                "with the controller) or 'munge' (the site's MUNGE key; see docs/agent.md)",
                check=_one_of(AUTH_KINDS, "'hmac' or 'munge'")),
    "munge_socket": Key(Kind.PATH, "/run/munge/munge.socket.2", "munged's socket (auth = \"munge\")"),
    "munge_controller_user": Key(Kind.STR, "root", "auth = \"munge\": the user (name or uid) the controller runs "
                                 "as; credentials of any other uid are refused", check=_not_empty),
    "munge_max_ttl_s": Key(Kind.INT, 300, "auth = \"munge\": longest credential TTL accepted", 1, 3600),
    "mig_apply": Key(Kind.BOOL, True, "serve POST /v1/mig/apply (signed): let the controller repartition MIG GPUs"),
    "mig_minors_file": Key(Kind.PATH, "/proc/driver/nvidia-caps/mig-minors", "the driver's MIG capability minors, "
                           "reported for gres.conf"),
    "mps_dir": Key(Kind.PATH, "/run/slurm-elastic/mps", "the prolog's MPS directories "
                   "(<dir>/<node>/gpu<i>/{pipe,log,jobs}); same as SLURM_ELASTIC_MPS_DIR of plugins/prolog.sh"),
    "mps_control": Key(Kind.STR, "nvidia-cuda-mps-control", "nvidia-cuda-mps-control to ask each GPU's MPS daemon "
                       "for its servers", check=_not_empty),
}


def _default(key: str) -> Any:
    value = KEYS[key].default
    return Path(value) if KEYS[key].kind is Kind.PATH and value is not None else value


@dataclass(frozen=True)
class AgentConfig:
    node: str
    listen: str = _default("listen")
    port: int = _default("port")
    interval_s: float = _default("interval_s")
    window_s: float = _default("window_s")
    key_file: Path = _default("key_file")
    gpu_map_dir: Path = _default("gpu_map_dir")
    proc_root: Path = _default("proc_root")
    nvml_timeout_s: float = _default("nvml_timeout_s")
    on_nvml_missing: str = _default("on_nvml_missing")
    metrics_listen: str = _default("metrics_listen")
    metrics_port: int = _default("metrics_port")
    metrics_token_file: Path | None = _default("metrics_token_file")
    metrics_anonymous: str = _default("metrics_anonymous")
    max_clock_skew_s: float = _default("max_clock_skew_s")
    auth: str = _default("auth")
    munge_socket: Path = _default("munge_socket")
    munge_controller_user: str = _default("munge_controller_user")
    munge_max_ttl_s: int = _default("munge_max_ttl_s")
    mig_apply: bool = _default("mig_apply")
    mig_minors_file: Path = _default("mig_minors_file")
    mps_dir: Path = _default("mps_dir")
    mps_control: str = _default("mps_control")


#: The words the agent's messages use for each kind ("port must be a int, got '80'").
_WORDS = {Kind.BOOL: "bool", Kind.INT: "int", Kind.NUMBER: "float", Kind.PATH: "path", Kind.STR: "str"}


def _coerce(key: str, value: Any, where: str) -> Any:
    spec = KEYS[key]
    if spec.kind is Kind.BOOL:
        ok = isinstance(value, bool)
    elif spec.kind is Kind.INT:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif spec.kind is Kind.NUMBER:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif spec.kind is Kind.PATH:
        ok = isinstance(value, str | Path) and str(value) != ""
        value = Path(value) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:
        raise ConfigError(f"{where}: {key} must be a {_WORDS[spec.kind]}, got {value!r}")
    problem = None
    if isinstance(value, int | float) and not spec.in_range(value):
        problem = f"must be within {spec.range_text()}" if spec.hi is not None else f"must be {spec.range_text()}"
    elif spec.check is not None:
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
    def toml(key: str, value: object) -> str:
        if value is None:
            return "<short hostname>" if key == "node" else "(unset)"
        if isinstance(value, bool):
            return str(value).lower()
        return str(value) if isinstance(value, int | float) else f'"{value}"'

    return "\n".join(f"{k} = {toml(k, spec.default)}: {spec.doc}" for k, spec in KEYS.items())
