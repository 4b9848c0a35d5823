"""The live demo on the local test cluster (``scripts/demo``): agents over virtual GPUs, the controller, and two
elastic jobs, one idle and one busy, shown as the controller shrinks the first and grows the second.
``scripts/demo --serving``: a service (sbatch_templates/serve_http.sbatch) scaling with a daily load curve while
a training job yields nodes at the peak and takes them back after it.

Everything is real except the GPUs: the agents read NVML through nvidia-ml-py over the virtual library, the jobs
run as alice and bob, and the controller acts through Slurm. Demo-sized policy: 20 s window, 20 s cooldown, 5 s
grace, and the 40..80 band so that the 10% and 95% jobs are far from both ends. Not used in production.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from slurm_elastic.agent.auth import generate_key_file
from slurm_elastic.controller.extension import parse_tag
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.errors import SlurmError
from slurm_elastic.slurm.model import ClusterSnapshot, Job
from slurm_elastic.slurm.runner import SlurmCommands
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import DecisionFilter, DecisionRecord
from slurm_elastic.testing.vgpu.build import build_library
from slurm_elastic.testing.vgpu.state import make_node_state
from slurm_elastic.testing.vgpu.statefile import StateFile

REPO = Path(__file__).resolve().parents[2]
POLICY = """version = 1
moldable_start = false
scale_up_above = 80
scale_down_below = 40
window_s = 20
cooldown_s = 20
grace_s = 5
min_samples = 5
max_metric_age_s = 30
startup_protection_s = 0
min_remaining_for_grow_s = 0
"""
DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 3 --window 20s --cooldown 20s --grace 5s --signal USR2"


def job_script(util: int, root: Path) -> str:
    py = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    return f"""#!/bin/bash
{DIRECTIVES}
export PYTHONPATH={REPO} SLURM_ELASTIC_VGPU_DIR={root / 'vgpu'}
trap 'echo "$(date +%T) grace signal: checkpointing (role=${{SLURM_ELASTIC_ROLE:-leader}})"' USR2
echo "$(date +%T) start role=${{SLURM_ELASTIC_ROLE:-leader}} nodes=$SLURM_JOB_NODELIST"
srun --kill-on-bad-exit=0 --ntasks-per-node=1 {py} -m slurm_elastic.testing.vgpu.workload --util {util} --mem-mib 4000 &
child=$!
while kill -0 $child 2>/dev/null; do wait $child; done
sleep 3600
"""


def leader_of(job: Job) -> int:
    """The job's own id, or for an extension job the id of the leader it extends (from its tag)."""
    tag = parse_tag(job.comment)
    return tag.parent if tag else job.job_id


def unit_sizes(snap: ClusterSnapshot, leaders: Sequence[int]) -> dict[int, int]:
    """Nodes held by each leader's running jobs: the leader itself and its extension jobs."""
    return {j: sum(len(x.nodes) for x in snap.jobs if x.is_running and leader_of(x) == j) for j in leaders}


def new_decisions(db: Path, seen: set[int]) -> list[DecisionRecord] | None:
    """The decisions in the controller's SQLite file not in ``seen`` yet (added to it), oldest first; None while
    the controller has not created the file."""
    try:
        store = SqlStore.open(f"sqlite:///{db}", create=False)
    except Exception:
        return None
    try:
        fresh = [d for d in sorted(store.decisions.list_decisions(DecisionFilter(limit=200)), key=lambda x: x.id)
                 if d.id not in seen]
    finally:
        store.close()
    seen.update(d.id for d in fresh)
    return fresh


class JobCanceller(Protocol):
    """The two Slurm calls that stop the demo's jobs; :class:`SlurmCli` is one."""

    def jobs(self) -> Sequence[Job]: ...

    def cancel(self, job_id: int) -> None: ...


def cancel_jobs(slurm: JobCanceller, jobs: Sequence[int]) -> None:
    """Cancels ``jobs`` and their extension jobs too: the controller, which would cancel those once their leader
    is gone, stops at the same time. A cancel Slurm refuses is reported and the others still go."""
    extensions = [j.job_id for j in slurm.jobs() if j.job_id not in jobs and leader_of(j) in jobs]
    for job in [*jobs, *extensions]:
        try:
            slurm.cancel(job)
        except SlurmError as e:  # already gone, or Slurm refused: the others still get cancelled
            print(f"demo: cancelling job {job}: {e}", file=sys.stderr)


class Demo:
    def __init__(self, root: Path, duration: float, command: Sequence[str] = (),
                 agent_port_base: int = 18100) -> None:
        self.root = root
        self.agent_port_base = agent_port_base  # agents on base + 1.., their /metrics on base + 101..
        # How agents and controller start: this interpreter's slurm_elastic, or an installed console script
        # (`--command`, scripts/test-wheel: the wheel in a clean venv).
        self.command = list(command) or [sys.executable, "-m", "slurm_elastic.cli"]
        self.dir = root / "demo"
        self.duration = duration
        self.env = {**os.environ, "SLURM_CONF": str(root / "etc" / "slurm.conf")}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.jobs: list[int] = []
        self.slurm = SlurmCli(SlurmCommands(env=self.env))

    def start_agents(self) -> dict[str, str]:
        lib = build_library(REPO / "build" / "vgpu")
        key = self.dir / "agent.key"
        if not key.exists():
            generate_key_file(key)
        nodes = [n.name for n in self.slurm.nodes()]
        urls = {}
        for k, node in enumerate(sorted(nodes)):
            state = self.root / "vgpu" / f"{node}.state"
            StateFile(state).write(make_node_state(node, 4, minor_base=k * 4))
            port = self.agent_port_base + k + 1
            env = {**self.env, "LD_LIBRARY_PATH": str(lib.parent), "SLURM_ELASTIC_VGPU_STATE": str(state)}
            log = open(self.dir / f"agent-{node}.log", "ab")  # noqa: SIM115 - owned by the child for its life
            self.procs.append(subprocess.Popen(
                [*self.command, "agent", "--node", node, "--listen", "127.0.0.1",
                 "--port", str(port), "--key-file", str(key), "--gpu-map-dir", str(self.root / "gpu-map"),
                 "--interval", "2", "--window", "10", "--metrics-port", str(port + 100)],  # one /metrics port each
                env=env, stdout=log, stderr=subprocess.STDOUT))
            urls[node] = f"http://127.0.0.1:{port}"
        return urls

    def start_controller(self, urls: dict[str, str], policy: str = POLICY,
                         ext_path: str = "/usr/local/bin:/usr/bin:/bin") -> Path:
        (self.dir / "policy.toml").write_text(policy)
        db = self.dir / "state.db"
        if db.exists():
            db.unlink()
        url_lines = "\n".join(f'{n} = "{u}"' for n, u in urls.items())
        cfg = self.dir / "controller.toml"
        cfg.write_text(f"""version = 1
[controller]
interval_s = 3
policy_file = "{self.dir / 'policy.toml'}"
reconcile_interval_s = 10
[store]
url = "sqlite:///{db}"
[agents]
key_file = "{self.dir / 'agent.key'}"
timeout_s = 3
[agents.urls]
{url_lines}
[extension.env]
PATH = "{ext_path}"
SLURM_CONF = "{self.env['SLURM_CONF']}"
""")
        log = open(self.dir / "controller.log", "ab")  # noqa: SIM115
        self.procs.append(subprocess.Popen([*self.command, "controller", "-c", str(cfg)],
                                           env=self.env, stdout=log, stderr=subprocess.STDOUT))
        return db

    def submit(self, user: str, util: int, nodes: int, name: str) -> int:
        out = self.root / "jobs" / f"demo-{name}-%j.out"
        job = self.slurm.submit_as(user, job_script(util, self.root),
                                   ["--chdir=/tmp", f"--output={out}", f"--job-name={name}", f"-N{nodes}",
                                    "--gres=gpu:4", "--time=30"], env=self.env)
        self.jobs.append(job)
        return job

    def watch(self, db: Path, idle: int, busy: int) -> bool:
        seen: set[int] = set()
        shown: set[str] = set()
        last_sizes: dict[int, int] = {}
        deadline = time.monotonic() + self.duration
        done_since: float | None = None
        print(f"{'time':8}  {'job':>5} {'user':6} {'name':9} action  nodes  reason: message")
        while time.monotonic() < deadline:
            time.sleep(3)
            fresh = new_decisions(db, seen)
            if fresh is None:  # the controller has not created its DB yet
                continue
            for d in fresh:
                if d.action != "hold" or d.reason in {"AT_MIN", "AT_MAX"}:
                    who = "bob   idle" if d.job_id == idle else "alice busy"
                    print(f"{d.time.astimezone(UTC):%H:%M:%S}  {d.job_id:>5} {who:16} {d.action:6} "
                          f"{d.current_nodes}->{d.target_nodes}  {d.reason}: {d.message}", flush=True)
            snap = self.slurm.snapshot()
            sizes = unit_sizes(snap, (idle, busy))
            ids = {str(j.job_id) for j in snap.jobs if leader_of(j) in (idle, busy)}
            for out in sorted((self.root / "jobs").glob("demo-*.out")):
                if out.stem.rsplit("-", 1)[-1] not in ids:
                    continue
                for text in out.read_text(errors="replace").splitlines():
                    key = f"{out.name}:{text}"
                    if key not in shown and ("grace" in text or "role=extension" in text):
                        shown.add(key)
                        print(f"{'':8}  job output {out.name}: {text}", flush=True)
            if sizes != last_sizes:
                last_sizes = dict(sizes)
                line = "  ".join(f"{'idle' if j == idle else 'busy'} job {j}: {n} node(s)" for j, n in sizes.items())
                print(f"{datetime.now():%H:%M:%S}  [{line}]", flush=True)
            if sizes[idle] == 1 and sizes[busy] == 3:
                done_since = done_since or time.monotonic()
                if time.monotonic() - done_since > 8:
                    return True
        return False

    def stop(self) -> None:
        cancel_jobs(self.slurm, self.jobs)
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


SERVING_POLICY = POLICY + """serving_up_window_s = 10
serving_down_window_s = 60
serving_down_cooldown_s = 10
serving_cold_start_s = 10
"""
SERVING_DIRECTIVES = ("#ELASTIC --serving --slo-p99 50ms --target-rps-per-replica 40 --min-nodes 1 --max-nodes 2 "
                      "--grace 10s --signal USR1")
JOB_PATH = f"{REPO / '.venv-jobs' / 'bin'}:/usr/local/bin:/usr/bin:/bin"  # aiohttp and numpy for the service


class ServingDemo(Demo):
    """``--serving``: alice's service (sbatch_templates/serve_http.sbatch, 1..2 replicas) next to bob's busy
    training job (1..3 nodes) under a day of load compressed to 80 s (bench/serving_load.py), then the night."""

    def submit_service(self) -> tuple[int, Path]:
        work = self.root / "jobs" / f"demo-serve-{int(time.time())}"
        work.mkdir(parents=True)
        shutil.copy(REPO / "sbatch_templates" / "serve_http.py", work / "serve_http.py")
        shutil.chown(work, "alice")
        lines = (REPO / "sbatch_templates" / "serve_http.sbatch").read_text().splitlines()
        script = "\n".join(SERVING_DIRECTIVES if ln.startswith("#ELASTIC --serving") else ln for ln in lines
                           if not ln.startswith("#ELASTIC --grace")) + "\n"
        env = {**self.env, "PATH": JOB_PATH, "PYTHONPATH": str(REPO),
               "SLURM_ELASTIC_SERVE_ARGS": "--service-ms 10 --publish-s 1"}
        job = self.slurm.submit_as("alice", script, [f"--chdir={work}", f"--output={self.root}/jobs/demo-serve-%j.out",
                                                     "-N1", "--gres=gpu:4", "--time=30"], env=env)
        self.jobs.append(job)
        return job, work

    def load(self, work: Path, job: int, name: str, *args: str) -> subprocess.Popen[bytes]:
        router = work / ".slurm-elastic" / f"serve-{job}" / "router.json"
        deadline = time.monotonic() + 60
        while not router.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "serving_load.py"), "--router-file", str(router),
                                 "--host", "127.0.0.1", "--out", str(self.dir / f"{name}.json"), *args])
        self.procs.append(proc)
        return proc

    def sizes(self, *jobs: int) -> dict[int, int]:
        return unit_sizes(self.slurm.snapshot(), jobs)

    def run(self, db: Path) -> bool:
        serve, work = self.submit_service()
        train = self.submit("bob", 95, 1, "train")
        print(f"alice's service {serve}: 1..2 replicas, SLO p99 50 ms, 40 req/s per replica; bob's training job "
              f"{train}: 1..3 nodes, always busy (4 nodes in all)\n", flush=True)
        names = {serve: "service", train: "training"}
        seen: set[int] = set()
        served: list[str] = []
        phase, night = "warm-up", None
        day: subprocess.Popen[bytes] | None = None
        out = self.root / "jobs" / f"demo-serve-{serve}.out"
        deadline = time.monotonic() + self.duration
        last: dict[int, int] = {}
        grew = shrank = False
        while time.monotonic() < deadline:
            time.sleep(2)
            sizes = self.sizes(serve, train)
            if sizes != last:
                last = sizes
                print(f"{datetime.now():%H:%M:%S}  [service {sizes[serve]} replica(s)  training "
                      f"{sizes[train]} node(s)]", flush=True)
            if phase == "warm-up" and sizes[train] == 3:
                phase = "day"
                print(f"{datetime.now():%H:%M:%S}  load: one day in 80 s (06:00-24:00, 4..70 req/s)", flush=True)
                day = self.load(work, serve, "day", "--duration-s", "80", "--day-s", str(80 * 24 / 18),
                                "--start-hour", "6", "--base-rps", "4", "--peak-rps", "70")
            elif phase == "day" and day is not None and day.poll() is not None:
                phase = "night"
                print(f"{datetime.now():%H:%M:%S}  load: the night at 4 req/s", flush=True)
                night = self.load(work, serve, "night", "--duration-s", "300", "--base-rps", "4",
                                  "--peak-rps", "4")
            grew = grew or sizes[serve] == 2
            shrank = shrank or (grew and sizes[serve] == 1)
            if out.exists():
                lines = [ln for ln in out.read_text(errors="replace").splitlines() if ln.startswith("serve[")
                         and ("serving rps=" in ln or "router: " in ln)]
                for ln in lines[len(served):]:
                    if "router: " in ln or len(served) % 5 == 0:  # the load every 5 s, every router event
                        print(f"{'':8}  {ln}", flush=True)
                served = lines
            fresh = new_decisions(db, seen)
            if fresh is None:  # the controller has not created its DB yet
                continue
            for d in fresh:
                if d.job_id in names and (d.action != "hold" or d.reason in {"NO_FREE_NODES", "REPLICA_WARMING"}):
                    print(f"{d.time.astimezone(UTC):%H:%M:%S}  {d.job_id:>5} {names[d.job_id]:8} {d.action:6} "
                          f"{d.current_nodes}->{d.target_nodes}  {d.reason}: {d.message}", flush=True)
            if shrank and sizes[train] == 3:
                if night is not None:
                    night.terminate()
                    night.wait(60)
                return True
        return False


def run_serving(args: argparse.Namespace) -> int:
    demo = ServingDemo(args.cluster_dir, args.duration)
    shutil.rmtree(demo.dir, ignore_errors=True)
    demo.dir.mkdir(parents=True)
    try:
        db = demo.start_controller(demo.start_agents(), SERVING_POLICY, JOB_PATH)
        ok = demo.run(db)
        for name in ("day", "night"):
            path = demo.dir / f"{name}.json"
            if path.exists():
                s = json.loads(path.read_text())
                print(f"load, {name}: {s['sent']} requests, {s['failed']} failed, {s['shed']} shed, "
                      f"p99 {s['p99_ms']} ms")
        print("\ndone: the service scaled out at the peak and in after it; training yielded and took back"
              if ok else f"\ndemo timed out (see {demo.dir}/controller.log)")
        return 0 if ok else 1
    finally:
        demo.stop()
