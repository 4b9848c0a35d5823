"""The network-namespace test cluster (docker-slurm/netns-cluster.sh) as tests see it: nodes x1..x4, each with its
own address, slurmd and agent in its own network namespace; the controller in the namespace se-ctl; faults (link
down, a blocked port, packet loss) set and healed through the script, so tests and people use the same commands.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

from slurm_elastic.store.records import ActionState
from slurm_elastic.testing.vgpu.build import build_library
from tests.cluster.agents_harness import REPO, Agents, prepare_agents, wait_answering
from tests.cluster.controller_harness import controller_config, set_util, util_script
from tests.cluster.harness import TestCluster, stop_processes
from tests.policy_text import CLUSTER, policy_text

NETNS_SH = REPO / "docker-slurm" / "netns-cluster.sh"
NETNS_ROOT = Path(os.environ.get("SLURM_ELASTIC_NETNS_CLUSTER_DIR", "/var/tmp/slurm-elastic-cluster-netns"))
NET = "10.77.0"
AGENT_PORT = 18000  # the same on every node: each node has its own address
CTLD_PORT = 19817
DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 2 --window 10s --cooldown 5s --grace 1s --signal USR2"
AGENT_TIMEOUT_S = 1.5
OPEN = {ActionState.INTENT, ActionState.IN_PROGRESS}
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING"}
POLICY = policy_text(CLUSTER, cooldown_s=5, grace_s=1)


def node_addr(node: str) -> str:
    return f"{NET}.{10 + int(node.removeprefix('x'))}"


def in_ns(name: str) -> list[str]:
    """The command prefix that runs a program in a node's (``x2``) or the controller's (``ctl``) network namespace.
    nsenter --net only: `ip netns exec` remounts /sys and would hide the cgroup tree."""
    return ["nsenter", f"--net=/run/netns/se-{name}"]


def netns(*args: str) -> None:
    """docker-slurm/netns-cluster.sh with these arguments (start, link x2 down, block ctl 19817, heal, ...)."""
    subprocess.run([str(NETNS_SH), *args], check=True, timeout=300, capture_output=True, text=True)


def netns_up() -> bool:
    return subprocess.run([str(NETNS_SH), "status"], capture_output=True, timeout=60, check=False).returncode == 0


class NetnsAgents(Agents):
    @staticmethod
    def url(node: str) -> str:
        return f"http://{node_addr(node)}:{AGENT_PORT}"

    @staticmethod
    def metrics_address(node: str) -> str:
        return f"{node_addr(node)}:0"


def spawn_agent(cluster: TestCluster, node: str, key_file: Path, *, interval_s: float = 1.0,
                window_s: float = 4) -> subprocess.Popen[bytes]:
    """The agent of ``node`` in the node's namespace, listening on the node's address (log: <root>/log/agent-X.log)."""
    lib = build_library(REPO / "build" / "vgpu")
    env = {**cluster.env, "LD_LIBRARY_PATH": str(lib.parent),
           "SLURM_ELASTIC_VGPU_STATE": str(cluster.root / "vgpu" / f"{node}.state")}
    with open(cluster.root / "log" / f"agent-{node}.log", "ab") as log:
        return subprocess.Popen(
            [*in_ns(node), sys.executable, "-c", "from slurm_elastic.cli import main; main()", "agent", "-v",
             "--node", node, "--listen", node_addr(node), "--port", str(AGENT_PORT),
             "--key-file", str(key_file), "--gpu-map-dir", str(cluster.root / "gpu-map"),
             "--interval", str(interval_s), "--window", str(window_s), "--metrics-port", "0"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)



@contextlib.contextmanager
def running_netns_agents(cluster: TestCluster, key_dir: Path, *, interval_s: float = 1.0,
                         window_s: float = 4) -> Iterator[NetnsAgents]:
    """One agent per node, in the node's namespace on its address, over fresh 4-GPU virtual state; stopped on exit."""
    key_file, token_file = prepare_agents(cluster, key_dir)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = cluster.root / "log"
    try:
        for node in cluster.nodes:
            procs[node] = spawn_agent(cluster, node, key_file, interval_s=interval_s, window_s=window_s)
        result = NetnsAgents(cluster, key_file.read_bytes(), procs, key_file, token_file)

        wait_answering(result, logs, "the four agents to answer on their nodes' addresses")
        yield result
    finally:
        stop_processes(procs.values())


def controller(agents: NetnsAgents, tmp: Path) -> tuple[Path, list[str]]:
    """The controller's config and the prefix that runs it in its own namespace. As packaged (5 s per agent in a
    30 s interval) an agent's timeout is well inside the interval; the harness's 3 s is not (its interval is 2 s)."""
    cfg = controller_config(tmp, agents)
    (tmp / "policy.toml").write_text(POLICY)
    text = cfg.read_text()
    assert text.count("timeout_s = 3\n") == 1
    cfg.write_text(text.replace("timeout_s = 3\n", f"timeout_s = {AGENT_TIMEOUT_S}\n"))
    return cfg, in_ns("ctl")


def elastic_job(cluster: TestCluster, util: int, *args: str, directives: str = DIRECTIVES,
                user: str = "bob") -> tuple[int, Path]:
    util_file = cluster.jobs_dir / f"util-{uuid.uuid4().hex[:8]}"
    set_util(util_file, util)
    job = cluster.submit(util_script(cluster, util_file, directives), "--gres=gpu:1", "--time=30", *args, user=user)
    cluster.wait_state(job, {"RUNNING"})
    return job, util_file
