"""`slurm-elastic status` tells the truth about the controller: "up" only while the lease holder's heartbeat is
fresh, "stale" when it stopped beating, "down" when nobody holds the lease; a controller answering the socket
while another holds the lease says it is a standby."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner

from slurm_elastic.api.authz import Caller
from slurm_elastic.api.lease_status import controller_state
from slurm_elastic.api.service import Service, ServiceSettings
from slurm_elastic.cli import main
from slurm_elastic.store import HolderProcess, SqlStore, sqlite_url
from tests.unit.storehelpers import FakeClock, file_store, memory_store

TTL = timedelta(seconds=90)
STALE = timedelta(seconds=6)
PROC = HolderProcess(host="ctl1", pid=4242, scope="b n", start=7)
ROOT = Caller(0, "root")


def held(clock: FakeClock) -> SqlStore:
    store = memory_store(clock)
    assert store.lease.acquire("ctl1:4242", TTL, process=PROC, stale_after=STALE) is not None
    return store


def test_no_lease_is_down(clock: FakeClock) -> None:
    s = controller_state(None, clock())
    assert (s["controller"], s["controller_detail"], s["lease_holder"]) == (
        "down", "no controller holds the lease", None)


def test_fresh_heartbeat_is_up_with_holder_process_and_age(clock: FakeClock) -> None:
    store = held(clock)
    clock.advance(5.5)
    s = controller_state(store.lease.get(), clock())
    assert s["controller"] == "up" and s["lease_holder"] == "ctl1:4242"
    assert (s["lease_host"], s["lease_pid"], s["heartbeat_age_s"], s["heartbeat_stale_after_s"]) == (
        "ctl1", 4242, 5.5, 6.0)


def test_old_heartbeat_is_stale_and_says_how_old(clock: FakeClock) -> None:
    store = held(clock)
    clock.advance(40)
    s = controller_state(store.lease.get(), clock())
    assert s["controller"] == "stale" and s["lease_holder"] == "ctl1:4242"
    assert s["controller_detail"] == ("the last heartbeat of ctl1:4242 is 40s old (stale after 6.0s); its lease "
                                      "ends in 50s unless a successor takes it over sooner")


def test_expired_lease_is_down(clock: FakeClock) -> None:
    store = held(clock)
    clock.advance(100)
    s = controller_state(store.lease.get(), clock())
    assert s["controller"] == "down" and s["lease_holder"] is None
    assert s["controller_detail"] == "the lease of ctl1:4242 expired 10s ago (last heartbeat 100s ago)"


def test_released_lease_is_down(clock: FakeClock) -> None:
    store = held(clock)
    lease = store.lease.get()
    assert lease is not None and store.lease.release(lease.token())
    assert controller_state(store.lease.get(), clock())["controller"] == "down"


def test_a_process_answering_the_socket_is_not_proof_of_a_working_controller(clock: FakeClock) -> None:
    """The restarted controller answers the socket at once; while the dead one's lease is stale, status says
    stale, and that the answering controller is a standby."""
    store = held(clock)
    clock.advance(30)
    svc = Service(store, ServiceSettings(via="socket", holder="ctl1:5000"), clock=clock)
    s = svc.handle(ROOT, "status", {})
    assert (s["controller"], s["answered_by"], s["standby"]) == ("stale", "ctl1:5000", True)
    mine = Service(store, ServiceSettings(via="socket", holder="ctl1:4242"), clock=clock)
    clock.advance(-28)
    s = mine.handle(ROOT, "status", {})
    assert (s["controller"], s["standby"]) == ("up", False)
    direct = Service(store, ServiceSettings(via="direct"), clock=clock).handle(ROOT, "status", {})
    assert (direct["controller"], direct["answered_by"], direct["standby"]) == ("up", None, None)


def test_cli_prints_the_state_with_why(tmp_path: Path) -> None:
    clock = FakeClock()
    store = file_store(tmp_path / "s.db", clock)
    assert store.lease.acquire("ctl1:4242", TTL, process=PROC, stale_after=STALE) is not None
    store.close()
    # the CLI reads with the real clock: the lease written at the fake T0 (2025) expired long ago
    r = CliRunner().invoke(main, ["status", "--url", sqlite_url(tmp_path / "s.db")])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert next(x for x in lines if x.startswith("controller ")).split() == ["controller", "down"]
    assert "the lease of ctl1:4242 expired" in next(x for x in lines if x.startswith("controller_detail"))
    assert "pid 4242 on ctl1" not in r.output  # an expired lease has no holder process to show
