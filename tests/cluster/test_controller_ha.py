"""HA for real: two controller processes on the test cluster's shared MariaDB, both alive at once. Only the lease
holder acts; SIGKILL the holder and the standby, on the same host, sees its process gone and takes over at its
next cycle, before the lease's TTL, with no double actions.

Each test uses its own table prefix in the ``slurm_elastic`` database (dropped at the end)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import ActionKind, ActionState, CycleRecord
from tests.cluster.agents_harness import REPO, Agents
from tests.cluster.controller_harness import (
    ControllerProcess,
    controller_config,
    elastic_script,
    wait_until,
)
from tests.cluster.harness import TestCluster

pytestmark = pytest.mark.cluster

URL = "mysql+pymysql://slurm:slurm-elastic-test@127.0.0.1:13306/slurm_elastic"
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
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


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
