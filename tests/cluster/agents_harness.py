"""Node agents on the live cluster, for tests: one agent per node over its node's virtual GPUs.

Jobs run the workload helper (``python -m slurm_elastic.testing.vgpu.workload``), which registers its pid on the job's
GPUs; the real prolog/epilog write and remove the map files; the agent maps pids to jobs through the real
cgroups of Slurm 22.05 and reads GPUs through pynvml over the virtual libnvidia-ml.so.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import filecmp
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from slurm_elastic.agent.auth import ClientAuth
from slurm_elastic.agent.client import AgentClient
from slurm_elastic.agent.munge import Munge
from slurm_elastic.agent.munge_auth import MungeClientAuth
from slurm_elastic.agent.payload import NodeReport
from slurm_elastic.testing.vgpu.build import build_library
from slurm_elastic.testing.vgpu.state import make_node_state
from slurm_elastic.testing.vgpu.statefile import StateFile
from tests.cluster.harness import AGENT_PORT_BASE, TestCluster, stop_processes

REPO = Path(__file__).resolve().parents[2]
INTERVAL_S = 1.0
T = TypeVar("T")


class Agents:
    def __init__(self, cluster: TestCluster, key: bytes, procs: dict[str, subprocess.Popen[bytes]],
                 key_file: Path, metrics_token_file: Path) -> None:
        self.cluster = cluster
        self.key = key
        self.procs = procs
        self.key_file = key_file
        self.metrics_token_file = metrics_token_file  # the bearer token of /metrics, for agents and controller
        self.auth = "hmac"  # how the agents authenticate requests: "hmac" (key_file) or "munge"
        self.client_auth: ClientAuth | None = None  # with "munge": the controller side the tests use

    @staticmethod
    def url(node: str) -> str:
        return f"http://127.0.0.1:{AGENT_PORT_BASE + int(node.removeprefix('n'))}"

    @staticmethod
    def metrics_address(node: str) -> str:
        """host:port of the node agent's /metrics listener."""
        return f"127.0.0.1:{AGENT_PORT_BASE + 300 + int(node.removeprefix('n'))}"

    def metrics_url(self, node: str) -> str:
        return f"http://{self.metrics_address(node)}/metrics"

    @property
    def metrics_token(self) -> str:
        return self.metrics_token_file.read_text().strip()

    def report(self, node: str) -> NodeReport:
        async def fetch() -> NodeReport:
            async with AgentClient(self.client_auth or self.key, timeout_s=10) as client:
                return await client.fetch(self.url(node))

        return asyncio.run(fetch())

    def state(self, node: str) -> StateFile:
        return StateFile(self.cluster.root / "vgpu" / f"{node}.state")

    @property
    def nodes(self) -> list[str]:
        """The nodes that have an agent here (the controller's [agents.urls])."""
        return list(self.procs)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 90.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.25)


def install_plugins(cluster: TestCluster) -> None:
    """The cluster runs copies of plugins/{prolog,epilog}.sh made at its start; refresh stale copies (what
    cluster.sh start does) so the scripts under test are the checkout's."""
    for name in ("prolog.sh", "epilog.sh"):
        src, dst = REPO / "plugins" / name, cluster.root / "etc" / name
        if not dst.exists() or not filecmp.cmp(src, dst, shallow=False):
            tmp = dst.with_name(f".{name}.new")
            shutil.copy(src, tmp)
            tmp.chmod(0o755)
            os.replace(tmp, dst)


def wait_answering(agents: Agents, logs: Path, what: str) -> None:
    """Wait (60 s at most) until every agent process of ``agents`` answers; one that exited fails the test,
    naming its log under ``logs``."""
    def all_up() -> bool | None:
        for node, p in agents.procs.items():
            assert p.poll() is None, f"agent for {node} exited: see {logs}/agent-{node}.log"
            try:
                agents.report(node)
            except Exception:
                return None
        return True

    wait_for(what, all_up, timeout=60)


def prepare_agents(cluster: TestCluster, key_dir: Path, nodes: Sequence[str] = ()) -> tuple[Path, Path]:
    """What every node's agent starts from: the plugins, fresh 4-GPU virtual state per node (``nodes``, default
    the always-on ones), a new shared key and metrics token (0600) in ``key_dir``. Returns (key file, token file)."""
    install_plugins(cluster)
    vgpu_dir = cluster.root / "vgpu"
    for node in nodes or cluster.nodes:
        # nK's (the namespace cluster's xK's) GPU device minors start at (K - 1) * GPUs per node (docker-slurm/)
        StateFile(vgpu_dir / f"{node}.state").write(make_node_state(
            node, cluster.gpus_per_node, minor_base=(int(node.lstrip("nx")) - 1) * cluster.gpus_per_node))
    key_file = key_dir / "agent.key"
    key_file.write_bytes(os.urandom(32).hex().encode())
    key_file.chmod(0o600)
    token_file = key_dir / "metrics.token"
    token_file.write_text(os.urandom(24).hex() + "\n")
    token_file.chmod(0o600)
    return key_file, token_file


@contextlib.contextmanager
def running_agents(cluster: TestCluster, key_dir: Path, *, interval_s: float = INTERVAL_S,
                   window_s: float = 30, auth: str = "hmac", nodes: Sequence[str] = ()) -> Iterator[Agents]:
    """One agent per node (port AGENT_PORT_BASE + node number, /metrics 300 above, with the bearer token in
    ``key_dir/metrics.token``) over fresh 4-GPU virtual state; stopped on exit. ``auth = "munge"``: the agents
    take MUNGE credentials of this process's user from the cluster's munged instead of the key. ``nodes``: default
    the always-on nodes; the power-saving test adds the power-saved ones (an agent runs whether its node is on)."""
    key_file, token_file = prepare_agents(cluster, key_dir, nodes)
    lib = build_library(REPO / "build" / "vgpu")
    vgpu_dir = cluster.root / "vgpu"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = cluster.root / "log"
    try:
        for node in nodes or cluster.nodes:
            env = {**cluster.env, "LD_LIBRARY_PATH": str(lib.parent),
                   "SLURM_ELASTIC_VGPU_STATE": str(vgpu_dir / f"{node}.state")}
            port = int(Agents.url(node).rsplit(":", 1)[1])
            with open(logs / f"agent-{node}.log", "ab") as log:
                procs[node] = subprocess.Popen(
                    [sys.executable, "-c", "from slurm_elastic.cli import main; main()", "agent", "-v",
                     "--node", node, "--listen", "127.0.0.1", "--port", str(port), "--key-file", str(key_file),
                     "--gpu-map-dir", str(cluster.root / "gpu-map"), "--interval", str(interval_s),
                     "--window", str(window_s), "--metrics-port", Agents.metrics_address(node).rsplit(":", 1)[1],
                     "--metrics-token-file", str(token_file), "--auth", auth,
                     "--munge-controller-user", str(os.geteuid())], env=env, stdout=log, stderr=subprocess.STDOUT)
        result = Agents(cluster, key_file.read_bytes(), procs, key_file, token_file)
        result.auth = auth
        if auth == "munge":
            result.client_auth = MungeClientAuth(Munge(), os.geteuid())

        wait_answering(result, logs, "the agents to answer")
        yield result
    finally:
        stop_processes(procs.values())


# The workload needs only the standard library: any user's job runs it with the system Python.
JOB_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def workload(util: int, *, then_sleep: bool = False) -> str:
    run = f"{JOB_PYTHON} -m slurm_elastic.testing.vgpu.workload --util {util} --mem-mib 1000"
    head = f"#!/bin/bash\nexport PYTHONPATH={REPO}\n"
    return f"{head}{run}\nsleep 600\n" if then_sleep else f"{head}exec {run}\n"


