"""A pretend GPU workload for Slurm jobs on virtual GPUs (tests and demo only).

Run inside a job::

    python -m slurm_elastic.testing.vgpu.workload --util 90 --mem-mib 1000 [--duration S] [--util-file F]

It registers its pid on the job's GPUs in the node's virtual GPU state, so the virtual NVML reports it as a
process at that utilization, then sleeps. The GPUs are ``SLURM_JOB_GPUS`` (global indices on the node), else
``CUDA_VISIBLE_DEVICES``, else ``--gpus``. The state file is ``--state``, else ``$SLURM_ELASTIC_VGPU_STATE``,
else ``$SLURM_ELASTIC_VGPU_DIR/<SLURMD_NODENAME>.state``. On SIGTERM, SIGINT, SIGHUP, ``--duration`` or any
exit it removes its entries (a SIGKILLed workload vanishes anyway: the library drops dead pids). SIGUSR2
re-reads ``--util-file`` at once; the file is also polled every second, so a test can move a job from 10% to
90% by writing a number into it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.testing.vgpu import STATE_DIR_ENV, STATE_ENV
from slurm_elastic.testing.vgpu.state import VgpuState, VgpuStateError, with_process, with_utilization, without_pid
from slurm_elastic.testing.vgpu.statefile import StateFile, host_starttime

POLL_S = 1.0


class VgpuWorkloadError(SlurmElasticError):
    """The workload cannot tell its GPUs or its state file."""


def parse_gpu_list(text: str) -> tuple[int, ...]:
    """``"0,2-3"`` -> (0, 2, 3). Slurm writes SLURM_JOB_GPUS as a comma list; ranges are accepted too."""
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise VgpuWorkloadError(f"not a GPU index list: {text!r}")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return tuple(dict.fromkeys(out))


def allocated_gpus(env: Mapping[str, str], explicit: str | None = None) -> tuple[int, ...]:
    if explicit:
        return parse_gpu_list(explicit)
    for var in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = env.get(var, "").strip()
        if value and value != "NoDevFiles":
            return parse_gpu_list(value)
    raise VgpuWorkloadError("no GPUs: SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES are unset (use --gpus)")


def node_name(env: Mapping[str, str]) -> str:
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def state_path(env: Mapping[str, str], node: str, explicit: str | None = None) -> Path:
    if explicit:
        return Path(explicit)
    if env.get(STATE_ENV):
        return Path(env[STATE_ENV])
    if env.get(STATE_DIR_ENV):
        return Path(env[STATE_DIR_ENV]) / f"{node}.state"
    raise VgpuWorkloadError(f"no state file: set --state, ${STATE_ENV} or ${STATE_DIR_ENV}")


def read_util_file(path: Path | None, current: int) -> int:
    if path is None:
        return current
    try:
        value = int(float(path.read_text().strip()))
    except (OSError, ValueError):
        return current
    return max(0, min(100, value))


def prune_dead(state: VgpuState, proc_root: str = "/proc") -> VgpuState:
    """Drops entries whose process is gone (left by a SIGKILLed workload), keeping the file small."""
    dead = {p.pid for p in state.processes if not Path(proc_root, str(p.pid)).exists()}
    for pid in dead:
        state = without_pid(state, pid)
    return state


class _Signals:
    def __init__(self) -> None:
        self.stop = False
        self.reload = False
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        signal.set_wakeup_fd(self._w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_stop)
        signal.signal(signal.SIGUSR2, self._on_reload)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop = True

    def _on_reload(self, signum: int, frame: FrameType | None) -> None:
        self.reload = True

    def wait(self, timeout: float) -> None:
        """Sleeps until ``timeout`` passes or a signal arrives."""
        with contextlib.suppress(InterruptedError):
            ready, _, _ = select.select([self._r], [], [], max(0.0, timeout))
            if ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._r, 512)


def run(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_elastic.testing.vgpu.workload",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--util", type=int, required=True, help="SM utilization percent (0-100)")
    parser.add_argument("--mem-mib", type=int, default=1000, help="GPU memory per GPU, MiB")
    parser.add_argument("--mem-util", type=int, default=None, help="memory utilization percent (default 0.4*util)")
    parser.add_argument("--duration", type=float, default=0.0, help="seconds to run (0: until signalled)")
    parser.add_argument("--util-file", type=Path, default=None, help="file holding the utilization, polled")
    parser.add_argument("--state", default=None, help="state file (default from the environment)")
    parser.add_argument("--gpus", default=None, help="GPU indices (default from SLURM_JOB_GPUS)")
    args = parser.parse_args(argv)
    environ = os.environ if env is None else env
    if not 0 <= args.util <= 100 or args.mem_mib < 0:
        parser.error("--util must be 0-100 and --mem-mib >= 0")
    try:
        gpus = allocated_gpus(environ, args.gpus)
        node = node_name(environ)
        statefile = StateFile(state_path(environ, node, args.state))
        if not statefile.path.exists():
            raise VgpuWorkloadError(f"state file {statefile.path} does not exist (no virtual GPUs on {node})")
    except VgpuWorkloadError as exc:
        print(f"workload: error: {exc}", file=sys.stderr)
        return 1

    pid = os.getpid()
    util = read_util_file(args.util_file, args.util)
    signals = _Signals()
    start = host_starttime(pid)  # as the agent outside a resumed node's time namespace reads it
    statefile.update(lambda s: with_process(prune_dead(s), pid, gpus, sm_util=util, memory_mib=args.mem_mib,
                                            mem_util=args.mem_util, starttime=start))
    print(f"workload: pid {pid} on {node} GPUs {','.join(map(str, gpus))} at {util}% "
          f"({args.mem_mib} MiB each), state {statefile.path}", flush=True)
    deadline = time.monotonic() + args.duration if args.duration > 0 else None
    try:
        while not signals.stop:
            if deadline is not None and time.monotonic() >= deadline:
                break
            signals.reload = False
            new = read_util_file(args.util_file, util)
            if new != util:
                util = new
                statefile.update(functools.partial(with_utilization, pid=pid, sm_util=util, mem_util=args.mem_util))
                print(f"workload: pid {pid} now at {util}%", flush=True)
            timeout = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            signals.wait(timeout)
    finally:
        try:
            statefile.update(lambda s: without_pid(s, pid))
            print(f"workload: pid {pid} removed from {statefile.path}", flush=True)
        except (OSError, VgpuStateError) as exc:  # the state went away: nothing left to clean
            print(f"workload: could not remove pid {pid} from {statefile.path}: {exc}", file=sys.stderr)
    return 0


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
