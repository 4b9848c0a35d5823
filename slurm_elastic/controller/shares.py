"""Fair-share weights (sshare) and Slurm GPU limits (sacctmgr) for the policy, cached between cycles.

Both change rarely (an administrator runs sacctmgr), so they are read at most every ``refresh_s`` (controller
config ``accounting_refresh_s``, default 300 s). A read that fails never stops a cycle: it is logged once per
outage, the last good values stay in use (none yet: empty, so fair share weighs accounts equally and no Slurm
GPU limit is applied), and it is tried again after ``min(refresh_s, 60 s)``. Weights and limits fail
independently (sshare asks slurmctld, sacctmgr asks slurmdbd).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, runtime_checkable

from slurm_elastic.policy.gpulimits import scope_key
from slurm_elastic.slurm.accounting import GpuLimits
from slurm_elastic.slurm.errors import SlurmError

log = logging.getLogger(__name__)

RETRY_AFTER_FAILURE_S = 60.0
T = TypeVar("T")


@runtime_checkable
class AccountingReader(Protocol):
    def account_shares(self) -> dict[str, float]: ...
    def gpu_limits(self) -> GpuLimits: ...


def limits_by_scope(limits: GpuLimits) -> dict[str, int]:
    """The policy's ``gpu_limits`` mapping (policy/gpulimits.py) from what sacctmgr said.

    Partition-specific associations are left out (the policy's scopes have no partition); when an account has
    several rows (one per partition, one without), only the one without a partition is used.
    """
    out: dict[str, int] = {}
    for a in limits.assocs:
        if a.partition is not None:
            continue
        key = scope_key("user", a.account, a.user) if a.user else scope_key("account", a.account)
        out[key] = min(a.gpus, out.get(key, a.gpus))
    for q in limits.qos:
        for kind, value in (("qos", q.grp_gpus), ("qos_user", q.per_user_gpus), ("qos_account", q.per_account_gpus)):
            if value is not None:
                out[scope_key(kind, q.name)] = value
    return out


@dataclass
class _Cached(Generic[T]):
    what: str
    value: Mapping[str, T] = field(default_factory=dict)
    next_at: float = 0.0
    failing: bool = False


class AccountingCache:
    """Call :meth:`shares` and :meth:`gpu_limits` every cycle; Slurm is asked only when a refresh is due."""

    def __init__(self, reader: object, refresh_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # A reader without the accounting reads (a test double, another backend) gives empty values.
        self.reader = reader if isinstance(reader, AccountingReader) else None
        self.refresh_s = refresh_s
        self.clock = clock
        self._shares: _Cached[float] = _Cached("fair-share weights (sshare)")
        self._limits: _Cached[int] = _Cached("GPU limits (sacctmgr)")

    def _get(self, cached: _Cached[T], read: Callable[[], Mapping[str, T]]) -> Mapping[str, T]:
        now = self.clock()
        if self.reader is not None and now >= cached.next_at:
            try:
                value = read()
            except SlurmError as e:
                cached.next_at = now + min(self.refresh_s, RETRY_AFTER_FAILURE_S)
                if not cached.failing:
                    cached.failing = True
                    log.warning("cannot read %s, using the last good values (%d entries): %s",
                                cached.what, len(cached.value), e)
            else:
                if cached.failing:
                    log.info("%s readable again", cached.what)
                cached.failing = False
                cached.value = dict(value)
                cached.next_at = now + self.refresh_s
        return cached.value

    def shares(self) -> Mapping[str, float]:
        reader = self.reader
        return self._get(self._shares, lambda: reader.account_shares() if reader else {})

    def gpu_limits(self) -> Mapping[str, int]:
        reader = self.reader
        return self._get(self._limits, lambda: limits_by_scope(reader.gpu_limits()) if reader else {})
