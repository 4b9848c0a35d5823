"""One daemon cycle as the controller's metrics see it: its duration, result, lease state, GPU totals and agent
staleness (the daemon's loop; beside the cycle and the metrics, which do not know each other)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

from slurm_elastic.controller.cycle import Controller, CycleSummary
from slurm_elastic.store.errors import StoreError

log = logging.getLogger("slurm_elastic.controller.metrics")


def observe_cycle(ctl: Controller, run: Callable[[], CycleSummary], started: datetime) -> CycleSummary:
    """Run one cycle (``run``) and record its duration, result, lease state, GPU totals and agent staleness."""
    m = ctl.metrics
    t0 = time.monotonic()
    summary = run()
    if m is None:
        return summary
    m.cycles.labels("error" if summary.error else "skipped" if summary.skipped else "ok").inc()
    m.cycle_duration.observe(time.monotonic() - t0)
    m.last_cycle.set(time.time())
    try:
        lease = ctl.store.lease.get()
        now = ctl.clock()
        held = lease is not None and lease.holder == ctl.cfg.holder_name and lease.expires_at > now
        m.lease(lease.epoch if held and lease is not None else None)
        totals = ctl.store.journal.gpu_totals(since=started)
        m.gpu_totals(totals.granted, totals.reclaimed)
        m.agents(ctl.store.agents.list_agents(), now)
    except StoreError as e:
        log.warning("metrics: cannot read the store: %s", e)
    return summary
