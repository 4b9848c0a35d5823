"""Reading the throughput jobs publish (slurm_elastic/goodput.py, docs/goodput.md) for the goodput rules.

For each elastic unit whose settings use it (``goodput``, ``restart_cost_aware`` or ``speedup_growth``), the
controller (root, on the head node, shared filesystem) reads ``<WorkDir>/.slurm-elastic/goodput-<unit id>.jsonl``
from Slurm's job record:

- **Safely.** The directory is opened with O_NOFOLLOW|O_DIRECTORY, the file (relative to it) with
  O_NOFOLLOW|O_NONBLOCK after an lstat; it must be a regular file owned by the job's user (uid from the user
  name, and Slurm's uid when it gives one), and the same inode before and after opening. Anything else is
  refused, logged once, and treated as "publishes nothing".
- **Cheaply.** Per file, (device, inode, size, mtime) is remembered: an unchanged file is not read again, an
  appended one is read from where the last read stopped, at most the last 64 KiB at a time (a new, replaced or
  truncated file: its last 64 KiB). Only complete lines count; at most ``MAX_REPORTS`` reports are kept.
- **Leniently.** A line that is not a JSON object with a finite positive ``samples_per_s`` (or
  ``steps_per_s`` x ``global_batch``), a finite ``time``, and an optional integer ``nodes`` >= 1 is skipped and
  counted; so is a time more than ``FUTURE_SLACK_S`` in the future.

**Attribution.** A report's size is its ``nodes`` when given, else the unit's size at its time, walked back
from the current size through the journal's applied resizes (a grow takes effect when its extension job
started, when known, else when it was submitted; a shrink when its nodes were released). A report taken during
a resize (from its intent: the grace signal, the submission) or less than ``settle_s`` after the size changed
is not attributed at all (the job is restarting; its rate is not the new size's), nor is one older than a step
of the walk that does not add up (a node lost without a journal entry). The most recent ``per_size`` reports of
each size go to the policy as :class:`ThroughputSample` values.

**Restart time.** After a resize that changed the size at T, the first report at the new size at T' gives
T' - T: an upper bound on the restart (it also holds up to one reporting interval). Only resizes of a job that
was publishing before them count. The median of those observed goes to the policy as ``restart_s``.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import pwd
import stat
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from slurm_elastic.goodput import DIR_NAME
from slurm_elastic.policy import ElasticUnit, JobUtilization, ThroughputSample
from slurm_elastic.policy.config import UnitSettings
from slurm_elastic.policy.inputs import uses_goodput
from slurm_elastic.store.protocols import ActuatorStore
from slurm_elastic.store.records import ActionKind, ActionRecord, ActionState, ExtensionRecord

log = logging.getLogger(__name__)

MAX_READ = 64 * 1024
MAX_REPORTS = 4096
PER_SIZE = 30
SETTLE_S = 10.0
FUTURE_SLACK_S = 5.0
MAX_RESTART_S = 3600.0
_FORGET_AFTER_S = 3600.0


@dataclass(frozen=True)
class Report:
    """One parsed line: unix time, throughput in samples/s, and the size the job said it ran at."""

    at: float
    value: float
    nodes: int | None = None


def parse_line(line: bytes) -> Report | None:
    """One JSON line, or None when it is not a valid report."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    at = _number(obj.get("time"))
    if at is None or at <= 0:
        return None
    if "samples_per_s" in obj:
        value = _number(obj["samples_per_s"])
    else:
        steps, batch = _number(obj.get("steps_per_s")), _number(obj.get("global_batch"))
        value = steps * batch if steps is not None and batch is not None else None
    if value is None or not math.isfinite(value) or value <= 0:
        return None
    nodes = obj.get("nodes")
    if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1):
        return None
    return Report(at=at, value=value, nodes=nodes)


def _number(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def parse_lines(data: bytes, *, now: float) -> tuple[list[Report], int]:
    """The reports in ``data`` (complete lines), and how many non-empty lines were skipped."""
    reports: list[Report] = []
    bad = 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        r = parse_line(raw)
        if r is None or r.at > now + FUTURE_SLACK_S:
            bad += 1
        else:
            reports.append(r)
    return reports, bad


class Refused(Exception):
    """The file exists but is not one the controller reads (owner, type, symlink)."""


@dataclass
class FileState:
    ident: tuple[int, int]  # (device, inode)
    size: int
    mtime_ns: int
    offset: int  # bytes consumed: the end of the last complete line read
    reports: deque[Any] = field(default_factory=lambda: deque(maxlen=MAX_REPORTS))  # Report, or the parser's
    bad_lines: int = 0


def _refuse_unless_ours(st: os.stat_result, uid: int) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise Refused("a symlink")
    if not stat.S_ISREG(st.st_mode):
        raise Refused("not a regular file")
    if st.st_uid != uid:
        raise Refused(f"owned by uid {st.st_uid}, not the job's user ({uid})")


def read_file(path: str, uid: int, state: FileState | None, *, now: float,
              max_read: int = MAX_READ, parse: Callable[..., tuple[list[Any], int]] | None = None,
              ) -> FileState | None:
    """Bring ``state`` up to date with the file at ``path``; None when there is no file. ``parse`` turns complete
    lines into reports (default :func:`parse_lines`; the serving reader passes its own).

    Raises :class:`Refused` for a file the controller must not read, OSError for other failures.
    """
    dirname, name = os.path.split(path)
    try:
        dfd = os.open(dirname, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # the directory is a symlink or not a directory
            raise Refused(f"{dirname} is not a plain directory") from e
        raise
    try:
        try:
            lst = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        _refuse_unless_ours(lst, uid)
        ident = (lst.st_dev, lst.st_ino)
        if state is not None and state.ident == ident and state.size == lst.st_size \
                and state.mtime_ns == lst.st_mtime_ns:
            return state  # unchanged: not read again
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dfd)
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        _refuse_unless_ours(st, uid)
        if (st.st_dev, st.st_ino) != ident:
            raise Refused("replaced while opening")
        if state is None or state.ident != ident or st.st_size < state.offset:
            state = FileState(ident=ident, size=0, mtime_ns=0, offset=0)
        start = state.offset
        if st.st_size - start > max_read:
            start = st.st_size - max_read
        # One byte before ``start`` tells whether it is a line start (else the first, partial line is dropped).
        lead = 1 if start > state.offset else 0
        data = _pread_all(fd, st.st_size - start + lead, start - lead)
    finally:
        os.close(fd)
    if lead:
        cut = data.find(b"\n")
        data = data[cut + 1:] if cut >= 0 else b""
        start = st.st_size - len(data)
    end = data.rfind(b"\n")
    complete = data[:end + 1] if end >= 0 else b""
    reports, bad = (parse or parse_lines)(complete, now=now)
    state.reports.extend(reports)
    state.bad_lines += bad
    state.offset = start + len(complete)
    state.size, state.mtime_ns = st.st_size, st.st_mtime_ns
    return state


def read_job_file(unit: ElasticUnit, path: str, state: FileState | None, *, now: float,
                  max_read: int = MAX_READ, parse: Callable[..., tuple[list[Any], int]] | None = None,
                  ) -> FileState | None:
    """:func:`read_file` for a file ``unit``'s job published: it must be its user's, and Slurm's uid must be that
    user's. Raises :class:`Refused` with the reason: an unknown user, a file it must not read, or one it cannot."""
    try:
        uid = pwd.getpwnam(unit.job.user).pw_uid
    except KeyError:
        raise Refused(f"unknown user {unit.job.user}") from None
    if unit.job.uid is not None and unit.job.uid != uid:
        raise Refused(f"Slurm says uid {unit.job.uid} but {unit.job.user} is uid {uid}")
    try:
        return read_file(path, uid, state, now=now, max_read=max_read, parse=parse)
    except OSError as e:  # read_file's Refused is no OSError: it passes through as it is
        raise Refused(f"cannot read: {e}") from e


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    chunks: list[bytes] = []
    while length > 0:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            break
        chunks.append(chunk)
        length -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


@dataclass(frozen=True)
class Resize:
    """One journaled resize as attribution sees it (unix times).

    ``started``: the intent (grace signal or submission): the job may be disturbed from then on.
    ``effective``: when the size changed (None: it did not, or not yet). ``ended``: when the disturbance
    ended (the size changed, or the action failed); None while the action is open or its extension pending.
    """

    started: float
    effective: float | None
    ended: float | None
    from_nodes: int
    to_nodes: int


def resizes(actions: Iterable[ActionRecord], extensions: Iterable[ExtensionRecord],
            ext_start: Mapping[int, float | None]) -> list[Resize]:
    """The unit's resizes from its journal actions. ``ext_start``: extension job id -> start time for the
    unit's live extension jobs (None while pending)."""
    ext_of_action = {e.action_id: e for e in extensions if e.action_id is not None}
    out: list[Resize] = []
    for a in actions:
        if "from" not in a.params or "to" not in a.params:
            continue
        started = a.created_at.timestamp()
        frm, to = int(a.params["from"]), int(a.params["to"])
        finished = a.finished_at.timestamp() if a.finished_at is not None else None
        if a.state != ActionState.APPLIED or finished is None:
            open_ = a.state in (ActionState.INTENT, ActionState.IN_PROGRESS)
            out.append(Resize(started, None, None if open_ else finished, frm, to))
            continue
        effective: float | None = finished
        if a.kind == ActionKind.GROW:
            ext = ext_of_action.get(a.id)
            if ext is not None and ext.job_id in ext_start:
                effective = ext_start[ext.job_id]  # None: still pending, the size has not changed yet
                if effective is not None:
                    effective = max(effective, finished)
        out.append(Resize(started, effective, effective, frm, to))
    return out


def attribute(reports: Sequence[Report], history: Sequence[Resize], current: int, *,
              settle_s: float = SETTLE_S) -> list[tuple[Report, int]]:
    """Each report that can be attributed, with its size (see the module docstring), newest first."""
    changes = sorted((r for r in history if r.effective is not None), key=lambda r: r.effective or 0.0,
                     reverse=True)
    out: list[tuple[Report, int]] = []
    size: int | None = current
    i = 0
    for rep in sorted(reports, key=lambda r: r.at, reverse=True):
        while i < len(changes) and (changes[i].effective or 0.0) > rep.at:
            ch = changes[i]
            size = ch.from_nodes if size is not None and size == ch.to_nodes else None
            i += 1
        if any(r.started <= rep.at and (r.ended is None or rep.at <= r.ended + settle_s) for r in history):
            continue
        nodes = rep.nodes if rep.nodes is not None else size
        if nodes is not None:
            out.append((rep, nodes))
    return out


def restart_times(reports: Sequence[Report], history: Sequence[Resize]) -> list[float]:
    """T' - T for each resize that changed the size at T, T' the first report at the new size after it."""
    ordered = sorted(reports, key=lambda r: r.at)
    if not ordered:
        return []
    starts = sorted(r.started for r in history)
    out: list[float] = []
    for ch in history:
        if ch.effective is None or ch.from_nodes == ch.to_nodes:
            continue
        if ordered[0].at >= ch.started:
            continue  # not publishing before the resize: the first report measures nothing
        nxt = min((s for s in starts if s > ch.effective), default=math.inf)
        first = next((rep for rep in ordered if ch.effective < rep.at < nxt
                      and (rep.nodes is None or rep.nodes == ch.to_nodes)), None)
        if first is not None and first.at - ch.effective <= MAX_RESTART_S:
            out.append(first.at - ch.effective)
    return out


def throughput_samples(attributed: Iterable[tuple[Report, int]], *, per_size: int = PER_SIZE
                       ) -> tuple[ThroughputSample, ...]:
    """The most recent ``per_size`` reports of each size (``attributed`` newest first), oldest first."""
    kept: dict[int, int] = {}
    out: list[ThroughputSample] = []
    for rep, nodes in attributed:
        if kept.get(nodes, 0) >= per_size:
            continue
        kept[nodes] = kept.get(nodes, 0) + 1
        out.append(ThroughputSample(at=datetime.fromtimestamp(rep.at, tz=UTC), nodes=nodes, value=rep.value))
    return tuple(sorted(out, key=lambda s: (s.at, s.nodes)))


@dataclass(frozen=True)
class UnitGoodput:
    """What the reader found for one unit in the last cycle (for logs, tests and explain)."""

    path: str
    reports: int = 0
    bad_lines: int = 0
    refused: str | None = None
    samples: tuple[ThroughputSample, ...] = ()
    restarts: tuple[float, ...] = ()
    restart_s: float | None = None


class JournalView(Protocol):
    """What the reader needs from the store: a unit's journal actions and extension job records."""

    def actions(self, job_id: int) -> list[ActionRecord]: ...

    def extensions(self, job_id: int) -> list[ExtensionRecord]: ...


@dataclass(frozen=True)
class StoreJournal:
    store: ActuatorStore

    def actions(self, job_id: int) -> list[ActionRecord]:
        return list(self.store.journal.list_actions(job_id=job_id))

    def extensions(self, job_id: int) -> list[ExtensionRecord]:
        return list(self.store.jobs.extensions(job_id, active_only=False))


@dataclass
class GoodputReader:
    journal: JournalView
    settle_s: float = SETTLE_S
    per_size: int = PER_SIZE
    max_read: int = MAX_READ
    files: dict[str, FileState] = field(default_factory=dict)
    last: dict[int, UnitGoodput] = field(default_factory=dict)
    _seen: dict[str, float] = field(default_factory=dict)
    _forgot_at: float = 0.0
    _results: dict[str, tuple[object, UnitGoodput]] = field(default_factory=dict)
    _logged: set[tuple[str, str]] = field(default_factory=set)

    def attach(self, unit: ElasticUnit, util: JobUtilization, settings: UnitSettings,
               now: datetime) -> JobUtilization:
        """``util`` with the unit's throughput samples and observed restart time, when its settings use them."""
        if not uses_goodput(settings):
            return util
        found = self.read_unit(unit, now)
        if found is None or (not found.samples and found.restart_s is None):
            return util
        return replace(util, throughput=found.samples, restart_s=found.restart_s)

    def path_for(self, unit: ElasticUnit) -> str | None:
        work_dir = unit.job.working_dir
        if not work_dir or not os.path.isabs(work_dir):
            return None
        return os.path.join(work_dir, DIR_NAME, f"goodput-{unit.unit_id}.jsonl")

    def read_unit(self, unit: ElasticUnit, now: datetime) -> UnitGoodput | None:
        path = self.path_for(unit)
        if path is None:
            return None
        now_s = now.timestamp()
        self._forget(now_s)
        self._seen[path] = now_s
        prev = self.files.get(path)
        prev_bad = prev.bad_lines if prev is not None else 0
        try:
            state = read_job_file(unit, path, prev, now=now_s, max_read=self.max_read)
        except Refused as e:
            return self._refused(unit, path, str(e))
        if state is None:
            self.files.pop(path, None)
            self._results.pop(path, None)
            self.last.pop(unit.unit_id, None)
            return None
        if state.bad_lines > prev_bad or (state is not prev and state.bad_lines):
            log.info("job %s: %d bad line(s) in %s skipped so far", unit.job.display_id, state.bad_lines, path)
        self.files[path] = state
        reports = list(state.reports)
        ext_start = {e.job_id: (e.start_time.timestamp() if e.start_time is not None else None)
                     for e in unit.extensions if e.is_running or e.is_pending}
        history = resizes(self.journal.actions(unit.unit_id), self.journal.extensions(unit.unit_id), ext_start)
        key = (state.ident, state.size, state.mtime_ns, tuple(history), unit.current_nodes)
        cached = self._results.get(path)
        if cached is not None and cached[0] == key:  # same file, same resizes: same answer
            self.last[unit.unit_id] = cached[1]
            return cached[1]
        samples = throughput_samples(attribute(reports, history, unit.current_nodes, settle_s=self.settle_s),
                                     per_size=self.per_size)
        restarts = tuple(restart_times(reports, history))
        found = UnitGoodput(path=path, reports=len(reports), bad_lines=state.bad_lines, samples=samples,
                            restarts=restarts, restart_s=statistics.median(restarts) if restarts else None)
        self.last[unit.unit_id] = found
        self._results[path] = (key, found)
        return found

    def _refused(self, unit: ElasticUnit, path: str, why: str) -> UnitGoodput:
        if (path, why) not in self._logged:
            self._logged.add((path, why))
            log.warning("job %s: not reading its goodput file %s: %s", unit.job.display_id, path, why)
        self.files.pop(path, None)
        self._results.pop(path, None)
        found = UnitGoodput(path=path, refused=why)
        self.last[unit.unit_id] = found
        return found

    def _forget(self, now_s: float) -> None:
        """Drop the state of files no unit asked for in the last hour (jobs that ended)."""
        if now_s - self._forgot_at < 60.0:
            return
        self._forgot_at = now_s
        old = {p for p, t in self._seen.items() if now_s - t > _FORGET_AFTER_S}
        for p in old:
            self._seen.pop(p, None)
            self.files.pop(p, None)
            self._results.pop(p, None)
        self._logged = {(p, why) for p, why in self._logged if p not in old}
        for unit_id in [u for u, found in self.last.items() if found.path in old]:
            self.last.pop(unit_id, None)
