"""What ``status`` says about the controller, from the lease alone (pure).

The controller is "up" only while a holder's lease is valid and its heartbeat (renewed every cycle) is younger
than the holder's own bound; "stale" when the lease is still held but the heartbeat is older (the holder is
probably gone: a successor on its host takes over at once, one elsewhere after that bound, else the TTL ends
it); "down" when nobody holds the lease. A process that answers the API socket is not proof of a working
controller: a restarted or standby controller answers while another holds the lease.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from slurm_elastic.store.records import LeaseRecord


def _s(seconds: float) -> str:
    return f"{seconds:.0f}s" if abs(seconds) >= 10 else f"{seconds:.1f}s"


def controller_state(lease: LeaseRecord | None, now: datetime) -> dict[str, Any]:
    """``controller`` (up, stale or down) with ``controller_detail`` saying why, and the lease holder's
    process and heartbeat age."""
    if lease is None or lease.holder is None:
        return {"controller": "down", "controller_detail": "no controller holds the lease", "lease_holder": None,
                "lease_host": None, "lease_pid": None, "heartbeat_age_s": None, "heartbeat_stale_after_s": None}
    age = lease.heartbeat_age(now).total_seconds()
    bound = None if lease.stale_after is None else lease.stale_after.total_seconds()
    process = lease.process
    out: dict[str, Any] = {"lease_holder": lease.holder, "lease_host": process.host if process else None,
                           "lease_pid": process.pid if process else None, "heartbeat_age_s": round(age, 3),
                           "heartbeat_stale_after_s": bound}
    if not lease.is_held(now):
        expired = (now - lease.expires_at).total_seconds()
        return {**out, "lease_holder": None, "lease_host": None, "lease_pid": None, "controller": "down",
                "controller_detail": f"the lease of {lease.holder} expired {_s(expired)} ago (last heartbeat "
                                     f"{_s(age)} ago)"}
    if lease.is_stale(now):
        left = (lease.expires_at - now).total_seconds()
        return {**out, "controller": "stale",
                "controller_detail": f"the last heartbeat of {lease.holder} is {_s(age)} old (stale after "
                                     f"{_s(bound or 0)}); its lease ends in {_s(left)} unless a successor takes it "
                                     "over sooner"}
    return {**out, "controller": "up", "controller_detail": f"{lease.holder}, heartbeat {_s(age)} ago"}
