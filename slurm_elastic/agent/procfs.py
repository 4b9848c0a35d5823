"""Reads /proc and the prolog's map directory to tie pids and GPUs to jobs (the I/O around :mod:`.jobmap`).

Both roots are constructor arguments so tests point them at fixture trees. Nothing here raises for a process
that exits or a file that vanishes mid-scan: such a pid is simply not attributed this time.
"""

from __future__ import annotations

import pwd
from collections.abc import Callable, Iterable
from pathlib import Path

from slurm_elastic.agent.jobmap import MapFileError, parse_cgroup, parse_environ, parse_gpu_map
from slurm_elastic.agent.model import GpuAllocation, JobRef, SampleError


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def read_starttime(proc_root: Path, pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat, or None when the process is gone."""
    try:
        raw = (proc_root / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


class ProcJobResolver:
    """pid -> :class:`JobRef` from /proc/<pid>/cgroup, then SLURM_JOB_ID in /proc/<pid>/environ.

    Results are cached per (pid, start time): a pid's job never changes while the process lives, and a reused
    pid has another start time. The cache keeps only the pids of the latest call.
    """

    def __init__(self, proc_root: str | Path = "/proc", user_name: Callable[[int], str | None] = _user_name) -> None:
        self.proc_root = Path(proc_root)
        self._user_name = user_name
        self._cache: dict[tuple[int, int], JobRef | None] = {}

    def resolve(self, pids: Iterable[int]) -> dict[int, JobRef]:
        found: dict[int, JobRef] = {}
        cache: dict[tuple[int, int], JobRef | None] = {}
        for pid in set(pids):
            start = read_starttime(self.proc_root, pid)
            if start is None:
                continue  # exited since NVML listed it
            key = (pid, start)
            if key in self._cache:
                ref = self._cache[key]
            else:
                ref = self._lookup(pid)
                if read_starttime(self.proc_root, pid) != start:
                    continue  # exited (or was reused) while we read its files: they may be another's
            cache[key] = ref
            if ref is not None:
                found[pid] = ref
        self._cache = cache
        return found

    def _read(self, pid: int, name: str) -> bytes | None:
        try:
            return (self.proc_root / str(pid) / name).read_bytes()
        except OSError:  # gone, or not ours to read
            return None

    def _lookup(self, pid: int) -> JobRef | None:
        sluid = step = None
        raw = self._read(pid, "cgroup")
        cg = parse_cgroup(raw.decode("utf-8", "replace")) if raw is not None else None
        if cg is not None:
            if cg.job_id is not None:
                user = self._user_name(cg.uid) if cg.uid is not None else None
                return JobRef(cg.job_id, "cgroup", step=cg.step, uid=cg.uid, user=user)
            sluid, step = cg.sluid, cg.step
        raw = self._read(pid, "environ")
        env = parse_environ(raw) if raw is not None else None
        if env is not None:
            return JobRef(env.job_id, "environ", sluid=sluid or env.sluid, step=step or env.step, uid=env.uid,
                          user=env.user, account=env.account)
        if sluid is not None:
            return JobRef(None, "cgroup", sluid=sluid, step=step)  # the map files may resolve the SLUID
        return None


class GpuMapReader:
    """The prolog's map files: ``<map_dir>/<node>/<gpu index>`` holding ``jobid uid user account [sluid]``."""

    def __init__(self, map_dir: str | Path, node: str) -> None:
        self.dir = Path(map_dir) / node

    def read(self) -> tuple[dict[int, GpuAllocation], list[SampleError]]:
        allocations: dict[int, GpuAllocation] = {}
        errors: list[SampleError] = []
        try:
            entries = list(self.dir.iterdir())
        except FileNotFoundError:
            return allocations, errors  # no job has run here since boot
        except OSError as exc:
            return allocations, [SampleError("gpu_map_unreadable", f"{self.dir}: {exc}")]
        for path in entries:
            if not path.name.isdigit():
                continue  # the prolog's temporary files start with '.'
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except FileNotFoundError:
                continue  # the epilog removed it meanwhile
            except OSError as exc:
                errors.append(SampleError("gpu_map_unreadable", f"{path}: {exc}", path.name))
                continue
            try:
                allocations[int(path.name)] = parse_gpu_map(int(path.name), text)
            except MapFileError as exc:
                errors.append(SampleError("gpu_map_invalid", f"{path}: {exc}", path.name))
        return allocations, errors
