"""docker-slurm/daemon-lib.sh, which the test clusters' scripts use to find and stop their own daemons: matched by
name (also Debian's ``-wlm`` name a re-executed slurmctld gets), SLURM_CONF, root and slurmd's ``-N``; never another
cluster's. Stand-in daemons are Python processes started through symlinks (the kernel names a process after the
file it executes) named ``fakectld``/``fakeslurmd``, never like a real daemon: a broken library under test must not
be able to signal a test cluster running on this host (it once did, in a mutation check of this test)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "docker-slurm" / "daemon-lib.sh"
SLEEP = "import time\ntime.sleep(120)\n"
IGNORE_TERM = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)\n"
# On SIGTERM, start a successor of the same name and environment and exit at once, as a 23.11+ slurmctld does on
# `scontrol reconfigure` (its new process is born while the old one still runs; the old one then exits).
HAND_OVER = """import os, signal, subprocess, sys, time
def hand_over(signo, frame):
    subprocess.Popen([os.environ["STAND_IN"], "-c", "import time; time.sleep(120)"], start_new_session=True)
    os._exit(0)
signal.signal(signal.SIGTERM, hand_over)
time.sleep(120)
"""


class StandIns:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.conf = str(tmp / "mine" / "slurm.conf")
        self.other_conf = str(tmp / "other" / "slurm.conf")

    def start(self, name: str, code: str = SLEEP, conf: str | None = None, *args: str,
              extra_env: dict[str, str] | None = None) -> int:
        link = self.tmp / "bin" / name
        link.parent.mkdir(exist_ok=True)
        if not link.exists():
            link.symlink_to(sys.executable)
        env = {"PATH": os.environ.get("PATH", ""), "SLURM_CONF": conf or self.conf, "STAND_IN": str(link),
               **(extra_env or {})}
        proc = subprocess.Popen([str(link), "-c", code, *args], env=env, start_new_session=True)
        self.procs.append(proc)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/comm").read_text().strip() != name[:15]:  # exec done
            assert time.monotonic() < deadline, f"stand-in {name} did not start"
            time.sleep(0.01)
        return proc.pid

    def lib(self, script: str, rootdir: str = "/", timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``script`` in bash with the library sourced, as the cluster scripts do (set -euo pipefail)."""
        return subprocess.run(["bash", "-c", f'set -euo pipefail\n. "{LIB}"\n{script}'], capture_output=True,
                              text=True, timeout=timeout, check=False,
                              env={"PATH": os.environ.get("PATH", ""), "SLURM_CONF": self.conf,
                                   "DAEMON_ROOTDIR": rootdir})

    def pids(self, name: str, node: str = "", rootdir: str = "/") -> set[int]:
        out = self.lib(f'daemon_pids {name} "{node}"', rootdir)
        assert out.returncode == 0, out.stderr
        return {int(p) for p in out.stdout.split()}


def wait_term_handled(pid: int, field: str) -> None:
    """Until the stand-in has set up its SIGTERM disposition (``SigIgn`` or ``SigCgt`` in /proc/PID/status)."""
    deadline = time.monotonic() + 10
    while True:
        masks = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                     if line.startswith("Sig"))
        if int(masks[field], 16) & (1 << (signal.SIGTERM - 1)):
            return
        assert time.monotonic() < deadline, f"stand-in {pid} did not set up its SIGTERM handling"
        time.sleep(0.01)


def alive(pid: int) -> bool:
    """Running (a zombie, exited but not yet reaped, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def stand_in_pids(tmp: Path) -> set[int]:
    """Every process started from this test's symlinks, successors included."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().split(b"\0")[0].startswith(
                    str(tmp / "bin").encode()):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def stand_ins(tmp_path: Path) -> Iterator[StandIns]:
    s = StandIns(tmp_path)
    try:
        yield s
    finally:
        for pid in stand_in_pids(tmp_path):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in s.procs:
            proc.wait(timeout=10)


def test_only_this_clusters_daemons_of_that_name_are_found(stand_ins: StandIns) -> None:
    mine = stand_ins.start("fakectld")
    reexecuted = stand_ins.start("fakectld-wlm")  # what a 23.11+ slurmctld is named after a reconfigure
    stand_ins.start("fakectld", SLEEP, stand_ins.other_conf)  # another cluster's
    stand_ins.start("fakectld", SLEEP, stand_ins.conf + ".old")  # a conf path that only starts the same
    stand_ins.start("fakectld-wlm", extra_env={"SLURMSCRIPTD_MODE": "1"})  # its slurmscriptd, not yet renamed
    stand_ins.start("fakedbd")
    assert stand_ins.pids("fakectld") == {mine, reexecuted}
    assert stand_ins.pids("fakedbd") != set() and stand_ins.pids("fakemunged") == set()


def test_slurmd_is_told_apart_by_its_node(stand_ins: StandIns) -> None:
    n1 = stand_ins.start("fakeslurmd", SLEEP, None, "-N", "n1")
    n12 = stand_ins.start("fakeslurmd", SLEEP, None, "-N", "n12")
    assert stand_ins.pids("fakeslurmd", "n1") == {n1}
    assert stand_ins.pids("fakeslurmd", "n12") == {n12}
    assert stand_ins.pids("fakeslurmd") == {n1, n12}


def test_a_release_clusters_root_must_match(stand_ins: StandIns, tmp_path: Path) -> None:
    stand_ins.start("fakectld")  # root / : not the daemon of a cluster whose daemons run in another root
    assert stand_ins.pids("fakectld", rootdir=str(tmp_path / "rootfs")) == set()


def test_stop_stops_ours_only_and_waits_until_they_are_gone(stand_ins: StandIns) -> None:
    mine = [stand_ins.start("fakectld"), stand_ins.start("fakectld-wlm")]
    other = stand_ins.start("fakectld", SLEEP, stand_ins.other_conf)
    out = stand_ins.lib('log() { echo "LOG $*"; }\nstop_daemons fakectld\necho done')
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "done"
    assert f"LOG stopped fakectld (pid {mine[0]} {mine[1]})" in out.stdout
    assert not any(alive(p) for p in mine)
    assert alive(other)


def test_stop_catches_the_successor_a_daemon_hands_over_to(stand_ins: StandIns, tmp_path: Path) -> None:
    first = stand_ins.start("fakectld", HAND_OVER)
    wait_term_handled(first, "SigCgt")
    out = stand_ins.lib("DAEMON_STOP_TIMEOUT=10 stop_daemons fakectld")
    assert out.returncode == 0, out.stderr
    assert "SIGKILL" not in out.stderr  # the successor got its own SIGTERM
    assert not alive(first)
    assert not any(alive(p) for p in stand_in_pids(tmp_path)), "the successor outlived the stop"


def test_one_that_ignores_sigterm_is_killed_after_the_bound(stand_ins: StandIns) -> None:
    stubborn = stand_ins.start("fakeslurmd", IGNORE_TERM, None, "-N", "n3")
    wait_term_handled(stubborn, "SigIgn")
    out = stand_ins.lib("DAEMON_STOP_TIMEOUT=1 stop_daemons fakeslurmd n3")
    assert out.returncode == 0, out.stderr
    assert "did not stop within 1s of SIGTERM: SIGKILL" in out.stderr
    assert not alive(stubborn)


def test_report_says_up_with_the_pids_or_down_with_a_failing_status(stand_ins: StandIns) -> None:
    pid = stand_ins.start("fakeslurmd", SLEEP, None, "-N", "n1")
    stand_ins.start("fakeslurmd", SLEEP, stand_ins.other_conf, "-N", "n2")  # another cluster's n2
    up = stand_ins.lib('report_daemon "slurmd n1" fakeslurmd n1')
    down = stand_ins.lib('report_daemon "slurmd n2" fakeslurmd n2')
    assert (up.returncode, up.stdout) == (0, f"{'slurmd n1':<12} up    pid {pid}\n")
    assert (down.returncode, down.stdout) == (1, f"{'slurmd n2':<12} DOWN\n")


@pytest.mark.parametrize("close", [True, False])
def test_close_inherited_fds_lets_go_of_a_lock_the_caller_handed_down(tmp_path: Path, close: bool) -> None:
    """`flock LOCK cluster.sh start`: the script closes the lock's fd before it starts a daemon that outlives it
    (without that, the daemon holds the lock: the check's other half)."""
    lock = tmp_path / "lock"
    first = "close_inherited_fds" if close else ":"
    script = f'set -euo pipefail\n. "{LIB}"\n{first}\nsleep 30 >/dev/null 2>&1 &\necho "$!"'
    starter = subprocess.run(["flock", str(lock), "bash", "-c", script], capture_output=True, text=True,
                             timeout=30, check=True)
    daemon = int(starter.stdout.split()[-1])
    try:
        free = subprocess.run(["flock", "-n", str(lock), "true"], timeout=30, check=False).returncode == 0
    finally:
        os.kill(daemon, signal.SIGKILL)
    assert free is close
