"""docker-slurm/slurm-daemon.sh restart-slurmctld (the MIG workflow's restart command) while a reconfigure is in
flight: on 23.11+ slurmctld then hands over to a re-executed process that its pid file does not name yet
(docs/slurm-facts.md). The restart must leave exactly the slurmctld it started, answering; before daemon-lib.sh it
left the reconfigure's process running with the config it had read (4 of 4 times on 24.11 and on 26.05).
On 22.05 a reconfigure stays in the same process: the test then only checks the plain restart.

Run under the shared lock: ``flock /tmp/slurm-elastic-cluster-tests.lock .venv/bin/pytest
tests/cluster/test_daemon_control_cluster.py``; on a release cluster with its env.sh sourced.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster.harness import RELEASE, REPO, TestCluster

pytestmark = pytest.mark.cluster

DAEMON = REPO / "docker-slurm" / "slurm-daemon.sh"
# The handover window is short: three tries on a release that has it; one plain restart on 22.05.
ROUNDS = 1 if RELEASE == "22.05" else 3


def slurmctlds(cluster: TestCluster) -> dict[int, bool]:
    """This cluster's slurmctld processes (name, SLURM_CONF and root, read here independently of daemon-lib.sh),
    each with whether it is a reconfigure's re-executed process (SLURMCTLD_RECONF=1)."""
    conf = f"SLURM_CONF={cluster.root / 'etc' / 'slurm.conf'}".encode()
    root = os.path.realpath(os.environ.get("SLURM_ELASTIC_ROOTFS", "/"))
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not (entry / "comm").read_text().startswith("slurmctld") or os.readlink(entry / "root") != root:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if conf in env and b"SLURMSCRIPTD_MODE=1" not in env:
            found[int(entry.name)] = b"SLURMCTLD_RECONF=1" in env
    return found


def wait_logged(log: Path, offset: int, text: bytes, timeout: float = 60) -> None:
    """Until ``text`` is in the log after ``offset``, polled every 2 ms: the handover it announces lasts ~50 ms."""
    deadline = time.monotonic() + timeout
    with log.open("rb") as f:
        seen = b""
        while text not in seen:
            assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {text!r} in {log}"
            f.seek(offset)
            seen = f.read()
            time.sleep(0.002)


def test_a_restart_during_a_reconfigure_leaves_only_the_slurmctld_it_started(cluster: TestCluster) -> None:
    log = cluster.root / "log" / "slurmctld.log"
    for _ in range(ROUNDS):
        offset = log.stat().st_size
        reconfigure = subprocess.Popen(["scontrol", "reconfigure"], env=cluster.env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        try:
            # Restart as soon as slurmctld has taken the request: on 23.11+ the handover is then under way.
            wait_logged(log, offset, b"econfigur")
            out = subprocess.run([str(DAEMON), "restart-slurmctld"], env=cluster.env, capture_output=True,
                                 text=True, timeout=180, check=False)
        finally:
            reconfigure.wait(timeout=120)  # its slurmctld may be gone before it answers: any outcome
        assert out.returncode == 0, out.stdout + out.stderr
        running = slurmctlds(cluster)
        started = int((cluster.root / "run" / "slurmctld.pid").read_text().strip())
        assert running == {started: False}, f"the restart started {started}; running: {running}"
        assert "is UP" in cluster.run(["scontrol", "ping"], check=True).stdout
