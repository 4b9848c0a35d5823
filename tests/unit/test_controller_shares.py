"""The controller's cache of sshare weights and sacctmgr GPU limits (controller/shares.py)."""

from __future__ import annotations

import logging

import pytest

from slurm_elastic.controller.config import parse_controller_config
from slurm_elastic.controller.shares import AccountingCache, limits_by_scope
from slurm_elastic.slurm.accounting import AssocGpuLimit, GpuLimits, QosGpuLimit
from slurm_elastic.slurm.errors import SlurmCommandError, SlurmTransientError


class Reader:
    def __init__(self) -> None:
        self.shares: dict[str, float] = {"nlp": 0.5, "vision": 0.25}
        self.limits = GpuLimits(assocs=(AssocGpuLimit("vision", None, None, 8),))
        self.fail: Exception | None = None
        self.calls = 0

    def account_shares(self) -> dict[str, float]:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return dict(self.shares)

    def gpu_limits(self) -> GpuLimits:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return self.limits


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_reads_once_per_refresh_interval() -> None:
    reader, clock = Reader(), Clock()
    cache = AccountingCache(reader, refresh_s=300, clock=clock)
    assert cache.shares() == {"nlp": 0.5, "vision": 0.25}
    assert cache.gpu_limits() == {"account:vision": 8}
    reader.shares = {"nlp": 1.0}
    clock.t += 299
    assert cache.shares() == {"nlp": 0.5, "vision": 0.25} and reader.calls == 2
    clock.t += 1
    assert cache.shares() == {"nlp": 1.0} and reader.calls == 3


def test_a_failing_read_keeps_the_last_good_values_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    reader, clock = Reader(), Clock()
    cache = AccountingCache(reader, refresh_s=300, clock=clock)
    assert cache.shares() == {"nlp": 0.5, "vision": 0.25}
    reader.fail = SlurmTransientError(["sshare"], 1, "Unable to contact slurm controller")
    with caplog.at_level(logging.WARNING, logger="slurm_elastic.controller.shares"):
        for _ in range(5):
            clock.t += 300
            assert cache.shares() == {"nlp": 0.5, "vision": 0.25}
    assert len([r for r in caplog.records if "cannot read fair-share weights" in r.getMessage()]) == 1
    # A failed read is tried again after at most 60 s, not after the whole refresh interval.
    reader.fail, reader.shares = None, {"vision": 1.0}
    clock.t += 60
    assert cache.shares() == {"vision": 1.0}


def test_never_read_and_failing_gives_empty_values() -> None:
    reader = Reader()
    reader.fail = SlurmCommandError(["sacctmgr"], 1, "sacctmgr: error: Problem talking to the database")
    cache = AccountingCache(reader, clock=Clock())
    assert cache.shares() == {} and cache.gpu_limits() == {}


def test_a_reader_without_accounting_reads_gives_empty_values() -> None:
    cache = AccountingCache(object(), clock=Clock())
    assert cache.shares() == {} and cache.gpu_limits() == {}


def test_limits_by_scope() -> None:
    limits = GpuLimits(
        assocs=(AssocGpuLimit("vision", None, None, 8), AssocGpuLimit("vision", "bob", None, 6),
                AssocGpuLimit("nlp", None, "serve", 2)),  # partition-specific: not a policy scope
        qos=(QosGpuLimit("scavenger", 4, 2, 3), QosGpuLimit("high", None, 1, None)),
    )
    assert limits_by_scope(limits) == {"account:vision": 8, "user:vision/bob": 6, "qos:scavenger": 4,
                                       "qos_user:scavenger": 2, "qos_account:scavenger": 3, "qos_user:high": 1}


def test_refresh_interval_is_a_controller_setting() -> None:
    assert parse_controller_config("version = 1\n").accounting_refresh_s == 300
    cfg = parse_controller_config("version = 1\n[controller]\naccounting_refresh_s = 30\n")
    assert cfg.accounting_refresh_s == 30
    with pytest.raises(Exception, match="accounting_refresh_s"):
        parse_controller_config("version = 1\n[controller]\naccounting_refresh_s = 0\n")
