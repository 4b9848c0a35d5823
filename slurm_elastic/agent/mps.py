"""MPS server state per GPU, as the prolog set it up (plugins/prolog.sh) and as its control daemon says.

The prolog runs one MPS control daemon per GPU that MPS jobs use, with its directories under
``<mps_dir>/<node>/gpu<index>/``::

    pipe/           CUDA_MPS_PIPE_DIRECTORY of that GPU's control daemon
    log/            CUDA_MPS_LOG_DIRECTORY
    jobs/<job id>   "uid active_thread_percentage", one file per MPS job on that GPU (the epilog removes it)

For each such GPU the reader asks the daemon ``get_server_list`` (``nvidia-cuda-mps-control`` with that pipe
directory, a timeout, no shell). An answer means the daemon is up, and its lines are the MPS server pids; a
failure means it is not running. A GPU without a directory has never had MPS here and is not reported.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MPS_STATES = ("running", "stopped", "error")


@dataclass(frozen=True)
class MpsReport:
    gpu: int
    daemon: str  # one of MPS_STATES
    pipe_dir: str
    servers: tuple[int, ...] = ()  # MPS server pids (get_server_list)
    jobs: tuple[int, ...] = ()  # MPS jobs on this GPU, per the prolog's job files
    active_thread_percentage: int | None = None  # the newest job's share
    error: str | None = None


@dataclass(frozen=True)
class ControlResult:
    returncode: int
    stdout: str
    stderr: str


ControlRunner = Callable[[Sequence[str], str, Mapping[str, str], float], ControlResult]


def subprocess_control(argv: Sequence[str], stdin: str, env: Mapping[str, str], timeout: float) -> ControlResult:
    cp = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, env=dict(env),  # noqa: S603
                        timeout=timeout, check=False)
    return ControlResult(cp.returncode, cp.stdout or "", cp.stderr or "")


class MpsReader:
    def __init__(self, mps_dir: Path, node: str, control: str, *, timeout_s: float = 5.0,
                 runner: ControlRunner = subprocess_control) -> None:
        self.base = Path(mps_dir) / node
        self.control = control
        self.timeout_s = timeout_s
        self._run = runner

    def read(self) -> tuple[MpsReport, ...]:
        try:
            dirs = sorted((d for d in self.base.iterdir() if d.name.startswith("gpu") and d.name[3:].isdigit()),
                          key=lambda d: int(d.name[3:]))
        except OSError:
            return ()
        return tuple(self._gpu(int(d.name[3:]), d) for d in dirs)

    def _gpu(self, index: int, d: Path) -> MpsReport:
        jobs: list[tuple[float, int, int | None]] = []
        try:
            for f in (d / "jobs").iterdir():
                if not f.name.isdigit():
                    continue
                fields = f.read_text(encoding="utf-8", errors="replace").split()
                pct = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
                jobs.append((f.stat().st_mtime, int(f.name), pct))
        except OSError:
            pass
        jobs.sort()
        pipe = d / "pipe"
        env = {"PATH": os.environ.get("PATH", os.defpath), "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
               "CUDA_MPS_LOG_DIRECTORY": str(d / "log")}
        daemon, error = "stopped", None
        servers: tuple[int, ...] = ()
        try:
            res = self._run([self.control], "get_server_list\n", env, self.timeout_s)
        except FileNotFoundError:
            daemon, error = "error", f"{self.control} not found"
        except (OSError, subprocess.SubprocessError) as exc:
            daemon, error = "error", f"{self.control}: {exc}"
        else:
            if res.returncode == 0:
                daemon = "running"
                servers = tuple(int(t) for t in res.stdout.split() if t.isdigit())
        return MpsReport(
            gpu=index, daemon=daemon, pipe_dir=str(pipe), servers=servers,
            jobs=tuple(sorted(j for _, j, _ in jobs)),
            active_thread_percentage=jobs[-1][2] if jobs else None, error=error,
        )
