"""``report`` and ``whatif`` on the live cluster: one elastic and two rigid short jobs run to completion under a
(dry-run) controller; ``report`` must agree with figures the test computes from ``sacct`` itself, and ``whatif``
replays the same accounting."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.agents_harness import REPO, Agents
from tests.cluster.controller_harness import controller_config, running_controller, wait_until
from tests.cluster.harness import TestCluster

pytestmark = pytest.mark.cluster


def local(t: datetime) -> str:
    return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def sacct_jobs(cluster: TestCluster, since: datetime, until: datetime) -> dict[str, dict[str, Any]]:
    """GPU jobs that started and ended in the window, straight from sacct (times: the host's local time)."""
    out = cluster.run(["sacct", "-a", "-X", "-n", "-P", "-o", "JobID,Submit,Start,End,AllocTRES", "-S", local(since),
                       "-E", local(until)], check=True).stdout
    jobs = {}
    for line in out.splitlines():
        job_id, submit, start, end, tres = line.split("|")
        if "gres/gpu=" not in tres or "Unknown" in (start, end) or "None" in (start, end):
            continue
        t = {k: datetime.fromisoformat(v).astimezone() for k, v in (("submit", submit), ("start", start),
                                                                      ("end", end))}
        if since <= t["end"] < until:
            gpus = int(tres.split("gres/gpu=")[1].split(",")[0])
            jobs[job_id] = {"jct": (t["end"] - t["submit"]).total_seconds(),
                            "wait": (t["start"] - t["submit"]).total_seconds(),
                            "gpu_s": gpus * (t["end"] - t["start"]).total_seconds()}
    return jobs


def lower(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[math.floor(q / 100 * (len(ordered) - 1) + 1e-9)]


def cli(cluster: TestCluster, *args: str) -> Any:
    cp = subprocess.run([sys.executable, "-m", "slurm_elastic.cli", *args, "--json", "--no-progress"],
                        capture_output=True, text=True, env=cluster.env, cwd=REPO, timeout=120, check=False)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def test_report_agrees_with_sacct_and_whatif_replays_it(agents: Agents, clean_cluster: TestCluster,
                                                        tmp_path: Path) -> None:
    cluster = clean_cluster
    since = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)  # after the fixture's cancels
    wait_until("the window to open", lambda: datetime.now(UTC) >= since, 5)
    with running_controller(cluster, controller_config(tmp_path, agents, dry_run=True), dry_run=True) as ctl:
        elastic = cluster.submit("#!/bin/sh\n#ELASTIC --min-nodes 1 --max-nodes 2\nsleep 6\n", "-N1",
                                 "--gres=gpu:2", "--time=2", user="alice")
        rigid = [cluster.submit("#!/bin/sh\nsleep 2\n", "-N1", f"--gres=gpu:{g}", "--time=1", user=u)
                 for g, u in ((1, "bob"), (4, "alice"))]
        wait_until(f"the controller to manage job {elastic}",
                   lambda: ctl.store().jobs.get_job(elastic) is not None, 30, ctl)
        for job in (elastic, *rigid):
            assert cluster.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, 60) == "COMPLETED", job
        until = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
        wait_until("the window to close", lambda: datetime.now(UTC) >= until, 5)
        mine = {str(j) for j in (elastic, *rigid)}
        # slurmctld reports job ends to slurmdbd asynchronously.
        wait_until("sacct to list the three jobs ended", lambda: mine <= set(sacct_jobs(cluster, since, until)), 30)
        expected = sacct_jobs(cluster, since, until)
        window = ["--since", since.isoformat(), "--until", until.isoformat(), "--url", ctl.db_url]
        rows = {r["kind"]: r for r in cli(cluster, "report", *window)}
        whatif = {r["kind"]: r for r in cli(cluster, "whatif", *window)}
    assert (rows["elastic"]["jobs"], rows["all"]["jobs"]) == (1, len(expected))
    jcts = [j["jct"] for j in expected.values()]
    waits = [j["wait"] for j in expected.values()]
    total = rows["all"]
    assert total["completed"] == len(expected)
    assert total["jct_mean_s"] == pytest.approx(sum(jcts) / len(jcts), abs=0.1)
    assert (total["jct_p50_s"], total["jct_p99_s"]) == (lower(jcts, 50), lower(jcts, 99))
    assert (total["wait_p50_s"], total["wait_p99_s"], total["starved"]) == (lower(waits, 50), lower(waits, 99), 0)
    assert total["gpu_hours"] == pytest.approx(sum(j["gpu_s"] for j in expected.values()) / 3600, abs=0.001)
    assert rows["elastic"]["jct_mean_s"] == pytest.approx(expected[str(elastic)]["jct"], abs=0.1)
    # whatif: the same jobs, as they ran and replayed rigid and elastic on this cluster's 4 x 4 GPUs.
    assert whatif["all"]["jobs"] == whatif["rigid"]["jobs"] == whatif["elastic"]["jobs"] == len(expected)
    assert whatif["all"]["jct_p50_s"] == total["jct_p50_s"]
    assert whatif["rigid"]["gpu_hours"] > 0
