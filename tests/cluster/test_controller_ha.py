"""HA for real: two controller processes on the test cluster's shared MariaDB, both alive at once. Only the lease
holder acts; SIGKILL the holder and the standby, on the same host, sees its process gone and takes over at its
next cycle, before the lease's TTL, with no double actions.

Each test uses its own table prefix in the ``slurm_elastic`` database (dropped at the end)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import literal, select

from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.store import SqlStore, StoreUnavailableError
from slurm_elastic.store.errors import LeaseLostError
from slurm_elastic.store.lease_sql import check_fencing
from slurm_elastic.store.records import ActionKind, ActionRecord, ActionState, CycleRecord
from tests.cluster.agents_harness import REPO, Agents
from tests.cluster.controller_harness import (
    ControllerProcess,
    controller_config,
    elastic_script,
    marker_file,
    node_count,
    wait_until,
)
from tests.cluster.harness import TestCluster, stop_processes
from tests.cluster.tcp_relay import TcpRelay, tcp_relay

pytestmark = pytest.mark.cluster

URL = "mysql+pymysql://slurm:slurm-elastic-test@127.0.0.1:13306/slurm_elastic"
MARIADB = ("127.0.0.1", 13306)
TTL_S = 10.0  # controller_config's lease_ttl_s
DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 3 --window 10s --cooldown 15s --grace 3s --signal USR2"


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"ha{uuid.uuid4().hex[:8]}_"
    yield p
    st = SqlStore.open(URL, table_prefix=p)
    try:
        st.drop_all()
    finally:
        st.close()


@contextlib.contextmanager
def controller(cluster: TestCluster, config: Path) -> Iterator[ControllerProcess]:
    log = config.with_suffix(".log")
    env = dict(cluster.env)
    env.pop("SLURM_ELASTIC_TEST_CRASH_AT", None)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", "from slurm_elastic.cli import main; main()", "controller",
                                 "-c", str(config), "-v"], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        yield ControllerProcess(proc, log, URL)
    finally:
        stop_processes([proc])


def cycles(st: SqlStore) -> list[CycleRecord]:
    from slurm_elastic.store.decisions_sql import cycle_record

    C = st.db.models.cycle
    with st.db.read("test: cycles") as s:
        return [cycle_record(r) for r in s.execute(select(C).order_by(C.id)).scalars()]


def extensions(cluster: TestCluster, leader: int) -> list[dict[str, object]]:
    queue = cluster.squeue_json()["jobs"]
    assert isinstance(queue, list)
    return [j for j in queue if (t := parse_tag(str(j.get("comment") or ""))) and t.parent == leader
            and j.get("job_state") in {"RUNNING", "PENDING"}]


def running_extensions(cluster: TestCluster, leader: int) -> int:
    return sum(1 for j in extensions(cluster, leader) if j.get("job_state") == "RUNNING")


def holder(st: SqlStore) -> str | None:
    lease = st.lease.get()
    return lease.holder if lease else None


def test_only_the_holder_acts_and_the_standby_takes_over(agents: Agents, clean_cluster: TestCluster,
                                                        tmp_path: Path, prefix: str) -> None:
    cluster = agents.cluster
    marker = cluster.jobs_dir / f"marker-{uuid.uuid4().hex[:8]}"
    marker.touch()
    marker.chmod(0o666)
    cfg_a = controller_config(tmp_path, agents, db_url=URL, table_prefix=prefix, holder="ctl-a", name="a.toml")
    cfg_b = controller_config(tmp_path, agents, db_url=URL, table_prefix=prefix, holder="ctl-b", name="b.toml")
    st = SqlStore.open(URL, table_prefix=prefix)
    try:
        with controller(cluster, cfg_a) as a:
            wait_until("ctl-a to hold the lease", lambda: holder(st) == "ctl-a", 60, a)
            with controller(cluster, cfg_b) as b:
                wait_until("ctl-b to start", lambda: "controller ctl-b started" in b.log_text(), 60, b)
                job = cluster.submit(elastic_script(90, DIRECTIVES, marker), "-N1", "--gres=gpu:2", "--time=30",
                                     user="alice")
                cluster.wait_state(job, {"RUNNING"})
                wait_until("ctl-a to grow the job once", lambda: running_extensions(cluster, job) == 1, 150, a)
                # Both alive, and everything so far was done by the holder alone.
                assert a.proc.poll() is None and b.proc.poll() is None
                assert {c.holder for c in cycles(st)} == {"ctl-a"}
                epoch_a = st.lease.get().epoch  # type: ignore[union-attr]
                assert all(x.fencing_epoch == epoch_a for x in st.journal.list_actions(job_id=job))
                os.kill(a.proc.pid, signal.SIGKILL)
                killed = datetime.now(UTC)
                a.proc.wait(timeout=30)
                dead = st.lease.get()  # ctl-a renews no more: this is its lease's final expiry
                assert dead is not None and dead.holder == "ctl-a" and dead.epoch == epoch_a
                wait_until("ctl-b to take the lease", lambda: holder(st) == "ctl-b", 60, b)
                lease = st.lease.get()
                assert lease is not None and lease.epoch == epoch_a + 1
                # Both run on this host: ctl-b saw ctl-a's process gone and took the lease at its next cycle,
                # before ctl-a's lease ran out (in the DB's own timestamps; the seconds go to docs/controller.md).
                assert (dead.expires_at - dead.renewed_at).total_seconds() == pytest.approx(TTL_S)
                assert lease.acquired_at < dead.expires_at, (lease.acquired_at, dead.expires_at)
                assert f"took the controller lease from ctl-a (epoch {epoch_a}) before its TTL: its process " \
                       f"{a.proc.pid} on" in b.log_text()
                # The lease is taken at the start of ctl-b's cycle; its cycle row is written when the cycle ends.
                wait_until("ctl-b's first cycle row", lambda: any(c.holder == "ctl-b" for c in cycles(st)), 60, b)
                first_b = min(c.started_at for c in cycles(st) if c.holder == "ctl-b")
                print(f"\nHA pair: kill -9 -> standby's lease {(lease.acquired_at - killed).total_seconds():.2f}s, "
                      f"-> its first cycle {(first_b - killed).total_seconds():.2f}s (the old lease had "
                      f"{(dead.expires_at - killed).total_seconds():.2f}s left)")
                wait_until("ctl-b to grow the job to 3 nodes", lambda: running_extensions(cluster, job) == 2, 150, b)
                # A few more cycles at max (holds are stored when they change: count ctl-b's cycles after it).
                wait_until("the job at max", lambda: any(
                    d.job_id == job and d.reason == "AT_MAX" for d in st.decisions.list_decisions()), 60, b)
                at_max = min(d.time for d in st.decisions.list_decisions() if d.job_id == job and d.reason == "AT_MAX")
                wait_until("a few cycles at max", lambda: sum(
                    1 for c in cycles(st) if c.holder == "ctl-b" and c.started_at > at_max) >= 3, 60, b)
                assert b.proc.poll() is None
                actions = [x for x in st.journal.list_actions(job_id=job) if x.kind == ActionKind.GROW]
                exts = extensions(cluster, job)
                holders = {c.holder for c in cycles(st)}
    finally:
        st.close()
    applied = [x for x in actions if x.state == ActionState.APPLIED]
    # No double actions: one grow per step, each with its own key, each matched by exactly one extension job.
    assert sorted((x.params["from"], x.params["to"]) for x in applied) == [(1, 2), (2, 3)]
    assert len({x.idempotency_key for x in actions}) == len(actions)
    tags = [parse_tag(str(j["comment"])) for j in exts]
    assert sorted(t.key for t in tags if t) == sorted(x.idempotency_key for x in applied)
    # Each acted under its own epoch: the second grow by ctl-b after the takeover.
    assert {x.fencing_epoch for x in applied} == {epoch_a, lease.epoch}
    assert holders == {"ctl-a", "ctl-b"}


# --- the holder cut off from the database ----------------------------------------------------------------------
# A real network-level cut of one controller's DB traffic: that controller reaches MariaDB through a TCP relay
# the test owns (tests/cluster/tcp_relay.py), which the test switches to a silent black hole and back; the
# standby and the test reach MariaDB directly.

# The lease step of a cycle or reconcile pass failed on the DB (then the next success logs "answers again").
LEASE_STEP_FAILED = re.compile(r"(cycle skipped|reconcile pass stopped).* unavailable \(connection_lost\) while "
                               r"trying to (acquire|read|take over) lease")
CUT_DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 3 --window 10s --cooldown 15s --grace 6s --signal USR2"


def relayed(relay: TcpRelay) -> str:
    return URL.replace("127.0.0.1:13306", f"127.0.0.1:{relay.port}")


def shrinks(st: SqlStore, job: int) -> list[ActionRecord]:
    return [x for x in st.journal.list_actions(job_id=job) if x.kind == ActionKind.SHRINK]


def test_a_holder_cut_off_inside_a_transaction_does_not_lock_the_standby_out(prefix: str) -> None:
    """Every intent is journaled under the lease row's FOR UPDATE lock. A holder cut off inside that transaction
    must not keep the row locked for MariaDB's wait_timeout (8 h): the server ends its idle transaction after the
    store's timeout (idle_transaction_timeout), and the standby takes the lease."""
    timeout_s = 3.0
    with tcp_relay(MARIADB) as relay:
        a = SqlStore.open(relayed(relay), table_prefix=prefix, timeout_s=timeout_s)
        b = SqlStore.open(URL, table_prefix=prefix)
        try:
            lease_a = a.lease.acquire("ctl-a", timedelta(seconds=2))
            assert lease_a is not None
            locked, sent = threading.Event(), threading.Event()
            outcome: list[BaseException | None] = []

            def holder_transaction() -> None:
                try:
                    with a.db.write("test: the holder's transaction") as s:
                        check_fencing(s, a.db.models, lease_a.token(), a.now())  # the lease row, FOR UPDATE
                        locked.set()
                        sent.wait(30)
                        s.execute(select(literal(1)))  # into the cut: no answer
                    outcome.append(None)
                except BaseException as e:  # noqa: BLE001 - checked below
                    outcome.append(e)

            t = threading.Thread(target=holder_transaction, daemon=True)
            t.start()
            assert locked.wait(30)
            relay.cut()
            cut_at = time.monotonic()
            sent.set()
            taken, refused = None, 0
            while taken is None and time.monotonic() < cut_at + 60:
                try:
                    taken = b.lease.acquire("ctl-b", timedelta(seconds=TTL_S))
                except StoreUnavailableError as e:  # the row is still locked by the holder's transaction
                    assert e.reason == "locked", e
                    refused += 1
                if taken is None:
                    time.sleep(0.2)
            handover_s = time.monotonic() - cut_at
            assert taken is not None, "the standby never got the lease while the holder was cut off"
            assert taken.holder == "ctl-b" and taken.epoch == lease_a.epoch + 1
            t.join(30)
            assert outcome and isinstance(outcome[0], StoreUnavailableError), outcome
            assert outcome[0].reason == "connection_lost"
            relay.heal()
            healed_at = time.monotonic()
            # The cut-off store recovers by itself (a fresh connection) and sees that it lost the lease.
            assert a.lease.acquire("ctl-a", timedelta(seconds=2)) is None
            recovered_s = time.monotonic() - healed_at
            with pytest.raises(LeaseLostError, match="now held by ctl-b"):
                a.lease.check(lease_a.token())
            print(f"\ncut inside a transaction: standby's lease {handover_s:.1f}s after the cut ({refused} lock "
                  f"waits refused), store timeout {timeout_s:g}s; the cut-off store answered {recovered_s:.2f}s "
                  f"after the heal")
        finally:
            a.close()
            b.close()


def test_the_holder_cut_off_from_the_database_hands_over_and_nothing_is_done_twice(
        agents: Agents, clean_cluster: TestCluster, tmp_path: Path, prefix: str) -> None:
    """ctl-a reaches MariaDB through the relay, ctl-b directly. ctl-a is cut off while its shrink of an idle job is
    under way (signalled, waiting out the grace): it acts on nothing while cut off, ctl-b takes the lease at its
    TTL and carries out that same shrink once, and ctl-a, healed, stands by without acting."""
    cluster = agents.cluster
    marker = marker_file(cluster)
    st = SqlStore.open(URL, table_prefix=prefix)
    with tcp_relay(MARIADB) as relay:
        cfg_a = controller_config(tmp_path, agents, db_url=relayed(relay), table_prefix=prefix, holder="ctl-a",
                                  name="a.toml")
        cfg_b = controller_config(tmp_path, agents, db_url=URL, table_prefix=prefix, holder="ctl-b", name="b.toml")
        try:
            with controller(cluster, cfg_a) as a:
                job = cluster.submit(elastic_script(10, CUT_DIRECTIVES, marker), "-N2", "--gres=gpu:2", "--time=30",
                                     user="alice")
                wait_until("ctl-a to hold the lease", lambda: holder(st) == "ctl-a", 60, a)
                epoch_a = st.lease.get().epoch  # type: ignore[union-attr]
                with controller(cluster, cfg_b) as b:
                    wait_until("ctl-b to start", lambda: "controller ctl-b started" in b.log_text(), 60, b)
                    # The cut, as soon as ctl-a's shrink is under way (grace signal sent, nodes not yet taken).
                    deadline = time.monotonic() + 90
                    while not any(x.state == ActionState.IN_PROGRESS for x in shrinks(st, job)):
                        assert time.monotonic() < deadline, f"ctl-a never started a shrink\n{a.log_text()[-3000:]}"
                        assert not any(x.state == ActionState.APPLIED for x in shrinks(st, job)), "cut too late"
                        time.sleep(0.1)
                    relay.cut()
                    cut_at = datetime.now(UTC)
                    assert node_count(cluster, job) == 2
                    wait_until("ctl-b to take the lease", lambda: holder(st) == "ctl-b", 60, b)
                    lease = st.lease.get()
                    assert lease is not None and lease.epoch == epoch_a + 1
                    wait_until("the shrink to be carried out", lambda: node_count(cluster, job) == 1 and any(
                        x.state == ActionState.APPLIED for x in shrinks(st, job)), 60, b)
                    done_at = datetime.now(UTC)
                    # ctl-a's calls each wait out its DB timeout (its lease TTL); its lease step fails at its
                    # next cycle or reconcile pass, which then ends unacted.
                    wait_until("ctl-a's lease step to fail", lambda: LEASE_STEP_FAILED.search(a.log_text()), 60, a)
                    skipped_at = datetime.now(UTC)
                    assert relay.is_cut
                    relay.heal()
                    healed_at = datetime.now(UTC)
                    wait_until("ctl-a to reach the DB again", lambda: "the state DB answers again" in a.log_text(),
                               60, a)
                    recovered_at = datetime.now(UTC)
                    wait_until("2 full cycles of ctl-b after that", lambda: sum(
                        1 for c in cycles(st) if c.holder == "ctl-b" and c.started_at > recovered_at
                        and c.finished_at is not None and c.error is None) >= 2, 60, b)
                    assert a.proc.poll() is None and b.proc.poll() is None
                    assert holder(st) == "ctl-b"
                    actions = st.journal.list_actions()
                    rows = cycles(st)
                    grace_lines = [line for line in marker.read_text().splitlines() if line.startswith("grace")]
                    nodes_after = node_count(cluster, job)
                    log_a = a.log_text()
        finally:
            st.close()
    print(f"\nDB cut: ctl-b's lease {(lease.acquired_at - cut_at).total_seconds():.1f}s after the cut (TTL "
          f"{TTL_S:g}s), the shrink done {(done_at - cut_at).total_seconds():.1f}s after it; ctl-a answered again "
          f"{(recovered_at - healed_at).total_seconds():.1f}s after the heal; its first failed lease step "
          f"{(skipped_at - cut_at).total_seconds():.1f}s after the cut; ctl-a logged "
          f"{len(LEASE_STEP_FAILED.findall(log_a))} failed lease steps; {len(actions)} actions")
    # One shrink, decided and signalled by ctl-a, carried out once (by ctl-b): one grace signal, one node fewer.
    assert [(x.kind, x.state, x.fencing_epoch) for x in actions] == [(ActionKind.SHRINK, ActionState.APPLIED,
                                                                       epoch_a)]
    assert len(grace_lines) == 1 and nodes_after == 1
    # Nothing on stale data: ctl-a began no cycle after the cut, and every cycle after the handover is ctl-b's.
    assert not [c for c in rows if c.holder == "ctl-a" and c.started_at > cut_at]
    assert "took the controller lease" not in log_a and "holding the controller lease (epoch" in log_a
    assert not [x for x in actions if x.state in (ActionState.INTENT, ActionState.IN_PROGRESS)]
