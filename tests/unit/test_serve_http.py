"""The serve_http template's program outside Slurm (its environment faked): replicas register, the router spreads
requests, publishes, acknowledges a grow notice at once and drains the replicas a shrink releases; the load
generator's daily curve. The live-cluster version is tests/cluster/test_serving_cluster.py."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from slurm_elastic import resize

REPO = Path(__file__).resolve().parents[2]


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


serve_http = _load(REPO / "sbatch_templates" / "serve_http.py", "template_serve_http")
serving_load = _load(REPO / "bench" / "serving_load.py", "bench_serving_load")


def wait_for(what: str, probe: Callable[[], object], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_removal_order_is_the_controllers() -> None:
    """Extensions newest first, each from its last node to its first; then the leader's from the last."""
    def rep(rid: str, job: int, index: int, ext: bool, start: float) -> Any:
        return serve_http.Replica(id=rid, url="", node=rid, job=job, node_index=index, extension=ext,
                                  job_start=start)

    reps = [rep("L0", 10, 0, False, 0), rep("L1", 10, 1, False, 0), rep("L2", 10, 2, False, 0),
            rep("A0", 11, 0, True, 100), rep("A1", 11, 1, True, 100), rep("B0", 12, 0, True, 200)]
    order = [r.id for r in sorted(reps, key=serve_http.Replica.removal_key)]
    assert order == ["B0", "A1", "A0", "L2", "L1", "L0"]


def test_daily_curve_spans_base_to_peak_and_repeats() -> None:
    rates = [serving_load.rate_at(t, day_s=24.0, base_rps=5, peak_rps=50) for t in range(24)]
    assert min(rates) == pytest.approx(5) and max(rates) == pytest.approx(50)
    assert rates.index(max(rates)) == 12  # noon peak
    assert serving_load.rate_at(3.0, day_s=24.0, base_rps=5, peak_rps=50) == pytest.approx(
        serving_load.rate_at(27.0, day_s=24.0, base_rps=5, peak_rps=50))
    with pytest.raises(ValueError):
        serving_load.rate_at(1.0, day_s=0, base_rps=1, peak_rps=2)


def _env(job: int, node: str, index: int, *, procid: int = 0, parent: int | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLURM_JOB_ID": str(job), "SLURMD_NODENAME": node,
           "SLURM_NODEID": str(index), "SLURM_PROCID": str(procid), "SLURM_JOB_START_TIME": str(int(time.time()))}
    env.pop("SLURM_ELASTIC_RESIZE_FILE", None)
    env.pop("SLURM_ELASTIC_SERVING_FILE", None)
    if parent is not None:
        env.update(SLURM_ELASTIC_ROLE="extension", SLURM_ELASTIC_PARENT=str(parent))
    return env


def test_router_acknowledges_a_grow_and_drains_what_a_shrink_releases_without_losing_a_request(
        tmp_path: Path) -> None:
    procs: dict[str, subprocess.Popen[bytes]] = {}
    serve = [sys.executable, str(REPO / "sbatch_templates" / "serve_http.py"), "--service-ms", "5",
             "--publish-s", "0.5", "--advertise", "127.0.0.1", "--bind", "127.0.0.1"]

    def start(name: str, env: dict[str, str]) -> None:
        procs[name] = subprocess.Popen(serve, cwd=tmp_path, env=env, stdout=(tmp_path / f"{name}.log").open("wb"),
                                       stderr=subprocess.STDOUT)

    state = tmp_path / ".slurm-elastic"
    router_log = tmp_path / "n1.log"
    notice_file = str(state / "resize-100.json")
    try:
        start("n1", _env(100, "n1", 0))
        start("n2", _env(100, "n2", 1, procid=1))
        wait_for("the router and two replicas", lambda: router_log.exists()
                 and router_log.read_text().count("replica joined") == 2)
        # a grow: the notice is acknowledged at once, the extension's replica joins
        grow = resize.make_notice("grow", 30, from_nodes=2, to_nodes=3, notice_id="grow:100:1")
        assert resize.post(grow, notice_file)
        wait_for("the grow acknowledgement", lambda: (a := resize.read_ack(notice_file)) and a.id == grow.id)
        start("n3", _env(101, "n3", 0, parent=100))
        wait_for("the extension's replica", lambda: "replica joined id=101-n3" in router_log.read_text())
        load = subprocess.Popen([sys.executable, str(REPO / "bench" / "serving_load.py"), "--router-file",
                                 str(state / "serve-100" / "router.json"), "--day-s", "60", "--start-hour", "12",
                                 "--base-rps", "5", "--peak-rps", "60", "--duration-s", "4",
                                 "--out", str(tmp_path / "load.json")], cwd=tmp_path, env=_env(0, "x", 0))
        time.sleep(1.0)  # some load first (the generator runs for a fixed 4 s of its own)
        shrink = resize.make_notice("shrink", 30, from_nodes=3, to_nodes=2, notice_id="shrink:100:2")
        assert resize.post(shrink, notice_file)
        wait_for("the shrink acknowledgement", lambda: (a := resize.read_ack(notice_file)) and a.id == shrink.id)
        text = router_log.read_text()
        assert "draining ['101-n3']" in text and "drained ['101-n3'] (0 still in flight)" in text
        procs["n3"].kill()  # the extension job is cancelled; SIGKILL: its file stays, its health check fails
        wait_for("the replica to leave", lambda: "replica left id=101-n3" in router_log.read_text())
        assert load.wait(30) == 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    summary = json.loads((tmp_path / "load.json").read_text())
    assert summary["sent"] > 50 and summary["failed"] == 0 and summary["shed"] == 0, summary
    reports = [json.loads(ln) for ln in (state / "serving-100.jsonl").read_text().splitlines()]
    busy = [r for r in reports if r["requests_per_s"] > 0]
    assert busy and all(r["p99_ms"] >= r["p50_ms"] >= 5.0 for r in busy)  # no answer faster than the model
    assert {r["replicas"] for r in reports} >= {3, 2}  # 3 taking requests, then 2 while 101-n3 drained
    assert "retrying elsewhere" not in router_log.read_text()  # the drain, not a retry, kept requests whole


@pytest.mark.parametrize("release", ["22.05", "24.11", "26.05"])
def test_the_service_takes_the_nodes_address_in_slurm(release: str) -> None:
    """NodeAddr of `scontrol -o show node` (recorded on each release's test cluster), not NodeHostName or the
    node's name: the address Slurm reaches the node by."""
    lines = (REPO / "tests" / "fixtures" / "slurm" / release / "recorded" / "scontrol-nodes.txt").read_text()
    n2 = next(ln for ln in lines.splitlines() if ln.startswith("NodeName=n2 "))
    assert "NodeHostName=vm" in n2
    assert serve_http.node_addr(n2) == "127.0.0.1"
    assert serve_http.node_addr("NodeName=n9 State=UNKNOWN") is None


def test_a_configured_address_wins_and_the_host_name_is_the_last_resort(tmp_path: Path) -> None:
    import socket

    assert serve_http.serve_address({"SLURM_ELASTIC_SERVE_ADDR": "10.1.2.3", "SLURMD_NODENAME": "n1"}) == "10.1.2.3"
    assert serve_http.serve_address({"SLURM_ELASTIC_SERVE_ADDR": "{node}-ib", "SLURMD_NODENAME": "n7"}) == "n7-ib"
    old = os.environ.get("PATH", "")
    os.environ["PATH"] = str(tmp_path)  # no scontrol: Slurm cannot be asked
    try:
        assert serve_http.serve_address({"SLURMD_NODENAME": "n1"}) == socket.gethostname()
    finally:
        os.environ["PATH"] = old
    assert serve_http.serve_address({}) == socket.gethostname()
