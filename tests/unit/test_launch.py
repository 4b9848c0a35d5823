"""The templates' launcher: the grace signal and resize notices reach the program; the c10d store is pinned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from slurm_elastic import resize
from slurm_elastic.launch import rdzv_args

REPO = Path(__file__).resolve().parents[2]

PROGRAM = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def on(sig, frame):
    with out.open("a") as f:
        f.write("usr1\\n")
    if out.read_text().count("usr1") >= 2:
        sys.exit(7)
signal.signal(signal.SIGUSR1, on)
out.write_text("ready\\n")
while True:
    time.sleep(0.05)
"""


def _wait(probe, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_rdzv_conf_pins_the_store_to_the_batch_host() -> None:
    args = ["--nnodes=1:3", "--rdzv-conf=last_call_timeout=2", "train.py"]
    leader = {"SLURM_ELASTIC_RDZV_HOST_NODE": "n1", "SLURMD_NODENAME": "n1"}
    assert rdzv_args(args, leader)[1] == "--rdzv-conf=last_call_timeout=2,is_host=true"
    assert rdzv_args(args, {**leader, "SLURMD_NODENAME": "n2"})[1] == "--rdzv-conf=last_call_timeout=2,is_host=false"
    ext = {**leader, "SLURM_ELASTIC_ROLE": "extension"}
    assert rdzv_args(args, ext)[1].endswith("is_host=false")
    assert rdzv_args(["--rdzv-conf", "a=1", "x.py"], leader) == ["--rdzv-conf", "a=1,is_host=true", "x.py"]
    assert rdzv_args(["x.py"], leader) == ["--rdzv-conf=is_host=true", "x.py"]
    assert rdzv_args(args, {}) == args  # not told which node hosts it: torch decides


def test_exec_forwards_the_signal_and_new_notices_and_survives(tmp_path: Path) -> None:
    out = tmp_path / "out"
    notice_file = tmp_path / ".slurm-elastic" / "resize-5.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), resize.ENV_FILE: str(notice_file)}
    env.pop("SLURM_ELASTIC_ROLE", None)
    proc = subprocess.Popen([sys.executable, "-m", "slurm_elastic.launch", "exec", sys.executable, "-c", PROGRAM,
                             str(out)], env=env)
    try:
        _wait(lambda: out.exists() and "ready" in out.read_text())
        proc.send_signal(signal.SIGUSR1)  # what scancel --signal=USR1 does to the step's task
        _wait(lambda: out.read_text().count("usr1") == 1)
        assert proc.poll() is None  # the launcher survived it
        resize.post(resize.make_notice("grow", 30), str(notice_file))  # a notice becomes the same signal
        assert proc.wait(timeout=20) == 7  # the program's own exit status
    finally:
        if proc.poll() is None:
            proc.kill()


STARTED = "import sys, time; open(sys.argv[1], 'w').write(f'ready {time.time()}')"


def _gated(tmp_path: Path, notice_file: Path, grace_s: str) -> tuple[subprocess.Popen[bytes], Path]:
    """The launcher in an extension job, gating a program that writes when it started."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), resize.ENV_FILE: str(notice_file),
           "SLURM_ELASTIC_ROLE": "extension", "SLURM_ELASTIC_NOTICE_GRACE": grace_s}
    proc = subprocess.Popen([sys.executable, "-m", "slurm_elastic.launch", "exec", sys.executable, "-c", STARTED,
                             str(out)], env=env)
    return proc, out


def _started_at(proc: subprocess.Popen[bytes], out: Path) -> float:
    try:
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    return float(out.read_text().split()[1])


def test_extension_gate_waits_until_the_deadline_without_an_acknowledgement(tmp_path: Path) -> None:
    """No notice: the gate posts a fresh one (grace 1 s) and, unacknowledged, starts nothing before its deadline
    (the program's own start time says so: no fixed sleep to prove that nothing started)."""
    notice_file = tmp_path / "resize-5.json"
    proc, out = _gated(tmp_path, notice_file, "1")
    started = _started_at(proc, out)
    n = resize.read_notice(str(notice_file))
    assert n is not None and n.kind == "grow" and resize.read_ack(str(notice_file)) is None
    assert started >= n.deadline


def test_extension_gate_starts_once_acknowledged(tmp_path: Path) -> None:
    """A grow notice with 30 s of grace: the acknowledgement, not the deadline, lets the program start."""
    notice_file = tmp_path / "resize-5.json"
    n = resize.make_notice("grow", 30)
    resize.post(n, str(notice_file))
    proc, out = _gated(tmp_path, notice_file, "30")
    assert resize.acknowledge(path=str(notice_file))
    started = _started_at(proc, out)
    ack = resize.read_ack(str(notice_file))
    assert ack is not None and ack.id == n.id and ack.time <= started < n.deadline
