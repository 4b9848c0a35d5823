"""``slurm-elastic controller``: APScheduler jobs around :class:`~slurm_elastic.controller.cycle.Controller`.

Jobs: ``cycle`` (collect from the agents concurrently, decide, act) every ``interval_s``; ``reconcile`` every
``reconcile_interval_s`` (and once at start); ``retention`` every ``retention_interval_s``. They run on a single
worker thread, so they never overlap. SIGHUP reloads the config and the policy; SIGTERM/SIGINT let the running
cycle finish and exit. Logs go to stderr (journald).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from wsgiref.simple_server import WSGIServer

from slurm_elastic.agent.auth import MetricsAccess, load_token
from slurm_elastic.agent.client import client_auth
from slurm_elastic.api.server import ApiServer
from slurm_elastic.controller.actuator import Actuator, FaultHook
from slurm_elastic.controller.collect import CollectResult, collect_sync
from slurm_elastic.controller.config import ControllerConfig, load_controller_config
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.controller.cycle_stats import observe_cycle
from slurm_elastic.controller.metrics import ControllerMetrics, serve_metrics
from slurm_elastic.controller.ports import AgentCollector, ControllerStore
from slurm_elastic.controller.prometheus import PrometheusSource
from slurm_elastic.errors import ConfigError, SlurmElasticError
from slurm_elastic.policy import PolicyConfig, default_config, parse_config
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.store import SqlStore

log = logging.getLogger(__name__)


class OverlapSummary(logging.Filter):
    """APScheduler warns "maximum number of running instances reached" on every interval while a run is still
    going (a Slurm outage makes squeue block). The controller logs the outage itself, once; this filter lets one
    such warning through per ``every_s`` and says how many it held back since."""

    def __init__(self, every_s: float = 600.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self._last: float | None = None
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "maximum number of running instances reached" not in record.getMessage():
            return True
        now = self.clock()
        if self._last is not None and now - self._last < self.every_s:
            self.suppressed += 1
            return False
        if self.suppressed:
            record.msg = f"{record.msg} ({self.suppressed} more since the last such warning)"
        self._last, self.suppressed = now, 0
        return True


def read_policy_file(cfg: ControllerConfig) -> PolicyConfig | None:
    """The policy file, validated (None when none is configured); ConfigError when it cannot be read or is
    wrong. The controller checks it before it opens the state DB, so a refused start leaves no DB behind."""
    if cfg.policy_file is None:
        return None
    try:
        text = cfg.policy_file.read_text()
    except OSError as e:
        raise ConfigError(f"{cfg.policy_file}: cannot read: {e.strerror}") from e
    return parse_config(text, source=str(cfg.policy_file))


def load_policy(cfg: ControllerConfig, store: ControllerStore,
                from_file: PolicyConfig | None = None) -> tuple[PolicyConfig, str]:
    """The newest policy version stored with ``policy set``, else the policy file (``from_file`` when already
    read), else the packaged defaults."""
    current = store.policies.current_policy()
    if current is not None:
        return parse_config(current.toml_text, source=f"policy version {current.version}"), \
            f"policy version {current.version}"
    policy = from_file if from_file is not None else read_policy_file(cfg)
    if policy is not None:
        return policy, str(cfg.policy_file)
    return default_config(), "packaged defaults"


def restrict_sqlite_file(url: str) -> None:
    """The state DB is for the controller (and root) only: users go through the API, which checks who they are."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        db = make_url(url)
    except ArgumentError:  # SqlStore.open already accepted it; nothing to restrict
        return
    if db.get_backend_name() == "sqlite" and db.database and db.database != ":memory:":
        try:
            os.chmod(db.database, 0o600)
        except OSError as e:
            log.warning("cannot make %s private (0600): %s", db.database, e.strerror)


def start_api(cfg: ControllerConfig) -> ApiServer | None:
    """The local API (its own store connection: requests never share a session with the cycle)."""
    from slurm_elastic.api.authz import AccessPolicy
    from slurm_elastic.api.service import DEFAULT_POLICY_TEXT, Service, ServiceSettings

    if cfg.api.socket is None:
        return None

    def base_policy() -> tuple[str, str]:
        if cfg.policy_file is not None:
            try:
                return cfg.policy_file.read_text(), str(cfg.policy_file)
            except OSError as e:
                raise ConfigError(f"{cfg.policy_file}: cannot read: {e.strerror}") from e
        return DEFAULT_POLICY_TEXT, "packaged defaults"

    settings = ServiceSettings(
        access=AccessPolicy(slurm_user=cfg.api.slurm_user, operators_group=cfg.api.operators_group,
                            users_see_all=cfg.api.users_see_all),
        agent_stale_s=max(3 * cfg.interval_s, 30.0), base_policy=base_policy, via="socket", holder=cfg.holder_name)
    try:
        server = ApiServer(cfg.api.socket, Service(SqlStore.open(cfg.db_url, table_prefix=cfg.table_prefix), settings))
    except (SlurmElasticError, OSError) as e:  # the control loop goes on; the CLI says the controller is unreachable
        log.error("API: cannot serve %s: %s; running without the local API", cfg.api.socket, e)
        return None
    server.start()
    return server


def build_controller(cfg: ControllerConfig) -> Controller:
    """Everything from config; raises ConfigError (the only start-up failure) on bad config or key file."""
    collector = build_collector(cfg)
    from_file = read_policy_file(cfg)  # every check that may refuse the start comes before the DB is created
    store = SqlStore.open(cfg.db_url, table_prefix=cfg.table_prefix, timeout_s=cfg.db_timeout_s)
    restrict_sqlite_file(cfg.db_url)
    policy, source = load_policy(cfg, store, from_file)
    log.info("policy from %s; dry_run=%s; interval %.1fs", source, cfg.dry_run, cfg.interval_s)

    slurm = SlurmCli(topology=True)  # grows prefer the job's leaf switch (policy/topology.py)
    actuator = Actuator(slurm, store, cfg.extension_env, fault=_fault_hook_from_env(),
                        extension_qos=cfg.extension_qos)
    return Controller(cfg, policy, slurm=slurm, store=store, collector=collector, actuator=actuator,
                      metrics=ControllerMetrics())


def build_collector(cfg: ControllerConfig) -> AgentCollector:
    """The metrics source ``[metrics_source] kind`` names: the agents' fan-out (needs the agents' key) or the
    site's Prometheus (controller/prometheus.py; its bearer token, if any, is read like the metrics token)."""
    source = cfg.metrics_source
    if source.kind == "prometheus":
        token = load_token(source.token_file) if source.token_file is not None else None
        log.info("metrics source: Prometheus %s (%s series)", source.url, source.series)
        return PrometheusSource(source, token=token)
    a = cfg.agents
    auth = client_auth(a.auth, key_file=a.key_file, munge_socket=a.munge_socket, munge_agent_user=a.munge_agent_user,
                       munge_ttl_s=a.munge_ttl_s, source=str(cfg.source))
    log.info("agents: requests authenticated with %s", auth.scheme)

    def collector(agents: Mapping[str, str]) -> CollectResult:
        return collect_sync(agents, auth, timeout_s=cfg.agents.timeout_s)

    return collector


def start_metrics(cfg: ControllerConfig, metrics: ControllerMetrics | None) -> WSGIServer | None:
    """Serves /metrics. A bad token file stops start-up (a configuration error); a port that cannot be bound
    does not."""
    if metrics is None or cfg.metrics.port == 0:
        return None
    token = load_token(cfg.metrics.token_file) if cfg.metrics.token_file is not None else None
    access = MetricsAccess(token, cfg.metrics.anonymous)
    try:
        server = serve_metrics(metrics, access, cfg.metrics.address, cfg.metrics.port)
    except OSError as e:  # observability must not stop the control loop: say so loudly and go on
        log.error("metrics: cannot listen on %s:%d: %s; running without /metrics", cfg.metrics.address,
                  cfg.metrics.port, e.strerror or e)
        return None
    log.info("metrics on http://%s:%d/metrics (without a token: %s)", cfg.metrics.address, cfg.metrics.port,
             access.anonymous)
    return server


def _fault_hook_from_env() -> FaultHook:
    """Test-only crash injection: SLURM_ELASTIC_TEST_CRASH_AT=<step> makes the process SIGKILL itself at that
    step (e.g. ``grow:after-intent``, ``grow:after-submit``, ``shrink:after-intent``, ``shrink:after-signal``),
    so tests can prove that reconcile recovers from a crash between intent and outcome. Unset in production."""
    target = os.environ.get("SLURM_ELASTIC_TEST_CRASH_AT")
    if not target:
        return lambda step: None

    def hook(step: str) -> None:
        if step == target:
            log.warning("test crash hook: SIGKILL at %s", step)
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def run(config_path: Path, *, once: bool = False, dry_run: bool | None = None) -> int:
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.blocking import BlockingScheduler

    cfg = load_controller_config(config_path)
    if dry_run is not None:
        cfg = replace(cfg, dry_run=dry_run)
    ctl = build_controller(cfg)
    if once:
        ctl.reconcile()
        summary = ctl.run_cycle()
        return 1 if summary.error else 0
    start_metrics(cfg, ctl.metrics)  # first: a bad token file stops start-up before the API socket exists
    api = start_api(cfg)
    started = datetime.now(tz=UTC)
    ctl.reconcile()
    sched = BlockingScheduler(executors={"default": ThreadPoolExecutor(1)}, timezone="UTC")
    overlap = OverlapSummary()
    logging.getLogger("apscheduler.scheduler").addFilter(overlap)
    lock = threading.Lock()

    def cycle() -> None:
        with lock:
            observe_cycle(ctl, ctl.run_cycle, started)

    def reconcile() -> None:
        with lock:
            ctl.reconcile()

    def retention() -> None:
        with lock:
            ctl.store.retention.prune(ctl.cfg.retention)

    common = {"max_instances": 1, "coalesce": True, "misfire_grace_time": None}
    sched.add_job(cycle, "interval", seconds=cfg.interval_s, id="cycle", next_run_time=datetime.now(tz=UTC),
                  **common)
    sched.add_job(reconcile, "interval", seconds=cfg.reconcile_interval_s, id="reconcile", **common)
    sched.add_job(retention, "interval", seconds=cfg.retention_interval_s, id="retention", **common)

    def on_hup(signum: int, frame: FrameType | None) -> None:
        def reload() -> None:
            with lock:
                try:
                    new_cfg = load_controller_config(config_path)
                    ctl.cfg = new_cfg if dry_run is None else replace(new_cfg, dry_run=dry_run)
                    ctl.actuator.extension_qos = ctl.cfg.extension_qos
                    ctl.policy, source = load_policy(ctl.cfg, ctl.store)
                    current = ctl.store.policies.current_policy()
                    ctl.policy_version = current.version if current else None
                    log.info("reloaded config %s and policy from %s", config_path, source)
                except ConfigError as e:
                    log.error("reload refused, keeping the running config: %s", e)
        threading.Thread(target=reload, name="reload", daemon=True).start()

    def on_term(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: finishing the current cycle, then exiting", signum)
        threading.Thread(target=lambda: sched.shutdown(wait=True), name="shutdown", daemon=True).start()

    signal.signal(signal.SIGHUP, on_hup)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    log.info("controller %s started", cfg.holder_name)
    try:
        sched.start()
    finally:
        if api is not None:
            api.stop()
    log.info("controller stopped")
    return 0
