"""The controller's TOML config (``/etc/slurm-elastic/controller.toml``): validated at start, unknown keys rejected
with a "did you mean", each problem with its line (slurm_elastic/configfile.py).

Only configuration errors stop the daemon at start-up; everything else is a per-cycle error. Nothing in the file
is ever evaluated as code. Example::

    version = 1
    [controller]
    interval_s = 30            # one cycle: snapshot, collect, decide, act
    dry_run = false            # decide and record, never call Slurm to act
    max_snapshot_age_s = 60    # never act on an older Slurm snapshot
    policy_file = "/etc/slurm-elastic/policy.toml"   # used until a version is stored with `policy set`
    holder = ""                # lease holder name; default: hostname:pid
    lease_ttl_s = 90
    lease_stale_s = 0          # heartbeat age after which another host may take the lease; 0: 3 x interval_s
    reconcile_interval_s = 60
    retention_interval_s = 3600
    accounting_refresh_s = 300 # re-read fair-share weights (sshare) and GPU limits (sacctmgr) this often
    hold_heartbeat_s = 600     # an unchanged hold is stored again this often (0: store every hold, every cycle)

    [store]                    # the state DB; same section in mig.toml (controller.db_url and
                               # controller.table_prefix: old spellings, accepted with a warning until the next release)
    url = "sqlite:////var/lib/slurm-elastic/state.db"
    table_prefix = ""          # several stores in one shared database (tests, staging next to production)

    [agents]                   # same section in mig.toml (apply_timeout_s is the MIG workflow's)
    auth = "hmac"              # or "munge": the site's MUNGE key (munge_socket, munge_agent_user, munge_ttl_s)
    key_file = "/etc/slurm-elastic/agent.key"
    url_template = "http://{address}:9817"   # {node} and {address} (the node's NodeAddr) are replaced
    timeout_s = 5.0
    [agents.urls]              # optional per-node overrides
    n1 = "http://127.0.0.1:18001"

    [extension]
    env = { PATH = "/usr/local/bin:/usr/bin:/bin" }   # environment of extension jobs (plus the role variables)
    qos = ""                   # QOS of extension jobs, e.g. a preemptible "scavenger"; "" = the leader's QOS
    notice_grace_s = 30        # a grow's resize notice: extension workers join once the job has checkpointed,
                               # at most this long after the submission (slurm_elastic/resize.py)

    [api]                      # the local API the CLI talks to (see docs/operating.md)
    socket = "/run/slurm-elastic/controller.sock"   # "" disables it
    slurm_user = "slurm"       # may change policy and pauses, like root
    operators_group = ""       # members may change policy and pauses too
    users_see_all = false      # true: every user may list and explain every job

    [metrics]                  # Prometheus /metrics of the controller
    port = 9818                # 0 disables
    address = "127.0.0.1"      # "0.0.0.0": a Prometheus on another host may scrape
    token_file = ""            # bearer token (0600) that gets the per-job series (job ids, users); "" = none
    anonymous = "reduced"      # without a token: "reduced" (no per-job series), "none" (401), "all"

    [metrics_source]           # where per-job GPU utilization comes from (docs/controller.md, "Metrics source")
    kind = "agents"            # "agents": each node's agent ([agents]); "prometheus": PromQL on the site's server
    url = "http://prometheus:9090"   # kind = "prometheus": the server (its HTTP API, /api/v1/query)
    series = "dcgm"            # "dcgm": dcgm-exporter, HPC job mapping; "agent": the agents' slurm_elastic_job_*
    window_s = 60              # "dcgm": each sample's mean and max cover this range
    timeout_s = 10.0
    token_file = ""            # bearer token for the server's API, if it asks for one
    node_label = "Hostname"    # "dcgm": the node and Slurm job labels
    job_label = "hpc_job"
    matchers = ""              # extra label matchers for every selector, e.g. 'cluster="a"'

    [retention]                # days to keep; 0 keeps forever (open journal actions are always kept)
    samples_days = 7
    decisions_days = 90
    actions_days = 365
    jobs_days = 90
    cycles_days = 30
    demand_days = 42           # serving demand history; the forecast reads the last 5 weeks
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_elastic.agent.auth import METRICS_ANONYMOUS
from slurm_elastic.configfile import (
    AGENT_KEYS,
    STORE_KEYS,
    Problems,
    check_sections,
    check_table,
    suggest,
    take_moved,
    with_lines,
)
from slurm_elastic.errors import ConfigError
from slurm_elastic.store.engine import MYSQL_SOCKET_TIMEOUT_S
from slurm_elastic.store.models import PREFIX_RE
from slurm_elastic.store.records import Retention

DEFAULT_CONFIG_PATH = Path("/etc/slurm-elastic/controller.toml")
#: A QOS name as sacctmgr accepts it; it becomes one ``--qos=`` argument of sbatch (never a shell word).
QOS_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
CONFIG_VERSION = 1


@dataclass(frozen=True)
class AgentsConfig:
    key_file: Path | None = None
    auth: str = "hmac"
    munge_socket: str = "/run/munge/munge.socket.2"
    munge_agent_user: str = "root"
    munge_ttl_s: int = 60
    url_template: str = "http://{address}:9817"
    timeout_s: float = 5.0
    urls: Mapping[str, str] = field(default_factory=dict)

    def url_for(self, node: str, address: str | None) -> str:
        if node in self.urls:
            return self.urls[node]
        return self.url_template.format(node=node, address=address or node)


@dataclass(frozen=True)
class ApiConfig:
    socket: Path | None = Path("/run/slurm-elastic/controller.sock")
    slurm_user: str = "slurm"
    operators_group: str = ""
    users_see_all: bool = False


@dataclass(frozen=True)
class MetricsConfig:
    port: int = 9818
    address: str = "127.0.0.1"  # this host only unless opened (docs/deployment.md, "Prometheus and Grafana")
    token_file: Path | None = None
    anonymous: str = "reduced"  # one of agent.auth.METRICS_ANONYMOUS


METRICS_SOURCE_KINDS = ("agents", "prometheus")
PROMETHEUS_SERIES = ("dcgm", "agent")
#: A Prometheus label name, and a list of label matchers (``a="x", b=~"y.*"``) added to every selector.
LABEL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\\n]|\\.)*"\s*'
MATCHERS_RE = re.compile(rf"^(?:{_MATCHER}(?:,{_MATCHER})*)?\Z")


@dataclass(frozen=True)
class MetricsSourceConfig:
    """Where the controller reads per-job GPU utilization: the agents, or the site's Prometheus."""

    kind: str = "agents"  # one of METRICS_SOURCE_KINDS
    url: str = ""
    series: str = "dcgm"  # one of PROMETHEUS_SERIES
    window_s: float = 60.0
    timeout_s: float = 10.0
    token_file: Path | None = None
    node_label: str = "Hostname"
    job_label: str = "hpc_job"
    matchers: str = ""


@dataclass(frozen=True)
class ControllerConfig:
    interval_s: float = 30.0
    dry_run: bool = False
    max_snapshot_age_s: float = 60.0
    db_url: str = "sqlite:////var/lib/slurm-elastic/state.db"
    table_prefix: str = ""
    policy_file: Path | None = None
    holder: str = ""
    lease_ttl_s: float = 90.0
    lease_stale_s: float = 0.0  # 0: 3 x interval_s (at most the TTL); see controller/lease.py
    reconcile_interval_s: float = 60.0
    retention_interval_s: float = 3600.0
    accounting_refresh_s: float = 300.0  # sshare weights and sacctmgr GPU limits (controller/shares.py)
    hold_heartbeat_s: float = 600.0  # holds are stored when they change, and this often unchanged (hold_filter.py)
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    extension_env: Mapping[str, str] = field(default_factory=lambda: {"PATH": "/usr/local/bin:/usr/bin:/bin"})
    extension_qos: str = ""  # "" = the leader's QOS (see docs/controller.md, "Slurm-side losses")
    notice_grace_s: float = 30.0  # [extension] notice_grace_s: a grow's notice (controller/actuator.py)
    retention: Retention = field(default_factory=Retention)
    api: ApiConfig = field(default_factory=ApiConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    metrics_source: MetricsSourceConfig = field(default_factory=MetricsSourceConfig)
    source: str = "<defaults>"

    @property
    def holder_name(self) -> str:
        return self.holder or f"{socket.gethostname()}:{os.getpid()}"

    @property
    def lease_stale_after_s(self) -> float:
        """The heartbeat age after which this controller, holding the lease, counts as gone to another host."""
        return self.lease_stale_s or min(3 * self.interval_s, self.lease_ttl_s)

    @property
    def db_timeout_s(self) -> float:
        """A server DB's network timeout (store/engine.py): at most the lease TTL. A statement that hangs longer
        (a silent network cut) fails as ``connection_lost``; by then the lease has lapsed anyway, so waiting on
        gains nothing, and the cycle ends with its error instead of hanging."""
        return min(MYSQL_SOCKET_TIMEOUT_S, self.lease_ttl_s)


_CONTROLLER_KEYS: dict[str, tuple[type | tuple[type, ...], tuple[float, float] | None]] = {
    "interval_s": ((int, float), (0.5, 86400)),
    "dry_run": (bool, None),
    "max_snapshot_age_s": ((int, float), (1, 86400)),
    "policy_file": (str, None),
    "holder": (str, None),
    "lease_ttl_s": ((int, float), (2, 86400)),
    "lease_stale_s": ((int, float), (0, 86400)),
    "reconcile_interval_s": ((int, float), (1, 86400)),
    "retention_interval_s": ((int, float), (10, 864000)),
    "accounting_refresh_s": ((int, float), (1, 86400)),
    "hold_heartbeat_s": ((int, float), (0, 86400)),
}
_RETENTION_KEYS: dict[str, tuple[type | tuple[type, ...], tuple[float, float] | None]] = {
    f"{k}_days": (int, (0, 36500)) for k in ("samples", "decisions", "actions", "jobs", "cycles", "demand")
}
_API_KEYS: dict[str, tuple[type | tuple[type, ...], tuple[float, float] | None]] = {
    "socket": (str, None),
    "slurm_user": (str, None),
    "operators_group": (str, None),
    "users_see_all": (bool, None),
}
_METRICS_KEYS: dict[str, tuple[type | tuple[type, ...], tuple[float, float] | None]] = {
    "port": (int, (0, 65535)),
    "address": (str, None),
    "token_file": (str, None),
    "anonymous": (str, None),
}
_METRICS_SOURCE_KEYS: dict[str, tuple[type | tuple[type, ...], tuple[float, float] | None]] = {
    "kind": (str, None),
    "url": (str, None),
    "series": (str, None),
    "window_s": ((int, float), (5, 86400)),
    "timeout_s": ((int, float), (0.1, 300)),
    "token_file": (str, None),
    "node_label": (str, None),
    "job_label": (str, None),
    "matchers": (str, None),
}
def _check(table: Mapping[str, Any], spec: Mapping[str, tuple[type | tuple[type, ...], tuple[float, float] | None]],
           where: str, problems: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in spec:
            problems.append(f"{where}.{key}: unknown key{suggest(key, spec)} (known: {', '.join(sorted(spec))})")
            continue
        types, bounds = spec[key]
        if isinstance(value, bool) and types is not bool and bool not in (types if isinstance(types, tuple) else ()):
            problems.append(f"{where}.{key}: expected a number, got a boolean")
            continue
        if not isinstance(value, types):
            problems.append(f"{where}.{key}: wrong type {type(value).__name__}")
            continue
        if bounds is not None and isinstance(value, (int, float)) and not bounds[0] <= value <= bounds[1]:
            problems.append(f"{where}.{key}: {value} out of range {bounds[0]:g}..{bounds[1]:g}")
            continue
        out[key] = value
    return out


def parse_controller_config(text: str, source: str = "<string>",
                            warn: Callable[[str], None] | None = None) -> ControllerConfig:
    """``warn`` gets deprecation warnings (default: logged)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: invalid TOML: {e}") from e
    problems: list[str] = []
    version = data.pop("version", None)
    if version != CONFIG_VERSION:
        problems.append(f"version: must be {CONFIG_VERSION} (got {version!r})")
    sections = {"controller", "agents", "store", "extension", "retention", "api", "metrics", "metrics_source"}
    shared = Problems(source)  # [agents] and [store]: the layer shared with mig.toml (configfile.py)
    check_sections(data, sections, shared)
    take_moved(data, shared, warn)
    ctl = _check(data.get("controller", {}), _CONTROLLER_KEYS, "controller", problems)
    agents = check_table(data.get("agents", {}), AGENT_KEYS, "agents", shared)
    store = check_table(data.get("store", {}), STORE_KEYS, "store", shared)
    problems.extend(shared.items)
    urls = agents.get("urls", {})
    template = agents.get("url_template", AgentsConfig.url_template)
    keep = _check(data.get("retention", {}), _RETENTION_KEYS, "retention", problems)
    if "table_prefix" in store and not PREFIX_RE.match(store["table_prefix"]):
        problems.append("store.table_prefix: up to 16 lower-case letters, digits or '_', starting with a letter")
    stale, ttl = ctl.get("lease_stale_s", 0), ctl.get("lease_ttl_s", ControllerConfig.lease_ttl_s)
    if stale and (stale >= ttl or stale < ctl.get("interval_s", ControllerConfig.interval_s)):
        problems.append(f"controller.lease_stale_s: {stale:g} must be at least interval_s (a heartbeat per cycle) "
                        f"and below lease_ttl_s ({ttl:g}), or 0 for 3 x interval_s")
    api = _check(data.get("api", {}), _API_KEYS, "api", problems)
    metrics = _check(data.get("metrics", {}), _METRICS_KEYS, "metrics", problems)
    if metrics.get("anonymous", MetricsConfig.anonymous) not in METRICS_ANONYMOUS:
        problems.append(f"metrics.anonymous: one of {', '.join(METRICS_ANONYMOUS)} (got {metrics['anonymous']!r})")
    if "address" in metrics and not metrics["address"]:
        problems.append("metrics.address: must not be empty (127.0.0.1: this host only)")
    source_cfg = _metrics_source(_check(data.get("metrics_source", {}), _METRICS_SOURCE_KEYS, "metrics_source",
                                        problems), problems)
    if "socket" in api and api["socket"] and not api["socket"].startswith("/"):
        problems.append("api.socket: must be an absolute path (or \"\" to disable the API)")
    defaults = Retention()

    def days(name: str) -> int | None:
        if f"{name}_days" not in keep:
            return getattr(defaults, f"{name}_s")  # type: ignore[no-any-return]
        value = int(keep[f"{name}_days"])
        return None if value == 0 else value * 86400

    ext = data.get("extension", {})
    ext_env: dict[str, str] = {}
    ext_qos = ""
    notice_grace_s = ControllerConfig.notice_grace_s
    for key, value in ext.items():
        if key == "notice_grace_s":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 3600:
                problems.append("extension.notice_grace_s: seconds, 0..3600")
            else:
                notice_grace_s = float(value)
        elif key == "qos":
            if not isinstance(value, str) or not (value == "" or QOS_NAME_RE.match(value)):
                problems.append("extension.qos: a Slurm QOS name (letters, digits, '_', '-', '.'; up to 64) "
                                "or \"\" for the leader's QOS")
            else:
                ext_qos = value
        elif key != "env":
            problems.append(f"extension.{key}: unknown key{suggest(key, ('env', 'qos', 'notice_grace_s'))} "
                            "(known: env, qos, notice_grace_s)")
        elif not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            problems.append("extension.env: must be a table of strings")
        else:
            ext_env = dict(value)
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(with_lines(problems, text)))
    key_file = agents.get("key_file")
    return ControllerConfig(
        interval_s=float(ctl.get("interval_s", 30.0)),
        dry_run=bool(ctl.get("dry_run", False)),
        max_snapshot_age_s=float(ctl.get("max_snapshot_age_s", 60.0)),
        db_url=str(store.get("url", ControllerConfig.db_url)),
        table_prefix=str(store.get("table_prefix", "")),
        policy_file=Path(ctl["policy_file"]) if ctl.get("policy_file") else None,
        holder=str(ctl.get("holder", "")),
        lease_ttl_s=float(ctl.get("lease_ttl_s", 90.0)),
        lease_stale_s=float(ctl.get("lease_stale_s", 0.0)),
        reconcile_interval_s=float(ctl.get("reconcile_interval_s", 60.0)),
        retention_interval_s=float(ctl.get("retention_interval_s", 3600.0)),
        accounting_refresh_s=float(ctl.get("accounting_refresh_s", 300.0)),
        hold_heartbeat_s=float(ctl.get("hold_heartbeat_s", ControllerConfig.hold_heartbeat_s)),
        agents=AgentsConfig(
            key_file=Path(key_file) if key_file else None,
            auth=str(agents.get("auth", AgentsConfig.auth)),
            munge_socket=str(agents.get("munge_socket", AgentsConfig.munge_socket)),
            munge_agent_user=str(agents.get("munge_agent_user", AgentsConfig.munge_agent_user)),
            munge_ttl_s=int(agents.get("munge_ttl_s", AgentsConfig.munge_ttl_s)),
            url_template=template,
            timeout_s=float(agents.get("timeout_s", 5.0)),
            urls=dict(urls),
        ),
        extension_env=ext_env or {"PATH": "/usr/local/bin:/usr/bin:/bin"},
        extension_qos=ext_qos,
        notice_grace_s=notice_grace_s,
        retention=Retention(samples_s=days("samples"), decisions_s=days("decisions"), actions_s=days("actions"),
                            jobs_s=days("jobs"), cycles_s=days("cycles"), demand_s=days("demand")),
        api=ApiConfig(
            socket=(Path(api["socket"]) if api["socket"] else None) if "socket" in api else ApiConfig.socket,
            slurm_user=str(api.get("slurm_user", "slurm")),
            operators_group=str(api.get("operators_group", "")),
            users_see_all=bool(api.get("users_see_all", False)),
        ),
        metrics=MetricsConfig(port=int(metrics.get("port", MetricsConfig.port)),
                              address=str(metrics.get("address", MetricsConfig.address)),
                              token_file=Path(metrics["token_file"]) if metrics.get("token_file") else None,
                              anonymous=str(metrics.get("anonymous", MetricsConfig.anonymous))),
        metrics_source=source_cfg,
        source=source,
    )


def _metrics_source(raw: Mapping[str, Any], problems: list[str]) -> MetricsSourceConfig:
    """[metrics_source], checked beyond types: a known kind and series, a URL for Prometheus, label names and
    matchers that can only ever be label names and matchers inside the PromQL the controller builds."""
    d = MetricsSourceConfig()
    kind, series = raw.get("kind", d.kind), raw.get("series", d.series)
    if kind not in METRICS_SOURCE_KINDS:
        problems.append(f"metrics_source.kind: one of {', '.join(METRICS_SOURCE_KINDS)} (got {kind!r})")
    if series not in PROMETHEUS_SERIES:
        problems.append(f"metrics_source.series: one of {', '.join(PROMETHEUS_SERIES)} (got {series!r})")
    url = str(raw.get("url", "")).rstrip("/")
    if kind == "prometheus" and not url.startswith(("http://", "https://")):
        problems.append("metrics_source.url: the Prometheus server's http(s) URL is required with kind = "
                        "\"prometheus\" (e.g. \"http://prometheus:9090\")")
    for key in ("node_label", "job_label"):
        if key in raw and not LABEL_NAME_RE.match(raw[key]):
            problems.append(f"metrics_source.{key}: a Prometheus label name (letters, digits, '_'), got {raw[key]!r}")
    if "matchers" in raw and not MATCHERS_RE.match(raw["matchers"]):
        problems.append(f"metrics_source.matchers: label matchers such as 'cluster=\"a\", rack=~\"r1.*\"', "
                        f"got {raw['matchers']!r}")
    return MetricsSourceConfig(
        kind=str(kind), url=url, series=str(series), window_s=float(raw.get("window_s", d.window_s)),
        timeout_s=float(raw.get("timeout_s", d.timeout_s)),
        token_file=Path(raw["token_file"]) if raw.get("token_file") else None,
        node_label=str(raw.get("node_label", d.node_label)), job_label=str(raw.get("job_label", d.job_label)),
        matchers=str(raw.get("matchers", "")).strip())


def load_controller_config(path: Path) -> ControllerConfig:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from e
    return parse_controller_config(text, source=str(path))
