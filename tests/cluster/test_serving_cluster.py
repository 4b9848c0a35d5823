"""The serve_http template on the real cluster, under a bounded daily-curve load on loopback (bench/serving_load.py).

The real controller drives the service next to an elastic training job through a compressed day
(docs/serving.md). The same program without Slurm, resized by hand: tests/unit/test_serve_http.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from slurm_elastic.controller.extension import parse_tag
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
from tests.policy_text import CLUSTER, policy_text

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


# The controller drives it: small numbers (the rules are the production ones; serving_down_window_s is at its
# floor of 60 s, which sets most of this test's length).
SERVING_POLICY = policy_text(CLUSTER, serving_up_window_s=10, serving_down_window_s=60, serving_down_cooldown_s=10,
                             serving_cold_start_s=10)
SERVING_DIRECTIVES = ("#ELASTIC --serving --slo-p99 50ms --target-rps-per-replica 40 --min-nodes 1 --max-nodes 2 "
                      "--grace 10s --signal USR1")
TRAINING_DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 3 --window 10s --cooldown 15s --grace 3s --signal USR2"
SLO_MS = 50.0


def test_controller_scales_the_service_with_a_daily_curve_next_to_training(stack: Agents, tmp_path: Path) -> None:
    """Serving (1..2 replicas, 40 req/s each) and training (1..3 nodes, always busy) share the 4 nodes. A day
    compressed to 60 s (06:00..24:00 of the diurnal curve, 4..70 req/s), then the night at 4 req/s: serving
    scales out at the peak (SLO_AT_RISK, reclaiming a training node) and in after it (SLO_HEADROOM, draining
    its replica), training shrinks and grows back; the SLO holds in the steady states; no request is lost."""
    cluster = stack.cluster
    started = time.monotonic()
    cfg = controller_config(tmp_path, stack)
    (tmp_path / "policy.toml").write_text(SERVING_POLICY)
    cfg.write_text(cfg.read_text().replace('PATH = "/usr/local/bin:/usr/bin:/bin"', f'PATH = "{ENV_PATH}"'))
    script = "\n".join(SERVING_DIRECTIVES if ln.startswith("#ELASTIC") and "--serving" in ln else ln
                       for ln in (REPO / "sbatch_templates" / "serve_http.sbatch").read_text().splitlines()
                       if not (ln.startswith("#ELASTIC") and "--serving" not in ln)) + "\n"
    serve, work = submit_service(cluster, "-N1", "--gres=gpu:4", script=script)
    util = cluster.jobs_dir / f"util-{uuid.uuid4().hex[:8]}"  # bob's job reads it
    set_util(util, 100)  # training always wants more
    train = cluster.submit(util_script(cluster, util, TRAINING_DIRECTIVES), "-N3", "--gres=gpu:4", "--time=30",
                           user="bob")  # the three nodes serving does not use
    cluster.wait_state(serve, {"RUNNING"})
    cluster.wait_state(train, {"RUNNING"})
    with running_controller(cluster, cfg) as ctl:
        wait_until("the router", lambda: "replica joined" in output(cluster, serve), 60, ctl)
        day = start_load(work, serve, tmp_path / "day.json", duration_s=60, day_s=60 * 24 / 18, base_rps=4,
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
    # The bar separates a service the controller left short of replicas (its p99 over the SLO report after report)
    # from this 2-core host's scheduling noise, which one 50-ms delay a second turns into a report over the SLO:
    # 93.3-93.8 % quiet (docs/serving.md), 88.3-89.5 % in CI runs beside the other lanes (2026-12-02).
    assert len(steady) >= 30 and within >= 0.8, steady
