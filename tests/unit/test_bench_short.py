"""The scale benchmarks in a short form: their machinery runs end to end on a tiny input (counts, no timings)."""

from __future__ import annotations

import asyncio
import importlib.util
import queue
import secrets
import threading
from datetime import timedelta
from pathlib import Path
from types import ModuleType

from slurm_elastic.controller.collect import collect

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_controller_cycle_short(tmp_path: Path) -> None:
    bench = _load("controller_cycle")
    squeue, sinfo = bench.build_documents(200, 40, 8, seed=1)
    cycles = bench.Cycles(tmp_path / "c.db", bench.site_config())
    try:
        first = cycles.cycle(squeue, sinfo, bench.NOW, walk=True)
        steady = cycles.cycle(squeue, sinfo, bench.NOW + timedelta(seconds=30), walk=False)
    finally:
        cycles.close()
    assert set(first["cpu_s"]) == {"json.loads", "parse", "parse (walk)", "units", "policy", "DB write"}
    n = first["counts"]
    assert n["nodes"] == 40 and n["gpus"] == 320 and n["units"] > 0
    assert n["unit rows"] == n["decision rows"] == n["decisions"] == n["units"]  # a fresh DB: every unit
    s = steady["counts"]
    assert s["decisions"] == n["decisions"] and s["unit rows"] == 0  # nothing changed: no unit row written
    assert s["decision rows"] + s["holds not written"] == s["decisions"] and s["holds not written"] > 0


def test_agent_fanout_short() -> None:
    bench = _load("agent_fanout")
    key = secrets.token_bytes(32)
    ports: queue.Queue[object] = queue.Queue()
    stop = threading.Event()

    async def run() -> tuple[int, int]:
        server = asyncio.create_task(bench._serve(0, list(range(5)), (key, None), ports, stop))
        try:
            for _ in range(100):  # the servers bind within a few event-loop turns
                if not ports.empty():
                    break
                await asyncio.sleep(0.05)
            _, bound = ports.get_nowait()
            agents = {f"node{i:05d}": f"http://127.0.0.1:{p}" for i, p in enumerate(bound)}
            result = await collect(agents, key, timeout_s=10.0)
            raw_count, _ = await bench._raw_cycle(list(agents.values()), 4)
            jobs = sum(len(r.jobs) for r in result.reports.values())
            assert not result.errors
            return raw_count, jobs
        finally:
            stop.set()
            await asyncio.wait_for(server, 10.0)

    raw_count, jobs = asyncio.run(run())
    assert raw_count == 5 and jobs == 10  # five agents, two jobs each


def test_decision_volume_short(tmp_path: Path) -> None:
    bench = _load("decision_volume")
    for workload in bench.WORKLOADS:
        results, actions = bench.run(workload, tmp_path, n_units=30, cycles=5, interval_s=30.0, heartbeat_s=60.0,
                                     change=0.1, seed=1)
        old, new = results["old"], results["new"]
        assert old.first == new.first == 30 and old.rows == 4 * 30 == actions["hold"] - 30
        assert 30 <= new.rows < old.rows  # at least the heartbeat two cycles later, far fewer than every hold
        if workload == "steady":
            assert new.rows == 2 * 30  # the heartbeats at cycles 3 and 5 only
