"""How each task of an elastic job ended, and the job's exit status from that: a task killed because a shrink
released its node is no failure.

A shrink that releases one of the job's own nodes makes Slurm kill the job's task there at once (SIGKILL, no
signal before it; measured on 22.05: ``srun: error: n2: task 1: Killed``), and srun, which waits for every task,
exits 137 however the others ended. A batch script that passed that on ended FAILED in sacct after training to
its last step. So each node's launcher (:mod:`slurm_elastic.launch`) records its task in
``SLURM_ELASTIC_TASKS_DIR`` (the templates set it, one directory per job), one file ``<node>-<rank>.json``:

* ``{"node", "rank", "state": "running"}`` when it starts;
* ``"state": "released", "notice": ID`` while the resize notice written is a shrink that names its node (its
  ``release`` list: :mod:`slurm_elastic.resize`), and back to ``running`` when that notice is withdrawn;
* ``"state": "exited", "rc": N`` when its program ended, however.

The templates end with ``python3 -m slurm_elastic.launch outcome "$srun_status"``, whose exit status becomes the
job's: srun's, except 0 when srun failed only because tasks on released nodes were killed, i.e. every other task
exited 0 and at least one did (:func:`job_status`). A task that ended another way (a non-zero exit, or killed on
a node no shrink named) keeps srun's status. Standard library only; I/O errors never raise.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_elastic.resize import Notice, write_atomic

ENV_DIR = "SLURM_ELASTIC_TASKS_DIR"
STATES = ("running", "released", "exited")


@dataclass(frozen=True)
class TaskRecord:
    node: str
    rank: int
    state: str  # one of STATES
    rc: int | None = None  # "exited": the program's status (negative: killed by that signal)
    notice: str | None = None  # "released": the shrink notice that names the node

    def render(self) -> str:
        d: dict[str, object] = {"node": self.node, "rank": self.rank, "state": self.state}
        if self.rc is not None:
            d["rc"] = self.rc
        if self.notice is not None:
            d["notice"] = self.notice
        return json.dumps(d, separators=(",", ":")) + "\n"


def parse_record(text: str) -> TaskRecord | None:
    try:
        d = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(d, dict) or not isinstance(d.get("node"), str) or d.get("state") not in STATES:
        return None
    rank, rc, notice = d.get("rank"), d.get("rc"), d.get("notice")
    return TaskRecord(node=d["node"], rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else 0,
                      state=d["state"], rc=rc if isinstance(rc, int) and not isinstance(rc, bool) else None,
                      notice=notice if isinstance(notice, str) else None)


@dataclass(frozen=True)
class Recorder:
    """One task's record file; every write replaces it whole (rename), never raises."""

    directory: str
    node: str
    rank: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Recorder | None:
        directory = env.get(ENV_DIR)
        if not directory:
            return None
        return cls(directory, env.get("SLURMD_NODENAME") or "?", _int(env.get("SLURM_PROCID"), 0))

    @property
    def path(self) -> str:
        return os.path.join(self.directory, f"{self.node}-{self.rank}.json")

    def write(self, state: str, *, rc: int | None = None, notice: str | None = None) -> bool:
        return write_atomic(self.path, TaskRecord(self.node, self.rank, state, rc, notice).render())

    def follow(self, notice: Notice | None, released: str | None) -> str | None:
        """Mark the task released while ``notice`` (the one written now) is a shrink naming this node, and
        running again when it no longer is; ``released`` is the notice id marked so far. Returns the new one."""
        now = notice.id if notice is not None and notice.releases(self.node) else None
        if now != released:
            self.write("released" if now else "running", notice=now)
        return now


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def read_records(directory: str | None) -> list[TaskRecord]:
    """Every task's record in ``directory`` (unreadable or malformed files are left out), by node and rank."""
    if not directory:
        return []
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                rec = parse_record(f.read(64 * 1024))
        except OSError:
            continue
        if rec is not None:
            out.append(rec)
    return sorted(out, key=lambda r: (r.node, r.rank))


def _nodes(records: Sequence[TaskRecord]) -> str:
    return ",".join(dict.fromkeys(r.node for r in records))


def job_status(srun_status: int, records: Sequence[TaskRecord], notice: Notice | None = None) -> tuple[int, str]:
    """The job's exit status and why (empty when it is simply srun's 0).

    A task still ``running`` in its record was killed without its launcher seeing the end; it counts as released
    when the notice written now (``notice``) names its node (the launcher may not have polled it in time)."""
    if srun_status == 0:
        return 0, ""
    if not records:
        return srun_status, f"srun exited {srun_status}; no task records to tell why"
    released = [r for r in records if r.state == "released"
                or (r.state == "running" and notice is not None and notice.releases(r.node))]
    failed = [r for r in records if r.state == "exited" and r.rc != 0]
    lost = [r for r in records if r.state == "running" and r not in released]
    done = [r for r in records if r.state == "exited" and r.rc == 0]
    if failed:
        rcs = ", ".join(f"{r.node} exited {r.rc}" for r in failed)
        return srun_status, f"srun exited {srun_status}: failed task(s): {rcs}"
    if lost:
        return srun_status, f"srun exited {srun_status}: task(s) on {_nodes(lost)} ended without a record " \
                            "(killed, and no shrink released their node)"
    if not released or not done:
        return srun_status, f"srun exited {srun_status}: no task finished"
    notices = sorted({r.notice for r in released if r.notice} | ({notice.id} if notice is not None and any(
        r.notice is None for r in released) else set()))
    return 0, (f"srun exited {srun_status} only because Slurm killed the task(s) on {_nodes(released)} when the "
               f"shrink ({', '.join(notices)}) released that node; the other {len(done)} task(s) exited 0: "
               "the job succeeded")
