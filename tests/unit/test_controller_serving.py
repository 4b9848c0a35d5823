"""The controller's serving reader: published lines, the demand history it stores, the forecast, the measured
cold start and replica capacity, and the file rules it shares with the goodput reader. Whole cycles read a serving
job recorded on the live test cluster (controller_scenarios.steady_cli), its working directory moved to the test's."""

from __future__ import annotations

import json
import os
import pwd
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic import serving
from slurm_elastic.controller.config import ControllerConfig
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.controller.serving import ServingReader, capacity_from, parse_point, service_of
from slurm_elastic.policy import ElasticUnit, default_config
from slurm_elastic.policy.config import resolve_unit
from slurm_elastic.store.records import DecisionFilter, DemandRecord
from slurm_elastic.store.sqlstore import SqlStore, sqlite_url
from tests.unit.controller_scenarios import steady_cli
from tests.unit.policy_builders import ext, job, spec
from tests.unit.slurm_replay import STEP_S
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import POLICY, Agents

NOW = datetime(2026, 1, 12, 9, 0, 30, tzinfo=UTC)  # a Monday


def me() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def write(path: Path, recs: list[dict[str, Any]], tail: bytes = b"") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in recs) + tail)


def serving_unit(work_dir: Path, *, exts: tuple[Any, ...] = ()) -> ElasticUnit:
    j = replace(job(7, nodes=("n1",), user=me()), working_dir=str(work_dir))
    return ElasticUnit(job=j, spec=spec(min_nodes=1, max_nodes=4, serving=True, slo_p99_ms=50), extensions=exts)


def store(tmp_path: Path) -> SqlStore:
    return SqlStore.open(sqlite_url(tmp_path / "state.db"))


def test_parse_point_takes_the_published_fields_and_refuses_the_rest() -> None:
    p = parse_point(b'{"time": 1767600000.5, "requests_per_s": 12.5, "p99_ms": 40, "replicas": 2}')
    assert p is not None and (p.requests_per_s, p.p99_ms, p.replicas, p.p50_ms) == (12.5, 40.0, 2, None)
    for bad in (b"[]", b"nope", b'{"time": 1, "requests_per_s": -1}', b'{"requests_per_s": 1}',
                b'{"time": 1, "requests_per_s": 1, "p99_ms": "x"}',
                b'{"time": 1, "requests_per_s": 1, "replicas": 1.5}',
                b'{"time": 1, "requests_per_s": true}', b'{"time": 1, "requests_per_s": NaN}'):
        assert parse_point(bad) is None, bad


def test_reads_the_long_window_and_stores_each_completed_slot_once(tmp_path: Path) -> None:
    st = store(tmp_path)
    t0 = NOW - timedelta(minutes=40)
    recs = [{"time": (t0 + timedelta(seconds=30 * i)).timestamp(), "requests_per_s": 10.0 + i, "p99_ms": 20.0,
             "replicas": 1} for i in range(80)]
    write(tmp_path / ".slurm-elastic" / "serving-7.jsonl", recs, b"garbage\n")
    u = serving_unit(tmp_path)
    r = ServingReader(st.demand)
    s = resolve_unit(default_config(), u)
    load = r.read_unit(u, s, NOW, NOW - timedelta(minutes=15))
    assert load is not None and load.unit_id == 7
    assert all(p.at >= NOW - timedelta(minutes=15) for p in load.points) and len(load.points) == 30
    slots = st.demand.demand(service_of(u))
    # 08:20:30 .. 09:00: slots 08:15, 08:30 and 08:45 are complete, 09:00 is not
    assert [x.slot.strftime("%H:%M") for x in slots] == ["08:15", "08:30", "08:45"]
    assert slots[-1].requests_per_s == 10.0 + 79 - 1  # the peak of the slot (the last point is in 09:00)
    r.read_unit(u, s, NOW + timedelta(seconds=10), NOW - timedelta(minutes=15))
    assert len(st.demand.demand(service_of(u))) == 3  # nothing stored twice
    assert load.cold_start_s is None and load.rps_per_replica == 88.0  # 88 req/s on 1 replica within 50 ms
    st.close()


def test_forecast_comes_from_the_stored_history_one_cold_start_ahead(tmp_path: Path) -> None:
    st = store(tmp_path)
    u = serving_unit(tmp_path)
    for week in (1, 2):  # Mondays 09:00-09:15 are busy
        base = NOW.replace(hour=0, minute=0, second=0) - timedelta(weeks=week)
        for q in range(96):
            slot = base + timedelta(minutes=15 * q)
            busy = slot.hour == 9 and slot.minute == 15
            st.demand.add_demand(DemandRecord(service_of(u), 1, slot, 900.0 if busy else 100.0, 30.0, 3 if busy else 1))
    write(tmp_path / ".slurm-elastic" / "serving-7.jsonl",
          [{"time": (NOW - timedelta(seconds=5)).timestamp(), "requests_per_s": 100.0, "p99_ms": 20.0}])
    r = ServingReader(st.demand)
    s = resolve_unit(default_config(), u)  # serving_cold_start_s 60
    early = r.read_unit(u, s, NOW.replace(minute=10), NOW - timedelta(hours=1))
    assert early is not None and early.forecast_rps == 100.0 and early.forecast_lead_s == 60.0
    late = r.read_unit(u, s, NOW.replace(minute=14, second=30), NOW - timedelta(hours=1))
    assert late is not None and late.forecast_rps == 900.0
    assert late.rps_per_replica == 300.0  # 900 req/s on 3 replicas within the SLO
    st.close()


def test_cold_start_is_measured_from_the_extension_start_to_more_replicas(tmp_path: Path) -> None:
    started = NOW - timedelta(seconds=200)
    recs = [{"time": (NOW - timedelta(seconds=300 - 10 * i)).timestamp(), "requests_per_s": 50.0,
             "replicas": 1 if i < 19 else 2} for i in range(30)]  # 2 replicas from 110 s ago
    write(tmp_path / ".slurm-elastic" / "serving-7.jsonl", recs)
    u = serving_unit(tmp_path, exts=(replace(ext(8, ("n2",)), start_time=started),))
    load = ServingReader(None).read_unit(u, resolve_unit(default_config(), u), NOW, NOW - timedelta(hours=1))
    assert load is not None and load.cold_start_s == 90.0
    assert load.forecast_rps is None  # no store: no history, no forecast


def test_a_symlinked_or_foreign_file_is_not_read(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.jsonl"
    write(target, [{"time": NOW.timestamp(), "requests_per_s": 1.0}])
    (tmp_path / ".slurm-elastic").mkdir()
    os.symlink(target, tmp_path / ".slurm-elastic" / "serving-7.jsonl")
    u = serving_unit(tmp_path)
    r = ServingReader(None)
    assert r.read_unit(u, resolve_unit(default_config(), u), NOW, NOW - timedelta(hours=1)) is None
    other = replace(u, job=replace(u.job, working_dir="relative/dir"))
    assert r.read_unit(other, resolve_unit(default_config(), u), NOW, NOW) is None


def test_capacity_needs_slots_within_the_slo() -> None:
    t = NOW
    hist = [DemandRecord("s", 1, t, 400.0, 80.0, 2), DemandRecord("s", 1, t, 150.0, 20.0, 1),
            DemandRecord("s", 1, t, 0.0, 5.0, 1), DemandRecord("s", 1, t, 90.0, None, None)]
    assert capacity_from(hist, 50) == 150.0
    assert capacity_from(hist, None) == 200.0
    assert capacity_from([], 50) is None


# --- a whole controller cycle ---------------------------------------------------------------------------------


ALICE = pwd.getpwnam("alice").pw_uid if any(p.pw_name == "alice" for p in pwd.getpwall()) else None
needs_root = pytest.mark.skipif(os.geteuid() != 0 or ALICE is None,
                                reason="the recorded job is alice's: her file needs root and a user alice")


class Serving:
    """The recorded serving job (alice's, 1 node) on a steady cluster; its working directory is ``tmp_path``."""

    def __init__(self, tmp_path: Path, *, dry_run: bool) -> None:
        slurm, self.runner = steady_cli("serving_steady", str(tmp_path))
        self.clock = FakeClock(self.runner.rec.clock_start)
        self.store = memory_store(self.clock)
        self.agents = Agents(self.clock)
        self.job = self.runner.rec.jobs["serving"]
        (self.node,) = self.runner.rec.nodes["serving"]
        # a snapshot is stamped with the host's time, the cycle with the fake one: never call it stale here
        cfg = ControllerConfig(interval_s=STEP_S, holder="t", max_snapshot_age_s=86400, dry_run=dry_run)
        self.ctl = Controller(cfg, POLICY, slurm=slurm, store=self.store, collector=self.agents, clock=self.clock)
        self.path = tmp_path / ".slurm-elastic" / f"serving-{self.job}.jsonl"

    def cycle(self, util: float, requests_per_s: float, p99_ms: float) -> None:
        self.agents.util = {(self.node, self.job): util}
        assert serving.publish(requests_per_s, p99_ms=p99_ms, replicas=1, at=self.clock().timestamp(),
                               path=str(self.path))
        assert ALICE is not None
        for p in (self.path.parent, self.path):
            os.chown(p, ALICE, -1)  # published by the job's user
        self.ctl.run_cycle()
        self.runner.check()
        self.clock.advance(STEP_S)


@needs_root
def test_the_controller_scales_a_serving_job_out_on_its_published_latency(tmp_path: Path) -> None:
    """Under --dry-run: the grow is decided and stored, and no sbatch is run (the steady cluster refuses one)."""
    w = Serving(tmp_path, dry_run=True)
    for _ in range(3):
        w.cycle(30.0, 120.0, 80.0)  # utilization says shrink; a serving job does not listen to it
    decisions = w.store.decisions.list_decisions(DecisionFilter(job_id=w.job))
    grows = [d for d in decisions if d.action == "grow"]
    assert grows and grows[0].reason == "SLO_AT_RISK"
    assert grows[0].inputs["p99_ms"] == 80.0 and grows[0].inputs["requests_per_s"] == 120.0
    assert grows[0].inputs["slo_p99_ms"] == 50 and grows[0].inputs["basis"] == "serving"
    assert not any(d.action == "shrink" for d in decisions)


@needs_root
def test_a_serving_hold_is_stored_once_while_only_its_published_numbers_move(tmp_path: Path) -> None:
    w = Serving(tmp_path, dry_run=False)
    for i in range(6):
        w.cycle(50.0, 100.0 + i, 20.0 + i)
    holds = [d for d in w.store.decisions.list_decisions(DecisionFilter(job_id=w.job)) if d.action == "hold"]
    assert [d.reason for d in holds] == ["SLO_MET"]
