"""``report`` and ``whatif`` on the live cluster: one elastic and two rigid short jobs run to completion under a
(dry-run) controller; ``report`` must agree with figures the test computes from ``sacct`` itself, and ``whatif``
replays the same accounting. Then a real controller grows one job and shrinks another: ``status``'s GPUs granted
and reclaimed, and ``report``'s GPU-hours (what each job held at each size), resizes, JCT and wait, against sacct
by hand."""

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


DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 2 --window 10s --cooldown 600s --grace 3s --signal USR2"


def by_hand(cluster: TestCluster, job_id: int) -> dict[str, float]:
    """Job ``job_id`` from its sacct records, by hand: the GPU-seconds it held (a shrink in place leaves a RESIZING
    record at the old size, ending at the resize: each record counts from where the previous one ended), how many
    RESIZING records, its JCT (last end - first submission) and wait (first start - first submission)."""
    out = cluster.run(["sacct", "-a", "-X", "-n", "-P", "-j", str(job_id), "-o", "Submit,Start,End,AllocTRES,State"],
                      check=True).stdout
    gpu_s, previous_end, resized = 0.0, None, 0
    submits, starts, ends = [], [], []
    for line in out.splitlines():
        submit, start, end, tres, state = line.split("|")
        t0, t1 = datetime.fromisoformat(start), datetime.fromisoformat(end)
        begin = t0 if previous_end is None else max(t0, previous_end)
        gpu_s += int(tres.split("gres/gpu=")[1].split(",")[0]) * max(0.0, (t1 - begin).total_seconds())
        previous_end = t1
        resized += state == "RESIZING"
        submits.append(datetime.fromisoformat(submit))
        starts.append(t0)
        ends.append(t1)
    first = min(submits)
    return {"gpu_s": gpu_s, "resized": resized, "jct": (max(ends) - first).total_seconds(),
            "wait": (min(starts) - first).total_seconds()}


def test_a_real_controller_grows_one_job_shrinks_another_and_every_number_matches(
        agents: Agents, clean_cluster: TestCluster, tmp_path: Path) -> None:
    """status's GPUs granted (joined) and reclaimed after one grow and one shrink, and report's
    GPU-hours and resizes for both jobs, against sacct by hand."""
    from slurm_elastic.store.records import ActionKind
    from tests.cluster.controller_harness import elastic_script, marker_file

    cluster = clean_cluster
    marker = marker_file(cluster)
    since = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    wait_until("the window to open", lambda: datetime.now(UTC) >= since, 5)
    with running_controller(cluster, controller_config(tmp_path, agents)) as ctl:
        busy = cluster.submit(elastic_script(95, DIRECTIVES, marker), "-N1", "--gres=gpu:4", "--time=10",
                              user="alice")
        idle = cluster.submit(elastic_script(5, DIRECTIVES, marker), "-N2", "--gres=gpu:4", "--time=10", user="bob")
        wait_until("the grow joined and the shrink applied", lambda: any(
            "joined_at" in a.params for a in ctl.applied(busy, ActionKind.GROW)) and ctl.applied(
            idle, ActionKind.SHRINK), 120, ctl)
        ctl.wait_cycles(5)  # both run on at their new size for a while: the GPU-hours of each size tell apart
        status = json.loads(subprocess.run(
            [sys.executable, "-m", "slurm_elastic.cli", "status", "--url", ctl.db_url, "--json"], capture_output=True,
            text=True, env=cluster.env, cwd=REPO, timeout=60, check=True).stdout)
        (grow,) = ctl.applied(busy, ActionKind.GROW)
        (shrink,) = ctl.applied(idle, ActionKind.SHRINK)
        exts = [e.job_id for e in ctl.store().jobs.extensions(busy, active_only=False)]
        cluster.cancel(busy)
        cluster.cancel(idle)
        for job in (busy, idle, *exts):
            cluster.wait_state(job, {"CANCELLED", "COMPLETED", "FAILED"}, 60)
        until = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
        wait_until("the window to close", lambda: datetime.now(UTC) >= until, 5)
        wait_until("sacct to list the jobs ended", lambda: {str(busy), str(idle)} <= set(
            sacct_jobs(cluster, since, until)), 30)
        rows = {r["kind"]: r for r in cli(cluster, "report", "--since", since.isoformat(), "--until",
                                           until.isoformat(), "--url", ctl.db_url)}
    # status: 4 GPUs joined the busy job (one node of gpu:4), 4 left the idle one
    assert (grow.gpus, shrink.gpus) == (4, 4)
    assert (status["gpus_granted_today"], status["gpus_reclaimed_today"]) == (4, 4), status
    # report: what each job held over time, from sacct by hand; resizes = the two applied size changes
    b, i = by_hand(cluster, busy), by_hand(cluster, idle)
    ext_s = sum(by_hand(cluster, e)["gpu_s"] for e in exts)
    assert i["resized"] == 1  # the shrink in place: a RESIZING record at 8 GPUs, then 4
    elastic = rows["elastic"]
    assert elastic["jobs"] == 2 and elastic["resizes"] == 2
    assert elastic["gpu_hours"] == pytest.approx((b["gpu_s"] + ext_s + i["gpu_s"]) / 3600, abs=0.001)
    assert elastic["jct_mean_s"] == pytest.approx((b["jct"] + i["jct"]) / 2, abs=0.1)
    assert elastic["wait_mean_s"] == pytest.approx((b["wait"] + i["wait"]) / 2, abs=0.1)
    busy_s, idle_s = b["gpu_s"], i["gpu_s"]
    print(f"\ngranted {status['gpus_granted_today']}, reclaimed {status['gpus_reclaimed_today']}; GPU-hours "
          f"{elastic['gpu_hours']} (busy {busy_s:.0f} + extension {ext_s:.0f} + idle {idle_s:.0f} GPU-s), "
          f"resizes {elastic['resizes']}")
