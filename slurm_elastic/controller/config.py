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
    Key,
    KeyLines,
    Kind,
    Problems,
    agent_values,
    check_sections,
    check_table,
    take_moved,
)
from slurm_elastic.errors import ConfigError
from slurm_elastic.store.engine import MYSQL_SOCKET_TIMEOUT_S
from slurm_elastic.store.models import PREFIX_RE
from slurm_elastic.store.records import Retention

DEFAULT_CONFIG_PATH = Path("/etc/slurm-elastic/controller.toml")
#: A QOS name as sacctmgr accepts it; it becomes one ``--qos=`` argument of sbatch (never a shell word).
QOS_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
CONFIG_VERSION = 1

_DAY = 86400
#: ``[controller]``: the cycle and the lease.
CONTROLLER_KEYS: dict[str, Key] = {
    "interval_s": Key(Kind.NUMBER, 30.0, "one cycle: snapshot, collect, decide, act", 0.5, _DAY),
    "dry_run": Key(Kind.BOOL, False, "decide and record, never call Slurm to act"),
    "max_snapshot_age_s": Key(Kind.NUMBER, 60.0, "never act on an older Slurm snapshot", 1, _DAY),
    "policy_file": Key(Kind.STR, None, "policy TOML used until a version is stored with `policy set` (unset: the "
                       "packaged defaults)"),
    "holder": Key(Kind.STR, "", "lease holder name (\"\": hostname:pid)"),
    "lease_ttl_s": Key(Kind.NUMBER, 90.0, "the lease lapses this long after its last heartbeat", 2, _DAY),
    "lease_stale_s": Key(Kind.NUMBER, 0.0, "heartbeat age after which another host may take the lease (0: 3 x "
                         "interval_s, at most lease_ttl_s)", 0, _DAY),
    "reconcile_interval_s": Key(Kind.NUMBER, 60.0, "open journal actions are reconciled with Slurm this often",
                                1, _DAY),
    "retention_interval_s": Key(Kind.NUMBER, 3600.0, "old rows are deleted this often ([retention])", 10, 10 * _DAY),
    "accounting_refresh_s": Key(Kind.NUMBER, 300.0, "re-read fair-share weights (sshare) and GPU limits "
                                "(sacctmgr) this often", 1, _DAY),
    "hold_heartbeat_s": Key(Kind.NUMBER, 600.0, "an unchanged hold is stored again this often (0: store every "
                            "hold, every cycle)", 0, _DAY),
}
_RETENTION_DEFAULTS = Retention()
#: ``[retention]``: days to keep; 0 keeps forever (open journal actions are always kept).
RETENTION_KEYS: dict[str, Key] = {
    f"{name}_days": Key(Kind.INT, (getattr(_RETENTION_DEFAULTS, f"{name}_s") or 0) // _DAY, doc, 0, 36500,
                        unit="days")
    for name, doc in (("samples", "utilization samples"), ("decisions", "decisions"),
                      ("actions", "terminal journal actions"), ("jobs", "ended elastic and extension jobs"),
                      ("cycles", "cycle records"),
                      ("demand", "serving demand history (the forecast reads the last 5 weeks)"))
}


def _absolute_or_empty(value: str) -> str | None:
    return None if not value or value.startswith("/") else "must be an absolute path (or \"\" to disable the API)"


#: ``[api]``: the local API the CLI talks to.
API_KEYS: dict[str, Key] = {
    "socket": Key(Kind.STR, "/run/slurm-elastic/controller.sock", "the API's Unix socket (\"\" disables it)",
                  check=_absolute_or_empty),
    "slurm_user": Key(Kind.STR, "slurm", "may change policy and pauses, like root"),
    "operators_group": Key(Kind.STR, "", "members may change policy and pauses too"),
    "users_see_all": Key(Kind.BOOL, False, "true: every user may list and explain every job"),
}


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str | None]:
    return lambda v: None if v in choices else f"one of {', '.join(choices)} (got {v!r})"


def _not_empty(what: str) -> Callable[[str], str | None]:
    return lambda v: None if v else f"must not be empty ({what})"


#: ``[metrics]``: the controller's Prometheus /metrics.
METRICS_KEYS: dict[str, Key] = {
    "port": Key(Kind.INT, 9818, "TCP port of /metrics (0 disables it)", 0, 65535),
    "address": Key(Kind.STR, "127.0.0.1", "listen address (\"0.0.0.0\": a Prometheus on another host may scrape)",
                   check=_not_empty("127.0.0.1: this host only")),
    "token_file": Key(Kind.STR, "", "bearer token (mode 0600) that gets the per-job series (job ids, users); "
                      "\"\": none"),
    "anonymous": Key(Kind.STR, "reduced", "without a token: 'reduced' (no per-job series), 'none' (401), 'all'",
                     check=_one_of(METRICS_ANONYMOUS)),
}
#: ``[metrics_source]``: where per-job GPU utilization comes from (checked further in _metrics_source).
METRICS_SOURCE_KEYS: dict[str, Key] = {
    "kind": Key(Kind.STR, "agents", "'agents': each node's agent ([agents]); 'prometheus': PromQL on the site's "
                "server"),
    "url": Key(Kind.STR, "", "kind = \"prometheus\": the server's http(s) URL (its HTTP API, /api/v1/query)"),
    "series": Key(Kind.STR, "dcgm", "'dcgm': dcgm-exporter with HPC job mapping; 'agent': the agents' "
                  "slurm_elastic_job_* series"),
    "window_s": Key(Kind.NUMBER, 60.0, "'dcgm': each sample's mean and max cover this range", 5, _DAY),
    "timeout_s": Key(Kind.NUMBER, 10.0, "timeout of one query", 0.1, 300),
    "token_file": Key(Kind.STR, "", "bearer token for the server's API, if it asks for one (\"\": none)"),
    "node_label": Key(Kind.STR, "Hostname", "'dcgm': the node label"),
    "job_label": Key(Kind.STR, "hpc_job", "'dcgm': the Slurm job label"),
    "matchers": Key(Kind.STR, "", "extra label matchers for every selector, e.g. 'cluster=\"a\"'"),
}


def _qos_name(value: str) -> str | None:
    if value == "" or QOS_NAME_RE.match(value):
        return None
    return "a Slurm QOS name (letters, digits, '_', '-', '.'; up to 64) or \"\" for the leader's QOS"


def _env_table(value: dict[str, Any]) -> str | None:
    return None if all(isinstance(v, str) for v in value.values()) else "must be a table of strings"


#: ``[extension]``: the extension jobs a grow submits.
EXTENSION_KEYS: dict[str, Key] = {
    "env": Key(Kind.TABLE, {"PATH": "/usr/local/bin:/usr/bin:/bin"}, "environment of extension jobs (plus the "
               "role variables)", check=_env_table),
    "qos": Key(Kind.STR, "", "QOS of extension jobs, e.g. a preemptible \"scavenger\" (\"\": the leader's QOS)",
               check=_qos_name),
    "notice_grace_s": Key(Kind.NUMBER, 30.0, "a grow's resize notice: extension workers join once the job has "
                          "checkpointed, at most this long after the submission (slurm_elastic/resize.py)", 0, 3600),
}

#: Every section of controller.toml with its keys, in the order the docs show them.
SECTIONS: dict[str, Mapping[str, Key]] = {
    "controller": CONTROLLER_KEYS, "store": STORE_KEYS, "agents": AGENT_KEYS, "extension": EXTENSION_KEYS,
    "api": API_KEYS, "metrics": METRICS_KEYS, "metrics_source": METRICS_SOURCE_KEYS, "retention": RETENTION_KEYS,
}



@dataclass(frozen=True)
class AgentsConfig:
    key_file: Path = Path(AGENT_KEYS["key_file"].default)
    auth: str = AGENT_KEYS["auth"].default
    munge_socket: str = AGENT_KEYS["munge_socket"].default
    munge_agent_user: str = AGENT_KEYS["munge_agent_user"].default
    munge_ttl_s: int = AGENT_KEYS["munge_ttl_s"].default
    url_template: str = AGENT_KEYS["url_template"].default
    timeout_s: float = 5.0  # AGENT_KEYS["timeout_s"]: 5 in the controller, 10 in the MIG workflow
    urls: Mapping[str, str] = field(default_factory=dict)

    def url_for(self, node: str, address: str | None) -> str:
        if node in self.urls:
            return self.urls[node]
        return self.url_template.format(node=node, address=address or node)


@dataclass(frozen=True)
class ApiConfig:
    socket: Path | None = Path(API_KEYS["socket"].default)
    slurm_user: str = API_KEYS["slurm_user"].default
    operators_group: str = API_KEYS["operators_group"].default
    users_see_all: bool = API_KEYS["users_see_all"].default


@dataclass(frozen=True)
class MetricsConfig:
    port: int = METRICS_KEYS["port"].default
    address: str = METRICS_KEYS["address"].default  # this host only unless opened (docs/deployment.md)
    token_file: Path | None = None
    anonymous: str = METRICS_KEYS["anonymous"].default  # one of agent.auth.METRICS_ANONYMOUS


METRICS_SOURCE_KINDS = ("agents", "prometheus")
PROMETHEUS_SERIES = ("dcgm", "agent")
#: A Prometheus label name, and a list of label matchers (``a="x", b=~"y.*"``) added to every selector.
LABEL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\\n]|\\.)*"\s*'
MATCHERS_RE = re.compile(rf"^(?:{_MATCHER}(?:,{_MATCHER})*)?\Z")


@dataclass(frozen=True)
class MetricsSourceConfig:
    """Where the controller reads per-job GPU utilization: the agents, or the site's Prometheus."""

    kind: str = METRICS_SOURCE_KEYS["kind"].default  # one of METRICS_SOURCE_KINDS
    url: str = METRICS_SOURCE_KEYS["url"].default
    series: str = METRICS_SOURCE_KEYS["series"].default  # one of PROMETHEUS_SERIES
    window_s: float = METRICS_SOURCE_KEYS["window_s"].default
    timeout_s: float = METRICS_SOURCE_KEYS["timeout_s"].default
    token_file: Path | None = None
    node_label: str = METRICS_SOURCE_KEYS["node_label"].default
    job_label: str = METRICS_SOURCE_KEYS["job_label"].default
    matchers: str = METRICS_SOURCE_KEYS["matchers"].default


@dataclass(frozen=True)
class ControllerConfig:
    interval_s: float = CONTROLLER_KEYS["interval_s"].default
    dry_run: bool = CONTROLLER_KEYS["dry_run"].default
    max_snapshot_age_s: float = CONTROLLER_KEYS["max_snapshot_age_s"].default
    db_url: str = STORE_KEYS["url"].default
    table_prefix: str = STORE_KEYS["table_prefix"].default
    policy_file: Path | None = None
    holder: str = CONTROLLER_KEYS["holder"].default
    lease_ttl_s: float = CONTROLLER_KEYS["lease_ttl_s"].default
    lease_stale_s: float = CONTROLLER_KEYS["lease_stale_s"].default  # 0: 3 x interval_s; see controller/lease.py
    reconcile_interval_s: float = CONTROLLER_KEYS["reconcile_interval_s"].default
    retention_interval_s: float = CONTROLLER_KEYS["retention_interval_s"].default
    accounting_refresh_s: float = CONTROLLER_KEYS["accounting_refresh_s"].default  # controller/shares.py
    hold_heartbeat_s: float = CONTROLLER_KEYS["hold_heartbeat_s"].default  # hold_filter.py
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    extension_env: Mapping[str, str] = field(default_factory=lambda: dict(EXTENSION_KEYS["env"].default))
    extension_qos: str = EXTENSION_KEYS["qos"].default  # "" = the leader's QOS (docs/controller.md)
    notice_grace_s: float = EXTENSION_KEYS["notice_grace_s"].default  # a grow's notice (controller/actuator.py)
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


def parse_controller_config(text: str, source: str = "<string>",
                            warn: Callable[[str], None] | None = None) -> ControllerConfig:
    """``warn`` gets deprecation warnings (default: logged)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: invalid TOML: {e}") from e
    problems = Problems(source, KeyLines(text))
    version = data.pop("version", None)
    if version != CONFIG_VERSION:
        problems.add("version", f"must be {CONFIG_VERSION} (got {version!r})")
    check_sections(data, SECTIONS, problems)
    take_moved(data, problems, warn)
    got = {name: check_table(data.get(name, {}), keys, name, problems) for name, keys in SECTIONS.items()}
    ctl, agents, store, api, ext = got["controller"], got["agents"], got["store"], got["api"], got["extension"]
    if "table_prefix" in store and not PREFIX_RE.match(store["table_prefix"]):
        problems.add("store.table_prefix", "up to 16 lower-case letters, digits or '_', starting with a letter")
    ctl = {**{k: key.default for k, key in CONTROLLER_KEYS.items()}, **ctl}
    if ctl["lease_stale_s"] and not ctl["interval_s"] <= ctl["lease_stale_s"] < ctl["lease_ttl_s"]:
        problems.add("controller.lease_stale_s", f"{ctl['lease_stale_s']:g} must be at least interval_s (a "
                     f"heartbeat per cycle) and below lease_ttl_s ({ctl['lease_ttl_s']:g}), or 0 for 3 x interval_s")
    source_cfg = _metrics_source(got["metrics_source"], problems)
    problems.raise_if_any()
    days = {k: key.default for k, key in RETENTION_KEYS.items()} | got["retention"]
    metrics = {k: key.default for k, key in METRICS_KEYS.items()} | got["metrics"]
    return ControllerConfig(
        interval_s=float(ctl["interval_s"]),
        dry_run=bool(ctl["dry_run"]),
        max_snapshot_age_s=float(ctl["max_snapshot_age_s"]),
        db_url=str(store.get("url", ControllerConfig.db_url)),
        table_prefix=str(store.get("table_prefix", ControllerConfig.table_prefix)),
        policy_file=Path(ctl["policy_file"]) if ctl["policy_file"] else None,
        holder=str(ctl["holder"]),
        lease_ttl_s=float(ctl["lease_ttl_s"]),
        lease_stale_s=float(ctl["lease_stale_s"]),
        reconcile_interval_s=float(ctl["reconcile_interval_s"]),
        retention_interval_s=float(ctl["retention_interval_s"]),
        accounting_refresh_s=float(ctl["accounting_refresh_s"]),
        hold_heartbeat_s=float(ctl["hold_heartbeat_s"]),
        agents=AgentsConfig(**agent_values(agents, AgentsConfig.timeout_s)),
        extension_env=dict(ext.get("env") or EXTENSION_KEYS["env"].default),
        extension_qos=str(ext.get("qos", ControllerConfig.extension_qos)),
        notice_grace_s=float(ext.get("notice_grace_s", ControllerConfig.notice_grace_s)),
        retention=Retention(**{f"{k.removesuffix('_days')}_s": (v * _DAY if v else None) for k, v in days.items()}),
        api=ApiConfig(
            socket=Path(sock) if (sock := api.get("socket", API_KEYS["socket"].default)) else None,
            slurm_user=str(api.get("slurm_user", ApiConfig.slurm_user)),
            operators_group=str(api.get("operators_group", ApiConfig.operators_group)),
            users_see_all=bool(api.get("users_see_all", ApiConfig.users_see_all)),
        ),
        metrics=MetricsConfig(port=int(metrics["port"]), address=str(metrics["address"]),
                              token_file=Path(metrics["token_file"]) if metrics["token_file"] else None,
                              anonymous=str(metrics["anonymous"])),
        metrics_source=source_cfg,
        source=source,
    )


def _metrics_source(raw: Mapping[str, Any], problems: Problems) -> MetricsSourceConfig:
    """[metrics_source], checked beyond types: a known kind and series, a URL for Prometheus, label names and
    matchers that can only ever be label names and matchers inside the PromQL the controller builds."""
    d = MetricsSourceConfig()
    kind, series = raw.get("kind", d.kind), raw.get("series", d.series)
    if kind not in METRICS_SOURCE_KINDS:
        problems.add("metrics_source.kind", f"one of {', '.join(METRICS_SOURCE_KINDS)} (got {kind!r})")
    if series not in PROMETHEUS_SERIES:
        problems.add("metrics_source.series", f"one of {', '.join(PROMETHEUS_SERIES)} (got {series!r})")
    url = str(raw.get("url", "")).rstrip("/")
    if kind == "prometheus" and not url.startswith(("http://", "https://")):
        problems.add("metrics_source.url", "the Prometheus server's http(s) URL is required with kind = "
                     "\"prometheus\" (e.g. \"http://prometheus:9090\")")
    for key in ("node_label", "job_label"):
        if key in raw and not LABEL_NAME_RE.match(raw[key]):
            problems.add(f"metrics_source.{key}", f"a Prometheus label name (letters, digits, '_'), got {raw[key]!r}")
    if "matchers" in raw and not MATCHERS_RE.match(raw["matchers"]):
        problems.add("metrics_source.matchers", f"label matchers such as 'cluster=\"a\", rack=~\"r1.*\"', "
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
