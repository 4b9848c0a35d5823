"""Pure parsers that tie processes and GPUs to Slurm jobs: /proc/<pid>/cgroup, /proc/<pid>/environ and the
prolog's per-GPU map files. No I/O here; :mod:`slurm_elastic.agent.procfs` reads the files.

cgroup layouts recognised (one regular expression each; fixtures of real lines in tests/fixtures/cgroup/):

- cgroup v1: ``<n>:<controller>:/slurm[_<node>]/uid_<uid>/job_<id>/step_<step>[/task_<t>]`` -- the ``_<node>``
  suffix appears with builds that allow several slurmd per host (Debian's).
- cgroup v2: ``0::/<slice>/[<node>_]slurmstepd.scope/job_<id>/step_<step>/user/task_<t>`` -- the node prefix
  likewise; the slice is system.slice unless CgroupSlice moves it.
- Slurm 26.05 cgroup v2 (default unless CgroupJobIdPaths=yes): the job directory is the bare SLUID, ``s`` and 13
  Crockford base32 characters, e.g. ``.../slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0``. A SLUID does not
  contain the job id: it is resolved through the environ or the map files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_elastic.agent.model import GpuAllocation

_STEP = r"(?:/step_(?P<step>[^/]+))?"
_CGROUP_V1 = re.compile(r"/slurm(?:_(?P<node>[^/]+))?/uid_(?P<uid>\d+)/job_(?P<job>\d+)" + _STEP + r"(?:/|$)")
_SLUID = r"[sS][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{13}"
_CGROUP_V2 = re.compile(
    r"/(?:(?P<node>[^/]+)_)?slurmstepd\.scope/(?:job_(?P<job>\d+)|(?P<sluid>" + _SLUID + r"))" + _STEP + r"(?:/|$)"
)


@dataclass(frozen=True)
class CgroupJob:
    job_id: int | None
    sluid: str | None
    step: str | None
    uid: int | None
    node: str | None
    cgroup_version: int


def parse_cgroup(text: str) -> CgroupJob | None:
    """The Slurm job in a /proc/<pid>/cgroup text, or None for a process outside any job."""
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        version = 2 if hierarchy == "0" and controllers == "" else 1
        m = _CGROUP_V2.search(path)
        if m:
            sluid = m.group("sluid")
            return CgroupJob(
                job_id=int(m.group("job")) if m.group("job") else None,
                sluid=sluid.upper() if sluid else None,
                step=m.group("step"),
                uid=None,
                node=m.group("node"),
                cgroup_version=version,
            )
        m = _CGROUP_V1.search(path)
        if m:
            return CgroupJob(int(m.group("job")), None, m.group("step"), int(m.group("uid")), m.group("node"), version)
    return None


@dataclass(frozen=True)
class EnvironJob:
    job_id: int
    step: str | None
    uid: int | None
    user: str | None
    account: str | None
    sluid: str | None


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def parse_environ(data: bytes) -> EnvironJob | None:
    """The Slurm job in a /proc/<pid>/environ (NUL-separated), or None when it has no SLURM_JOB_ID."""
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.startswith(b"SLURM_"):
            env[key.decode("ascii", "replace")] = value.decode("utf-8", "replace")
    job_id = _int_or_none(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))
    if job_id is None:
        return None
    return EnvironJob(
        job_id=job_id,
        step=env.get("SLURM_STEP_ID"),
        uid=_int_or_none(env.get("SLURM_JOB_UID")),
        user=env.get("SLURM_JOB_USER") or None,
        account=env.get("SLURM_JOB_ACCOUNT") or None,
        sluid=(env.get("SLURM_JOB_SLUID") or "").upper() or None,
    )


class MapFileError(ValueError):
    """A prolog map file does not hold ``jobid uid user account [sluid]``."""


def parse_gpu_map(gpu_index: int, text: str) -> GpuAllocation:
    """One map file's content: ``jobid uid user account [sluid]``; ``-`` stands for unknown."""
    fields = text.split()
    if not 4 <= len(fields) <= 5 or not fields[0].isdigit():
        raise MapFileError(f"expected 'jobid uid user account [sluid]', got {text.strip()!r}")

    def opt(i: int) -> str | None:
        return fields[i] if i < len(fields) and fields[i] != "-" else None

    uid = opt(1)
    sluid = opt(4)
    return GpuAllocation(
        gpu_index=gpu_index,
        job_id=int(fields[0]),
        uid=int(uid) if uid is not None and uid.isdigit() else None,
        user=opt(2),
        account=opt(3),
        sluid=sluid.upper() if sluid else None,
    )
