"""The serve_http template on the real cluster, under a bounded daily-curve load on loopback (bench/serving_load.py).

First the service itself, resized by hand exactly as the controller resizes (an extension job built by
controller/extension.py joins; a shrink notice and the grace signal, then the extension job is cancelled): the
replica joins the router, the router drains it before its node goes, and no request is lost. Then the real
controller drives it next to an elastic training job through a compressed day (docs/serving.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurm_elastic import resize
from slurm_elastic.controller.extension import build_request, parse_tag, rendezvous_endpoint
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.runner import SlurmCommands
from slurm_elastic.store.records import ActionKind
from tests.cluster.agents_harness import REPO, Agents
from tests.cluster.controller_harness import (
    controller_config,
    running_controller,
    set_util,
    util_script,
    wait_until,
)
from tests.cluster.harness import TestCluster

pytestmark = pytest.mark.cluster

ENV_PATH = f"{REPO / '.venv-jobs' / 'bin'}:/usr/local/bin:/usr/bin:/bin"
SERVE_ARGS = "--service-ms 10 --publish-s 1"


def submit_service(cluster: TestCluster, *sbatch_args: str, script: str | None = None) -> tuple[int, Path]:
    """serve_http.sbatch (as shipped unless ``script``), submitted by alice from her own working directory."""
    work = cluster.jobs_dir / f"serve-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    shutil.copy(REPO / "sbatch_templates" / "serve_http.py", work / "serve_http.py")
    shutil.chown(work, "alice")
    cp = cluster.run(["env", f"PATH={ENV_PATH}", f"PYTHONPATH={REPO}", f"SLURM_ELASTIC_SERVE_ARGS={SERVE_ARGS}",
                      "sbatch", "--parsable", f"--chdir={work}", f"--output={cluster.jobs_dir}/%j.out",
                      "--time=30", *sbatch_args], user="alice",
                     input_text=script or (REPO / "sbatch_templates" / "serve_http.sbatch").read_text())
    assert cp.returncode == 0, cp.stderr
    return int(cp.stdout.strip()), work


def start_load(work: Path, job: int, out: Path, *, duration_s: float, day_s: float, base_rps: float,
               peak_rps: float, start_hour: float = 0.0) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(REPO / "bench" / "serving_load.py"), "--router-file",
                             str(work / ".slurm-elastic" / f"serve-{job}" / "router.json"), "--host", "127.0.0.1",
                             "--duration-s", str(duration_s), "--day-s", str(day_s), "--start-hour", str(start_hour),
                             "--base-rps", str(base_rps), "--peak-rps", str(peak_rps), "--out", str(out)],
                            env={"PATH": ENV_PATH, "PYTHONPATH": str(REPO)})


def size(cluster: TestCluster, job: int) -> int:
    """Nodes of the leader and of its running extension jobs (the controller's tag in their comment)."""
    jobs = SlurmCli(SlurmCommands(env=cluster.env)).jobs()
    return sum(len(j.nodes) for j in jobs if j.is_running and (
        j.job_id == job or ((tag := parse_tag(j.comment)) is not None and tag.parent == job)))


def output(cluster: TestCluster, job: int) -> str:
    path = cluster.jobs_dir / f"{job}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def reports(work: Path, job: int) -> list[dict[str, float]]:
    path = work / ".slurm-elastic" / f"serving-{job}.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def test_replica_joins_and_drains_by_hand_without_losing_a_request(clean_cluster: TestCluster,
                                                                    tmp_path: Path) -> None:
    cluster = clean_cluster
    slurm = SlurmCli(SlurmCommands(env=cluster.env))
    started = time.monotonic()
    job, work = submit_service(cluster, "-N1", "--gres=gpu:1")
    cluster.wait_state(job, {"RUNNING"})
    wait_until("the router and its own replica", lambda: "replica joined" in output(cluster, job), 60)
    leader = slurm.job(job)
    assert leader is not None
    free = [n for n in cluster.nodes if n not in leader.nodes][:1]
    req = build_request(leader, free, f"grow:{job}:1:1", datetime.now(tz=UTC),
                        rendezvous=rendezvous_endpoint(leader, "127.0.0.1"), notice_grace_s=30,
                        base_env={"PATH": "/usr/bin:/bin", "SLURM_CONF": cluster.env["SLURM_CONF"]})
    ext = slurm.submit_as(req.user, slurm.batch_script(job), [*req.sbatch_args,
                                                              f"--output={cluster.jobs_dir}/%j.out"], env=req.env)
    ext_replica = f"{ext}-{free[0]}"
    # The extension's launcher posts a grow notice and waits for it: the router acknowledges at once.
    wait_until("the extension's replica to join", lambda: f"replica joined id={ext_replica}" in output(cluster, job),
               90)
    assert "grow notice ext:" in output(cluster, job)
    load = start_load(work, job, tmp_path / "load.json", duration_s=20, day_s=40, base_rps=10, peak_rps=60,
                      start_hour=8)
    try:
        wait_until("requests on both replicas", lambda: any(r.get("replicas") == 2 and r["requests_per_s"] > 5
                                                            for r in reports(work, job)), 30)
        # A shrink 2 -> 1 as the controller does it: notice, grace signal, then cancel the extension job.
        notice_file = str(work / ".slurm-elastic" / f"resize-{job}.json")
        shrink = resize.make_notice("shrink", 30, from_nodes=2, to_nodes=1, notice_id=f"shrink:{job}:2")
        assert resize.post(shrink, notice_file)
        cluster.run(["scancel", "--signal=USR1", "--full", str(job)], check=True)
        wait_until("the router to acknowledge the shrink",
                   lambda: (a := resize.read_ack(notice_file)) is not None and a.id == shrink.id, 30)
        cluster.cancel(ext)
        wait_until("the replica to leave", lambda: f"replica left id={ext_replica}" in output(cluster, job), 30)
        assert load.wait(60) == 0
    finally:
        if load.poll() is None:
            load.kill()
    text = output(cluster, job)
    summary = json.loads((tmp_path / "load.json").read_text())
    print(f"serving by hand: {summary['sent']} requests, {summary['failed']} failed, p99 {summary['p99_ms']} ms; "
          f"the whole test {time.monotonic() - started:.0f}s")
    assert f"draining ['{ext_replica}']" in text and f"drained ['{ext_replica}'] (0 still in flight)" in text, text
    assert "retrying elsewhere" not in text, text  # the drain kept every request whole, not a retry
    assert summary["sent"] > 200 and summary["failed"] == 0 and summary["shed"] == 0, summary
    assert cluster.job_state(job) == "RUNNING", text[-3000:]
    replicas = [int(r["replicas"]) for r in reports(work, job) if "replicas" in r]
    assert 2 in replicas and replicas[-1] == 1, replicas


# The controller drives it: small numbers (the rules are the production ones; serving_down_window_s is at its
# floor of 60 s, which sets most of this test's length).
SERVING_POLICY = """
serving_up_window_s = 10
serving_down_window_s = 60
serving_down_cooldown_s = 10
serving_cold_start_s = 10
"""
SERVING_DIRECTIVES = ("#ELASTIC --serving --slo-p99 50ms --target-rps-per-replica 40 --min-nodes 1 --max-nodes 2 "
                      "--grace 10s --signal USR1")
TRAINING_DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 3 --window 10s --cooldown 15s --grace 3s --signal USR2"
SLO_MS = 50.0


def test_controller_scales_the_service_with_a_daily_curve_next_to_training(stack: Agents, tmp_path: Path) -> None:
    """Serving (1..2 replicas, 40 req/s each) and training (1..3 nodes, always busy) share the 4 nodes. A day
    compressed to 80 s (06:00..24:00 of the diurnal curve, 4..70 req/s), then the night at 4 req/s: serving
    scales out at the peak (SLO_AT_RISK, reclaiming a training node) and in after it (SLO_HEADROOM, draining
    its replica), training shrinks and grows back; the SLO holds in the steady states; no request is lost."""
    cluster = stack.cluster
    started = time.monotonic()
    cfg = controller_config(tmp_path, stack)
    policy = tmp_path / "policy.toml"
    policy.write_text(policy.read_text() + SERVING_POLICY)
    cfg.write_text(cfg.read_text().replace('PATH = "/usr/local/bin:/usr/bin:/bin"', f'PATH = "{ENV_PATH}"'))
    script = "\n".join(SERVING_DIRECTIVES if ln.startswith("#ELASTIC") and "--serving" in ln else ln
                       for ln in (REPO / "sbatch_templates" / "serve_http.sbatch").read_text().splitlines()
                       if not (ln.startswith("#ELASTIC") and "--serving" not in ln)) + "\n"
    serve, work = submit_service(cluster, "-N1", "--gres=gpu:4", script=script)
    util = cluster.jobs_dir / f"util-{uuid.uuid4().hex[:8]}"  # bob's job reads it
    set_util(util, 100)  # training always wants more
    train = cluster.submit(util_script(cluster, util, TRAINING_DIRECTIVES), "-N1", "--gres=gpu:4", "--time=30",
                           user="bob")
    cluster.wait_state(serve, {"RUNNING"})
    cluster.wait_state(train, {"RUNNING"})
    with running_controller(cluster, cfg) as ctl:
        wait_until("the router", lambda: "replica joined" in output(cluster, serve), 60, ctl)
        wait_until("training to grow into the free nodes", lambda: size(cluster, train) == 3, 90, ctl)
        day = start_load(work, serve, tmp_path / "day.json", duration_s=80, day_s=80 * 24 / 18, base_rps=4,
                         peak_rps=70, start_hour=6)
        try:
            wait_until("serving to scale out", lambda: size(cluster, serve) == 2, 90, ctl)
            assert day.wait(120) == 0
        finally:
            if day.poll() is None:
                day.kill()
        night = start_load(work, serve, tmp_path / "night.json", duration_s=120, day_s=60, base_rps=4, peak_rps=4)
        try:
            wait_until("serving to scale in", lambda: size(cluster, serve) == 1, 120, ctl)
            wait_until("training to grow back", lambda: size(cluster, train) == 3, 60, ctl)
        finally:
            night.terminate()  # it stops sending, waits for the answers and writes its summary
            assert night.wait(60) == 0
        serve_grows = ctl.applied(serve, ActionKind.GROW)
        serve_shrinks = ctl.applied(serve, ActionKind.SHRINK)
        train_shrinks = ctl.applied(train, ActionKind.SHRINK)
        train_grows = ctl.applied(train, ActionKind.GROW)
    text = output(cluster, serve)
    assert [a.params["reason"] for a in serve_grows][:1] == ["SLO_AT_RISK"], [a.params for a in serve_grows]
    assert "SLO_HEADROOM" in [a.params["reason"] for a in serve_shrinks], [a.params for a in serve_shrinks]
    assert "SERVING_RECLAIM" in [a.params["reason"] for a in train_shrinks], [a.params for a in train_shrinks]
    reclaimed = min(a.finished_at for a in train_shrinks if a.params["reason"] == "SERVING_RECLAIM"
                    and a.finished_at is not None)
    assert any(a.created_at > reclaimed for a in train_grows), "training never grew back after the peak"
    summary = json.loads((tmp_path / "day.json").read_text())
    assert summary["failed"] == 0 and summary["shed"] == 0, summary
    night_summary = json.loads((tmp_path / "night.json").read_text())  # the replica drained in the night
    assert night_summary["sent"] > 100 and night_summary["failed"] == 0, night_summary
    # The drain: the router picked the replica the shrink releases and nothing was in flight there when it went.
    assert "(0 still in flight); notice acknowledged" in text and "retrying elsewhere" not in text, text[-4000:]
    assert "failed=0" in text and not [ln for ln in text.splitlines()
                                       if ln.startswith("serve[") and " failed=" in ln and " failed=0 " not in ln]
    # The SLO in the steady states: 1-s reports at a replica count that has not changed for 5 reports.
    points = reports(work, serve)
    steady = [p for i, p in enumerate(points) if i >= 5 and "p99_ms" in p
              and len({q.get("replicas") for q in points[i - 5:i + 1]}) == 1]
    within = sum(1 for p in steady if p["p99_ms"] <= SLO_MS) / max(1, len(steady))
    print(f"serving e2e: day {summary['sent']} requests ({summary['failed']} failed, p99 {summary['p99_ms']} ms), "
          f"steady-state reports within the SLO {within:.1%} of {len(steady)}; serving grows "
          f"{[a.params['reason'] for a in serve_grows]} shrinks {[a.params['reason'] for a in serve_shrinks]}; "
          f"the whole test {time.monotonic() - started:.0f}s")
    assert len(steady) >= 30 and within >= 0.9, steady
