"""The controller's Prometheus metrics, on their own registry (tests build their own; nothing global).

Served over HTTP on ``[metrics] address:port`` of controller.toml (127.0.0.1:9818 by default; port 0 disables).
Counters only grow while the process lives; gauges describe the latest cycle. Per-job series are reset every
cycle, so ended jobs vanish. They carry job ids and user names, so they live on a registry of their own and only
a scraper with the metrics token sees them (:class:`~slurm_elastic.agent.auth.MetricsAccess`); ``public_registry``
is what a scraper without it gets."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from slurm_elastic.agent.auth import MetricsAccess
from slurm_elastic.agent.errors import AuthError
from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.policy import Decision, ElasticUnit, JobUtilization
from slurm_elastic.slurm.model import ClusterSnapshot, Job
from slurm_elastic.store.errors import StoreError
from slurm_elastic.store.records import AgentRecord

log = logging.getLogger(__name__)

PREFIX = "slurm_elastic_controller"


class _Union(Collector):
    def __init__(self, *registries: CollectorRegistry) -> None:
        self._registries = registries

    def collect(self) -> Iterable[Metric]:
        for registry in self._registries:
            yield from registry.collect()


#: Job completion and wait buckets (s): a minute to a week.
_JOB_BUCKETS = (60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400, 259200, 604800)
_ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
                    "OUT_OF_MEMORY"})


class ControllerMetrics:
    """``registry``: every series; ``public_registry``: those without job ids and user names."""

    def __init__(self) -> None:
        self.public_registry = r = CollectorRegistry()
        self._per_job_registry = CollectorRegistry()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Union(self.public_registry, self._per_job_registry))
        self.cycle_duration = Histogram(f"{PREFIX}_cycle_duration_seconds", "Duration of one controller cycle.",
                                        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=r)
        self.cycles = Counter(f"{PREFIX}_cycles", "Cycles run, by result (ok, skipped, error).", ["result"],
                              registry=r)
        self.last_cycle = Gauge(f"{PREFIX}_last_cycle_timestamp_seconds", "End of the latest cycle.", registry=r)
        self.decisions = Counter(f"{PREFIX}_decisions", "Decisions taken, by action and reason (every unit, every "
                                 "cycle, holds included, whether or not the hold was stored).", ["action", "reason"],
                                 registry=r)
        self.holds_unchanged = Counter(f"{PREFIX}_holds_unchanged", "Holds not stored: nothing that matters "
                                       "changed since the unit's last stored hold (controller/hold_filter.py).",
                                       registry=r)
        self.actions = Counter(f"{PREFIX}_actions", "Actions the controller carried out, by kind and outcome.",
                               ["action", "outcome"], registry=r)
        self.admits = Counter(f"{PREFIX}_admits", "Pending jobs a shrink-to-admit was for, by what became of them "
                              "(started, not_started within the verify time, gone).", ["outcome"], registry=r)
        self.managed_jobs = Gauge(f"{PREFIX}_managed_jobs", "Elastic units seen in the latest cycle.", registry=r)
        self.gpus_granted = Counter(f"{PREFIX}_gpus_granted", "GPUs that joined jobs: applied grows whose "
                                    "extension joined (failed prewarms and resumes grant nothing).", registry=r)
        self.gpus_reclaimed = Counter(f"{PREFIX}_gpus_reclaimed", "GPUs released by applied shrinks (their "
                                      "cancelled extensions included) and extension cancels.", registry=r)
        self.scrape_errors = Counter(f"{PREFIX}_agent_scrape_errors", "Failed agent scrapes, by node.", ["node"],
                                     registry=r)
        self.agent_staleness = Gauge(f"{PREFIX}_agent_staleness_seconds",
                                     "Seconds since the agent was last scraped successfully.", ["node"], registry=r)
        self.lease_held = Gauge(f"{PREFIX}_lease_held", "1 while this controller holds the lease (acts).",
                                registry=r)
        self.lease_epoch = Gauge(f"{PREFIX}_lease_epoch", "Fencing epoch of the lease this controller holds.",
                                 registry=r)
        self.job_nodes = Gauge("slurm_elastic_job_nodes", "Nodes of an elastic unit (leader and extensions).",
                               ["jobid", "user", "partition"], registry=self._per_job_registry)
        self.job_util = Gauge("slurm_elastic_job_utilization_percent",
                              "Window mean GPU utilization of an elastic unit, as the policy saw it.",
                              ["jobid", "user", "partition"], registry=self._per_job_registry)
        self.pending_wait = Gauge("slurm_elastic_pending_wait_seconds",
                                  "Longest wait of a pending job, by partition.", ["partition"], registry=r)
        self.pending_jobs = Gauge("slurm_elastic_pending_jobs", "Pending jobs, by partition.", ["partition"],
                                  registry=r)
        # Finished jobs (squeue lists them for MinJobAge after their end), once each; no job ids, so public.
        self.job_completion = Histogram("slurm_elastic_job_completion_seconds",
                                        "Completion time (end - submission) of finished jobs, by partition and "
                                        "whether they were elastic.", ["partition", "elastic"],
                                        buckets=_JOB_BUCKETS, registry=r)
        self.job_wait = Histogram("slurm_elastic_job_wait_seconds", "Queue wait (start - submission) of finished "
                                  "jobs, by partition and whether they were elastic.", ["partition", "elastic"],
                                  buckets=_JOB_BUCKETS, registry=r)
        self._finished: set[int] = set()
        self._gpu_totals: tuple[int, int] | None = None

    def lease(self, epoch: int | None) -> None:
        self.lease_held.set(0 if epoch is None else 1)
        if epoch is not None:
            self.lease_epoch.set(epoch)

    def gpu_totals(self, granted: int, reclaimed: int) -> None:
        """Totals from the journal since start: the counters grow by the difference."""
        if self._gpu_totals is not None:
            self.gpus_granted.inc(max(0, granted - self._gpu_totals[0]))
            self.gpus_reclaimed.inc(max(0, reclaimed - self._gpu_totals[1]))
        else:
            self.gpus_granted.inc(granted)
            self.gpus_reclaimed.inc(reclaimed)
        self._gpu_totals = (granted, reclaimed)

    def agents(self, records: Iterable[AgentRecord], now: datetime) -> None:
        self.agent_staleness.clear()
        for a in records:
            if a.last_seen is not None:
                self.agent_staleness.labels(a.node).set(max(0.0, (now - a.last_seen).total_seconds()))

    def jobs(self, rows: Iterable[tuple[int, str, str, int, float | None]]) -> None:
        """(unit id, user, partition, nodes, utilization or None) per unit of the latest cycle."""
        self.job_nodes.clear()
        self.job_util.clear()
        n = 0
        for job_id, user, partition, nodes, util in rows:
            n += 1
            self.job_nodes.labels(str(job_id), user, partition).set(nodes)
            if util is not None:
                self.job_util.labels(str(job_id), user, partition).set(util)
        self.managed_jobs.set(n)

    def finished(self, jobs: Iterable[Job], is_elastic: Callable[[int], bool]) -> None:
        """Observe the completion time and wait of each job that ran and ended, once: in the first cycle that
        sees it ended (a restarted controller observes again the ended jobs squeue still lists). Het components
        count once, as their leader. A job cancelled while it waited never ran: Slurm (22.05) gives it a start
        time (the cancel's) but no nodes."""
        listed: set[int] = set()
        for j in jobs:
            if (j.state not in _ENDED or j.submit_time is None or j.start_time is None or j.end_time is None
                    or j.end_time < j.start_time or (j.het_job_offset or 0) > 0 or not j.nodes):
                continue
            listed.add(j.job_id)
            if j.job_id in self._finished:
                continue
            try:
                elastic = "true" if is_elastic(j.job_id) else "false"
            except StoreError as e:
                log.warning("metrics: cannot tell whether job %d was elastic: %s", j.job_id, e)
                listed.discard(j.job_id)  # tried again next cycle
                continue
            self.job_completion.labels(j.partition, elastic).observe((j.end_time - j.submit_time).total_seconds())
            self.job_wait.labels(j.partition, elastic).observe(max(0.0, (j.start_time - j.submit_time)
                                                                   .total_seconds()))
        self._finished = listed  # forget the jobs squeue no longer lists

    def pending(self, waits: Mapping[str, list[float]]) -> None:
        self.pending_wait.clear()
        self.pending_jobs.clear()
        for partition, w in waits.items():
            self.pending_jobs.labels(partition).set(len(w))
            self.pending_wait.labels(partition).set(max(w) if w else 0.0)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Scrapes are not logged (a 401 is, by the app)."""


def metrics_app(metrics: ControllerMetrics, access: MetricsAccess) -> Callable[..., Iterable[bytes]]:
    """The WSGI app of ``/metrics``: prometheus_client's own app over the view the credentials allow."""
    views = {"full": make_wsgi_app(metrics.registry), "reduced": make_wsgi_app(metrics.public_registry)}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        try:
            view = access.view(environ.get("HTTP_AUTHORIZATION"))
        except AuthError as e:
            log.info("metrics: 401 for %s: %s", environ.get("REMOTE_ADDR"), e.reason)
            start_response("401 Unauthorized", [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("WWW-Authenticate", f'Bearer realm="slurm-elastic metrics", error="{e.reason}"')])
            return [f"unauthorized: {e.reason}\n".encode()]
        return views[view](environ, start_response)  # type: ignore[no-any-return]

    return app


def serve_metrics(metrics: ControllerMetrics, access: MetricsAccess, address: str, port: int) -> WSGIServer:
    """Serves ``/metrics`` from a daemon thread (prometheus_client's threading WSGI server, as its own
    ``start_http_server``, with the credential check in front). Raises OSError when it cannot listen."""
    family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    httpd = make_server(address, port, metrics_app(metrics, access), Server, handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True).start()
    return httpd


def cycle_metrics(m: ControllerMetrics, snap: ClusterSnapshot, units: Sequence[ElasticUnit],
                  utilization: Mapping[int, JobUtilization], decisions: Sequence[Decision], *, now: datetime,
                  has_spec: Callable[[int], bool]) -> None:
    """A cycle's per-decision counters and per-job series (``has_spec``: whether a job id is an elastic job's)."""
    for d in decisions:
        m.decisions.labels(str(d.action), str(d.reason)).inc()
    m.jobs((u.unit_id, u.job.user, u.job.partition, u.current_nodes,
            utilization[u.unit_id].mean_util if u.unit_id in utilization else None) for u in units)
    waits: dict[str, list[float]] = {}
    for j in snap.jobs:
        if j.is_pending and j.submit_time is not None and parse_tag(j.comment) is None:
            waits.setdefault(j.partition, []).append(max(0.0, (now - j.submit_time).total_seconds()))
    m.pending(waits)
    m.finished((j for j in snap.jobs if parse_tag(j.comment) is None), has_spec)  # extensions are their parent's

