"""The live test cluster as tests see it: start-or-reuse, submit as any user, wait for states.

Tests never mock Slurm: everything here runs the real client commands against docker-slurm/cluster.sh's cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slurm_elastic.slurm.decode import parse_squeue
from slurm_elastic.slurm.model import Job

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "docker-slurm" / "cluster.sh"
# Which cluster: 22.05 (default) or a release cluster (24.11, 26.05), whose env.sh sets both of these and puts
# its chrooted client commands first in PATH.
RELEASE = os.environ.get("SLURM_ELASTIC_RELEASE", "22.05")
# Which 22.05 instance: lane 1 (the default cluster), or lane 2 or 3 (`cluster.sh start lane2|lane3`, the other
# lanes of scripts/test, SLURM_ELASTIC_CLUSTER_LANES), which have their own directory, ports and job ids.
LANE = os.environ.get("SLURM_ELASTIC_CLUSTER_LANE", "1")
if LANE not in ("1", "2", "3") or (LANE != "1" and RELEASE != "22.05"):
    raise RuntimeError(f"SLURM_ELASTIC_CLUSTER_LANE={LANE!r}: 1, or 2 or 3 for another 22.05 instance")
# Agents the tests start listen on AGENT_PORT_BASE + node number (and /metrics on AGENT_PORT_BASE + 300 + node
# number): its own range per release and lane (lane 2: 21000, lane 3: 22000), so their tests never collide.
AGENT_PORT_BASE = 18000 + ({"24.11": 1000, "26.05": 2000}.get(RELEASE, 0) if LANE == "1" else 1000 * (int(LANE) + 1))
# cluster.sh's second argument, and the variable that names its directory
CLUSTER_ARG = RELEASE if LANE == "1" else f"lane{LANE}"
CLUSTER_DIR_VAR = "SLURM_ELASTIC_CLUSTER_DIR" if LANE == "1" else f"SLURM_ELASTIC_LANE{LANE}_CLUSTER_DIR"
DEFAULT_ROOT = Path(os.environ.get(
    CLUSTER_DIR_VAR,
    "/var/tmp/slurm-elastic-cluster" + ("" if RELEASE == "22.05" else f"-{RELEASE}") if LANE == "1"
    else f"/var/tmp/slurm-elastic-cluster-lane{LANE}"))


@dataclass
class TestCluster:
    root: Path = DEFAULT_ROOT
    nodes: list[str] = field(default_factory=lambda: ["n1", "n2", "n3", "n4"])
    gpus_per_node: int = 4

    __test__ = False  # not a pytest test class

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SLURM_CONF=str(self.root / "etc" / "slurm.conf"),
            SLURM_ELASTIC_CLUSTER_DIR=str(self.root),
            SLURM_ELASTIC_VGPU_DIR=str(self.root / "vgpu"),
            SLURM_ELASTIC_GPU_MAP_DIR=str(self.root / "gpu-map"),
        )
        return env

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    def gpu_device(self, node: str, index: int) -> Path:
        return self.root / "dev" / node / f"gpu{index}"

    # --- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        subprocess.run([str(CLUSTER_SH), "start", CLUSTER_ARG], check=True, timeout=900,
                       env={**os.environ, CLUSTER_DIR_VAR: str(self.root)})

    def is_up(self) -> bool:
        cp = subprocess.run([str(CLUSTER_SH), "status", CLUSTER_ARG], capture_output=True, text=True, timeout=60,
                            check=False,
                            env={**os.environ, CLUSTER_DIR_VAR: str(self.root)})
        return cp.returncode == 0

    # --- commands -----------------------------------------------------------------------------------------
    def run(self, argv: Sequence[str], user: str | None = None, input_text: str | None = None,
            check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        full = list(argv) if user in (None, "root") else ["runuser", "-u", str(user), "--", *argv]
        return subprocess.run(full, capture_output=True, text=True, errors="replace", env=self.env,
                              input=input_text, check=check, timeout=timeout)

    def submit(self, script_text: str, *sbatch_args: str, user: str = "root") -> int:
        """sbatch the script (stdin) as ``user``; output goes to <root>/jobs/<id>.out."""
        args = ["sbatch", "--parsable", "--chdir=/tmp", f"--output={self.jobs_dir}/%j.out", *sbatch_args]
        cp = self.run(args, user=user, input_text=script_text)
        if cp.returncode != 0:
            raise RuntimeError(f"sbatch failed ({cp.returncode}): {cp.stderr.strip()}")
        return int(cp.stdout.strip().split(";")[0])

    def squeue_json(self) -> dict[str, object]:
        cp = self.run(["squeue", "--all", "--json"], check=True)
        data: dict[str, object] = json.loads(cp.stdout)
        return data

    def jobs(self) -> tuple[Job, ...]:
        """The adapter's view of ``squeue --all --json``: the same fields on every release (24.11 and later give
        numbers as {set, infinite, number} objects and job_state as a list)."""
        return parse_squeue(self.squeue_json())[1]

    def job(self, job_id: int) -> Job | None:
        return next((j for j in self.jobs() if j.job_id == job_id), None)

    def job_record(self, job_id: int) -> dict[str, object] | None:
        jobs = self.squeue_json().get("jobs")
        assert isinstance(jobs, list)
        for j in jobs:
            if j.get("job_id") == job_id:
                return dict(j)
        return None

    def job_state(self, job_id: int) -> str:
        """Current state from squeue, falling back to sacct once the job has left the queue."""
        rec = self.job_record(job_id)
        if rec is not None:
            state = rec.get("job_state")
            return str(state[0] if isinstance(state, list) else state)
        cp = self.run(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State"])
        lines = cp.stdout.strip().splitlines()  # a resized job's earlier records are RESIZING: the last one counts
        return lines[-1].split()[0] if lines else "UNKNOWN"

    def wait_state(self, job_id: int, states: Iterable[str], timeout: float = 60) -> str:
        wanted = set(states)
        deadline = time.monotonic() + timeout
        state = "UNKNOWN"
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in wanted:
                return state
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} still {state} after {timeout}s (wanted {sorted(wanted)})")

    def cancel(self, *job_ids: int) -> None:
        if job_ids:
            self.run(["scancel", *map(str, job_ids)])

    def wait_nodes_idle(self, timeout: float = 120) -> None:
        """Until the always-on nodes are idle. A node Slurm drained for "Kill task failed" (a step's processes
        outlived UnkillableStepTimeout on this loaded host; its slurmstepd has given up by the time the node is
        drained, not draining) is resumed, as an admin would once nothing of the step is left, with a warning:
        otherwise every later test of the session would wait here on that one node."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # the always-on nodes: the power-saved ones (partition cold) are idle~ while off (power-saving.md)
            cp = self.run(["sinfo", "-h", "-N", "-n", ",".join(self.nodes), "-o", "%N %T %E"])
            rows = {r[0]: r[1:] for r in (line.split(maxsplit=2) for line in cp.stdout.splitlines() if line.strip())}
            if rows and all(r[0] == "idle" for r in rows.values()):
                return
            for node, (state, *reason) in rows.items():
                if state == "drained" and reason == ["Kill task failed"]:
                    warnings.warn(f"{node} was drained for 'Kill task failed': resumed", stacklevel=2)
                    self.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
            time.sleep(0.5)
        raise TimeoutError(f"nodes not idle after {timeout}s: {cp.stdout.strip()}")

    def cancel_all(self) -> None:
        for user in ("root", "alice", "bob"):
            self.run(["scancel", "-u", user])


def stop_processes(procs: Iterable[subprocess.Popen[bytes]], timeout_s: float = 30.0) -> None:
    """SIGTERM every process still running (all first, so that they stop side by side), then wait for each; one
    still running after ``timeout_s`` is killed."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
