"""Reading and writing a node's virtual GPU state file safely (the imperative shell around :mod:`.state`).

Protocol, shared with the C library (vnvml.c):

- ``<state>.lock`` (mode 0666) is the lock: writers hold ``flock(LOCK_EX)`` across read-modify-write, readers
  hold ``LOCK_SH`` while reading.
- A writer replaces the file with temp + ``rename``, keeping the file's mode. The state directory in the test
  cluster is sticky and world-writable (1777), where only the file's owner may rename over it; a workload running
  as another user then rewrites the file in place instead, which the locks keep invisible to readers.
- Every complete file ends with an ``end`` record, so a reader that took no lock can still tell a torn file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from slurm_elastic.testing.vgpu.state import TornStateError, VgpuState, VgpuStateError, format_state, parse_state

STATE_FILE_MODE = 0o666  # workloads of every user edit it (test cluster and demo only)


def boottime_offset_ticks(proc_root: str | Path = "/proc") -> int:
    """This process's time namespace's boottime offset in clock ticks (``/proc/self/timens_offsets``), 0 outside
    one. The kernel shows a process's start time (``/proc/<pid>/stat`` field 22) shifted by the *reader's*
    offset: the test cluster's resumed nodes run slurmd, and so their jobs, in a time namespace booted at the
    resume (docker-slurm/power-resume.sh), where the agent outside would never match what a job read inside."""
    try:
        text = Path(proc_root, "self", "timens_offsets").read_text()
    except OSError:
        return 0
    hz = os.sysconf("SC_CLK_TCK")
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("boottime", "7"):  # 7: CLOCK_BOOTTIME's id
            try:
                return int(parts[1]) * hz + int(parts[2]) * hz // 1_000_000_000
            except ValueError:
                return 0
    return 0


def host_starttime(pid: int, proc_root: str | Path = "/proc") -> int:
    """:func:`process_starttime` as a reader outside any time namespace sees it (the agent, the virtual NVML
    library): what a workload records for itself. 0 if gone."""
    start = process_starttime(pid, proc_root)
    return start - boottime_offset_ticks(proc_root) if start else 0


def process_starttime(pid: int, proc_root: str | Path = "/proc") -> int:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot): tells a pid's reuse apart. 0 if gone."""
    try:
        raw = Path(proc_root, str(pid), "stat").read_bytes()
    except OSError:
        return 0
    # comm (field 2) may hold blanks and parentheses: the fields restart after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # fields[0] is field 3 (state), so field 22 is fields[19]
    except (IndexError, ValueError):
        return 0


class StateFile:
    """One node's state file. Every method is safe against concurrent writers (workloads) and the C reader."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lock_path = Path(f"{self.path}.lock")

    @contextlib.contextmanager
    def _locked(self, op: int) -> Iterator[None]:
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, STATE_FILE_MODE)
        except PermissionError:
            fd = os.open(self.lock_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with contextlib.suppress(PermissionError):
                if os.fstat(fd).st_uid == os.geteuid():
                    os.fchmod(fd, STATE_FILE_MODE)
            fcntl.flock(fd, op)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def read(self) -> VgpuState:
        """The current state. Raises FileNotFoundError if there is none, VgpuStateError if it is bad."""
        for _ in range(100):
            with self._locked(fcntl.LOCK_SH):
                text = self.path.read_text(encoding="utf-8")
            try:
                return parse_state(text)
            except TornStateError:
                time.sleep(0.005)  # a writer that holds no lock (older tool) is mid-way: read again
        raise VgpuStateError(f"{self.path}: state stays incomplete (no 'end' record)")

    def write(self, state: VgpuState) -> None:
        """Replaces the state (creating the file if needed)."""
        with self._locked(fcntl.LOCK_EX):
            self._store(format_state(state))

    def update(self, edit: Callable[[VgpuState], VgpuState]) -> VgpuState:
        """Read-modify-write under the exclusive lock; returns the new state."""
        with self._locked(fcntl.LOCK_EX):
            new = edit(parse_state(self.path.read_text(encoding="utf-8")))
            self._store(format_state(new))
            return new

    def _store(self, text: str) -> None:
        data = text.encode("utf-8")
        try:
            mode = self.path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = STATE_FILE_MODE
        tmp = self.path.with_name(f".{self.path.name}.tmp.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.rename(tmp, self.path)
            return
        except OSError as exc:
            os.unlink(tmp)
            if exc.errno not in (errno.EPERM, errno.EACCES):
                raise
        # Sticky directory and someone else's file: rewrite it in place (readers hold the shared lock).
        fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, data)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
