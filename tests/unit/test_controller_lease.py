"""Taking the controller lease before its TTL: only from a holder that is gone (same host: its process; another
host: its heartbeat), never from a live one, always with a new epoch that fences the old holder out.

The same-host cases use real processes (a child ``sleep`` that is killed, left a zombie, or kept running) and
the real /proc checks; time is the store's fake clock."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import pytest

from slurm_elastic.controller.config import ControllerConfig, parse_controller_config
from slurm_elastic.controller.lease import (
    hold_lease,
    process_alive,
    process_start,
    same_scope,
    takeover_reason,
    this_process,
)
from slurm_elastic.errors import ConfigError
from slurm_elastic.store import HolderProcess, LeaseLostError, LeaseRecord, SqlStore
from tests.unit.storehelpers import FakeClock

TTL = timedelta(seconds=90)
STALE = timedelta(seconds=6)
ME = this_process()

pytestmark = pytest.mark.skipif(ME.scope is None or ME.start is None, reason="needs Linux /proc")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def as_holder(proc: subprocess.Popen[bytes]) -> HolderProcess:
    return HolderProcess(host=ME.host, pid=proc.pid, scope=ME.scope, start=process_start(proc.pid))


def hold(store: SqlStore, holder: str = "me:1", process: HolderProcess = ME) -> LeaseRecord | None:
    return hold_lease(store.lease, holder, TTL, process=process, stale_after=STALE, now=store.now)


def test_this_process_is_alive_and_in_our_scope() -> None:
    assert process_alive(ME) and same_scope(ME, ME)
    assert ME.pid == os.getpid() and ME.start is not None and ME.start > 0


def test_same_host_dead_pid_is_taken_at_once_with_a_new_epoch(store: SqlStore, child: subprocess.Popen[bytes]) -> None:
    old = store.lease.acquire("old:1", TTL, process=as_holder(child), stale_after=STALE)
    assert old is not None
    child.kill()
    child.wait()  # reaped: the pid is gone
    new = hold(store)
    assert new is not None and new.holder == "me:1" and new.epoch == old.epoch + 1 and new.process == ME
    with pytest.raises(LeaseLostError):
        store.lease.check(old.token())  # the old holder, were it somehow alive, can journal nothing
    assert store.lease.renew(old.token(), TTL) is None


def test_same_host_zombie_is_gone(store: SqlStore, child: subprocess.Popen[bytes]) -> None:
    assert store.lease.acquire("old:1", TTL, process=as_holder(child)) is not None
    child.send_signal(signal.SIGKILL)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead but not reaped: a zombie
    assert not process_alive(as_holder(child))
    assert hold(store) is not None


def test_same_host_live_pid_is_never_taken_however_old_its_heartbeat(store: SqlStore, clock: FakeClock,
                                                                    child: subprocess.Popen[bytes]) -> None:
    assert store.lease.acquire("old:1", TTL, process=as_holder(child), stale_after=STALE) is not None
    clock.advance(60)  # heartbeat 10x past its bound, lease not expired: a live process may be in a slow call
    assert hold(store) is None
    clock.advance(30)  # the TTL still decides
    taken = hold(store)
    assert taken is not None and taken.holder == "me:1"


def test_same_host_reused_pid_is_gone(store: SqlStore, child: subprocess.Popen[bytes]) -> None:
    """The pid runs, but a process that started at another time: the holder itself is gone."""
    ghost = replace(as_holder(child), start=(process_start(child.pid) or 0) + 1)
    assert store.lease.acquire("old:1", TTL, process=ghost) is not None
    assert process_alive(as_holder(child)) and not process_alive(ghost)
    assert hold(store) is not None


def test_other_host_fresh_heartbeat_is_not_taken(store: SqlStore, clock: FakeClock) -> None:
    remote = HolderProcess(host="other-host", pid=ME.pid, scope="another-boot pid:[1]", start=ME.start)
    assert store.lease.acquire("other:1", TTL, process=remote, stale_after=STALE) is not None
    clock.advance(STALE.total_seconds())  # exactly at the bound: not past it
    assert hold(store) is None


def test_other_host_stale_heartbeat_is_taken(store: SqlStore, clock: FakeClock) -> None:
    remote = HolderProcess(host="other-host", pid=ME.pid, scope="another-boot pid:[1]", start=ME.start)
    old = store.lease.acquire("other:1", TTL, process=remote, stale_after=STALE)
    assert old is not None
    clock.advance(STALE.total_seconds() + 0.001)
    new = hold(store)
    assert new is not None and new.epoch == old.epoch + 1
    with pytest.raises(LeaseLostError):
        store.lease.check(old.token())


def test_same_hostname_in_another_pid_namespace_counts_as_another_host(store: SqlStore, clock: FakeClock) -> None:
    """A pid from another container (or an earlier boot) says nothing here: only the heartbeat decides."""
    elsewhere = replace(ME, pid=2**22 + 1, scope="another-boot pid:[1]")  # no such pid here
    assert store.lease.acquire("twin:1", TTL, process=elsewhere, stale_after=STALE) is not None
    assert hold(store) is None
    clock.advance(7)
    assert hold(store) is not None


def test_holder_without_a_heartbeat_bound_keeps_its_lease_to_the_ttl(store: SqlStore, clock: FakeClock) -> None:
    """A holder of an older release recorded no process and no bound: wait for the TTL as before."""
    assert store.lease.acquire("old:1", TTL) is not None
    clock.advance(89)
    assert hold(store) is None
    clock.advance(1)
    assert hold(store) is not None


def test_a_second_process_under_the_same_holder_name_is_another_holder(
        store: SqlStore, child: subprocess.Popen[bytes]) -> None:
    """A configured holder name is shared by a restarted controller: the process tells them apart, and the
    newcomer gets a new epoch only once the first is gone."""
    first = store.lease.acquire("ctl-a", TTL, process=as_holder(child), stale_after=STALE)
    assert first is not None
    assert hold(store, "ctl-a") is None  # the first one runs
    child.kill()
    child.wait()
    second = hold(store, "ctl-a")
    assert second is not None and second.epoch == first.epoch + 1
    again = hold(store, "ctl-a")  # the heartbeat of the same process keeps the epoch
    assert again is not None and again.epoch == second.epoch


def test_take_over_loses_to_a_renewal_in_between(store: SqlStore, clock: FakeClock) -> None:
    """The holder renewed after the successor looked: it lives, and the take-over changes nothing."""
    remote = HolderProcess(host="other-host", pid=1, scope=None)
    old = store.lease.acquire("other:1", TTL, process=remote, stale_after=STALE)
    assert old is not None
    clock.advance(10)
    seen = store.lease.get()
    assert seen is not None and takeover_reason(seen, ME, clock(), process_alive) is not None
    assert store.lease.renew(old.token(), TTL) is not None  # the holder's heartbeat comes in
    assert store.lease.take_over("me:1", TTL, seen, process=ME, stale_after=STALE) is None
    current = store.lease.get()
    assert current is not None and current.holder == "other:1" and current.epoch == old.epoch


def test_the_reason_says_why(store: SqlStore, clock: FakeClock) -> None:
    remote = HolderProcess(host="other-host", pid=1, scope=None)
    assert store.lease.acquire("other:1", TTL, process=remote, stale_after=STALE) is not None
    clock.advance(12.5)
    seen = store.lease.get()
    assert seen is not None
    assert takeover_reason(seen, ME, clock(), process_alive) == "its heartbeat is 12.5s old (stale after 6s)"
    gone = replace(seen, process=replace(ME, pid=2**22 + 1))
    assert takeover_reason(gone, ME, clock(), lambda p: False) == f"its process {2**22 + 1} on {ME.host} is gone"
    clock.advance(100)  # expired: acquire's business, not a take-over
    assert takeover_reason(seen, ME, clock(), process_alive) is None


def test_a_restarted_controller_acts_in_its_first_cycle_after_the_old_one_died(
        store: SqlStore, clock: FakeClock, child: subprocess.Popen[bytes]) -> None:
    """The controller's cycle goes through hold_lease: it waits while the old process lives, and runs its first
    cycle as soon as it is gone, with the TTL far from over."""
    from slurm_elastic.controller.cycle import Controller
    from tests.unit.slurm_replay import recorded_cli
    from tests.unit.test_controller_cycle import POLICY, Agents

    old = store.lease.acquire("host:1", TTL, process=as_holder(child), stale_after=STALE)
    assert old is not None
    slurm, replies = recorded_cli("silent_agent")  # a cycle's Slurm replies, recorded from the live cluster
    # The recorded snapshot is stamped with the host's time, the cycle with the fake clock's.
    cfg = ControllerConfig(interval_s=2.0, holder="host:2", max_snapshot_age_s=86400)
    ctl = Controller(cfg, POLICY, slurm=slurm, store=store, collector=Agents(clock), clock=clock)
    assert ctl.run_cycle().skipped == "not the lease holder"
    assert replies.calls == []  # it waited without asking Slurm
    child.kill()
    child.wait()
    clock.advance(2)
    summary = ctl.run_cycle()
    assert summary.skipped is None and summary.error is None and summary.cycle_id is not None
    replies.check()
    assert ["squeue", "--all", "--json"] in replies.calls  # the cycle took its snapshot from Slurm
    lease = store.lease.get()
    assert lease is not None and lease.holder == "host:2" and lease.epoch == old.epoch + 1
    assert lease.process == ME and lease.stale_after == timedelta(seconds=6)  # 3 x interval_s


@pytest.mark.parametrize(("text", "stale_s"), [
    ("interval_s = 30", 90.0),  # 3 x interval_s, and at most the TTL
    ("interval_s = 5\nlease_ttl_s = 60", 15.0),
    ("interval_s = 50\nlease_ttl_s = 90", 90.0),
    ("interval_s = 5\nlease_stale_s = 12", 12.0),
])
def test_lease_stale_after_defaults_to_three_cycles(text: str, stale_s: float) -> None:
    cfg = parse_controller_config(f"version = 1\n[controller]\n{text}\n")
    assert cfg.lease_stale_after_s == stale_s


@pytest.mark.parametrize("text", ["interval_s = 5\nlease_stale_s = 90", "interval_s = 5\nlease_stale_s = 4",
                                  "lease_stale_s = -1"])
def test_lease_stale_s_out_of_range_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="lease_stale_s"):
        parse_controller_config(f"version = 1\n[controller]\n{text}\n", source="controller.toml")
