"""Holding the controller lease, and taking it before its TTL from a holder that is gone.

The lease row says which process holds it (:class:`~slurm_elastic.store.records.HolderProcess`) and carries its
heartbeat (``renewed_at``, written at every cycle and reconcile) and the holder's own bound on it
(``stale_after``, the ``lease_stale_s`` of the holder's config). A controller that finds the lease held by
another takes it at once, with a new epoch, when it can tell the holder is gone:

* **same host** (same hostname, boot and PID namespace, so its pid means the same process to us): the pid no
  longer exists, is a zombie, or is now another process (its start time differs). A live process is never
  taken, however old its heartbeat: it may be inside a slow Slurm call, and the TTL decides then;
* **another host** (or a holder whose process cannot be checked from here): its heartbeat is older than the
  holder's ``stale_after``. A holder that recorded no bound (an older release) keeps its lease to the TTL.

Fencing still holds: a take-over bumps the epoch, so a holder that was wrongly judged gone (paused, partitioned)
can journal nothing more (store/lease_sql.py).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from slurm_elastic.store.protocols import LeaseStore
from slurm_elastic.store.records import HolderProcess, LeaseRecord

log = logging.getLogger(__name__)

Alive = Callable[[HolderProcess], bool]
PROC = Path("/proc")


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on; None when the process is gone or there is no /proc."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses


def process_start(pid: int, proc: Path = PROC) -> int | None:
    """The process's start time in clock ticks after boot (stat field 22); None if unknown."""
    fields = _stat_fields(pid, proc)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def process_scope(proc: Path = PROC) -> str | None:
    """Where pids compare: this boot of the kernel and this PID namespace. None without /proc."""
    try:
        boot = (proc / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(proc / "self/ns/pid")
    except OSError:
        return None
    return f"{boot} {namespace}"


def this_process(proc: Path = PROC) -> HolderProcess:
    pid = os.getpid()
    return HolderProcess(host=socket.gethostname(), pid=pid, scope=process_scope(proc),
                         start=process_start(pid, proc))


def process_alive(p: HolderProcess, proc: Path = PROC) -> bool:
    """Whether ``p`` (a process in our scope) still runs: the pid exists, is not a zombie, and started when
    ``p`` did (else the pid was reused)."""
    try:
        os.kill(p.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    except OSError as e:
        return e.errno != errno.ESRCH
    fields = _stat_fields(p.pid, proc)
    if fields is None:
        return False  # exited between the two looks
    if fields[0] in ("Z", "X"):
        return False
    return p.start is None or process_start(p.pid, proc) == p.start


def same_scope(a: HolderProcess, b: HolderProcess) -> bool:
    """Whether a pid of ``a`` can be checked from ``b``: same host, same boot, same PID namespace."""
    return a.scope is not None and a.host == b.host and a.scope == b.scope


def takeover_reason(lease: LeaseRecord, me: HolderProcess, now: datetime, alive: Alive) -> str | None:
    """Why ``me`` may take ``lease`` from its holder before the TTL, or None when it must wait. Leases that
    are free or expired are not this function's business (acquire takes them)."""
    if not lease.is_held(now):
        return None
    holder = lease.process
    if holder is not None and same_scope(holder, me):
        if holder == me or alive(holder):
            return None
        return f"its process {holder.pid} on {holder.host} is gone"
    if lease.stale_after is not None and lease.heartbeat_age(now) > lease.stale_after:
        return (f"its heartbeat is {lease.heartbeat_age(now).total_seconds():.1f}s old (stale after "
                f"{lease.stale_after.total_seconds():g}s)")
    return None


def hold_lease(leases: LeaseStore, holder: str, ttl: timedelta, *, process: HolderProcess,
               stale_after: timedelta, now: Callable[[], datetime], alive: Alive = process_alive) -> LeaseRecord | None:
    """Acquire or keep the lease (this is also the heartbeat); else take it from a holder that is gone; else
    None (another controller holds it)."""
    mine = leases.acquire(holder, ttl, process=process, stale_after=stale_after)
    if mine is not None:
        return mine
    seen = leases.get()
    if seen is None:
        return None
    why = takeover_reason(seen, process, now(), alive)
    if why is None:
        return None
    taken = leases.take_over(holder, ttl, seen, process=process, stale_after=stale_after)
    if taken is not None:
        log.warning("took the controller lease from %s (epoch %d) before its TTL: %s", seen.holder, seen.epoch,
                    why)
    return taken
