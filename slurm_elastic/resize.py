"""Resize notices for training processes: learn that the job is about to change size, checkpoint, acknowledge.

Standard library only and free of side effects on import, like :mod:`slurm_elastic.goodput`. The contract
(sbatch_templates/README.md):

* Before every resize (a shrink's grace period, and before an extension job's workers join), the controller
  writes a **notice** ``<working dir>/.slurm-elastic/resize-<leader id>.json`` (``SLURM_ELASTIC_RESIZE_FILE``
  overrides the path): ``{"id", "kind": "grow"|"shrink", "time", "deadline", "hold_until", "from", "to"}``,
  times in Unix seconds; a shrink's also ``"release"``: the nodes it takes away (Slurm kills the job's tasks
  there, which the templates do not count as a failure: :mod:`slurm_elastic.taskexit`). It also sends the
  job's grace signal, which the templates' launcher forwards to the workers.
* A worker that sees :func:`resize_pending` saves a checkpoint, then rank 0 calls :func:`acknowledge`, which
  writes ``resize-<leader id>.ack`` (``{"id", "time"[, "step"]}``). The controller takes the nodes as soon as it
  sees the acknowledgement (at the deadline at the latest); an extension job starts its workers once it is
  there. The time from notice to acknowledgement is journaled.
* After acknowledging, the workers :func:`hold` (take no training step) until the resize restarts them (a
  peer's node is taken: the hold's heartbeat collective fails; or a new node joins the rendezvous), the
  notice is withdrawn (the controller called the resize off), or ``hold_until`` passes; so no step is taken
  that the resumed run would repeat.

A notice that has been acknowledged is no longer pending: workers restarted after the resize resume from the
checkpoint and train on. I/O errors never raise (a notice must not kill training).
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from slurm_elastic.goodput import DIR_NAME

ENV_FILE = "SLURM_ELASTIC_RESIZE_FILE"
KINDS = ("grow", "shrink")
HOLD_SLACK_S = 60.0  # how long past the deadline acknowledged workers hold at most, when nothing restarts them


@dataclass(frozen=True)
class Notice:
    id: str
    kind: str  # "grow" | "shrink"
    time: float  # when it was written
    deadline: float  # the resize happens at the latest then (earlier once acknowledged)
    hold_until: float  # acknowledged workers train on after this if nothing restarted them
    from_nodes: int = 0
    to_nodes: int = 0
    release: tuple[str, ...] = ()  # a shrink's nodes that go (the job's tasks there are killed, not failed)

    def render(self) -> str:
        d = asdict(self)
        d["from"], d["to"] = d.pop("from_nodes"), d.pop("to_nodes")
        if not self.release:
            del d["release"]
        else:
            d["release"] = list(self.release)
        return json.dumps(d, separators=(",", ":")) + "\n"

    def releases(self, node: str | None) -> bool:
        """True when this is a shrink that takes ``node`` away."""
        return self.kind == "shrink" and bool(node) and node in self.release


@dataclass(frozen=True)
class Ack:
    id: str
    time: float
    step: int | None = None


def notice_path(work_dir: str, job_id: int | str) -> str:
    """Where the controller writes the notice of job ``job_id`` (the leader's id)."""
    return os.path.join(work_dir, DIR_NAME, f"resize-{job_id}.json")


def ack_path(notice_file: str) -> str:
    """The acknowledgement file next to a notice file."""
    base = notice_file[:-5] if notice_file.endswith(".json") else notice_file
    return base + ".ack"


def default_path() -> str | None:
    """``SLURM_ELASTIC_RESIZE_FILE``, else the documented path under the current directory; None outside Slurm."""
    override = os.environ.get(ENV_FILE)
    if override:
        return override
    job_id = os.environ.get("SLURM_ELASTIC_PARENT") or os.environ.get("SLURM_JOB_ID")
    return notice_path(os.getcwd(), job_id) if job_id else None


def make_notice(kind: str, grace_s: float, *, now: float | None = None, from_nodes: int = 0, to_nodes: int = 0,
                notice_id: str | None = None, hold_slack_s: float = HOLD_SLACK_S,
                release: tuple[str, ...] = ()) -> Notice:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if not math.isfinite(grace_s) or grace_s < 0:
        raise ValueError("grace_s must be finite and >= 0")
    t = time.time() if now is None else now
    return Notice(id=notice_id or uuid.uuid4().hex, kind=kind, time=round(t, 3), deadline=round(t + grace_s, 3),
                  hold_until=round(t + grace_s + hold_slack_s, 3), from_nodes=from_nodes, to_nodes=to_nodes,
                  release=tuple(release))


def _number(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def parse_notice(text: str) -> Notice | None:
    """A notice from its JSON text; None for anything malformed."""
    try:
        d = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(d, dict) or not isinstance(d.get("id"), str) or not d["id"] or d.get("kind") not in KINDS:
        return None
    t, deadline, hold = (_number(d.get(k)) for k in ("time", "deadline", "hold_until"))
    if t is None or deadline is None:
        return None
    sizes = [d.get(k) for k in ("from", "to")]
    from_nodes, to_nodes = (int(s) if isinstance(s, int) and not isinstance(s, bool) else 0 for s in sizes)
    nodes = d.get("release")
    release = tuple(n for n in nodes if isinstance(n, str) and n) if isinstance(nodes, list) else ()
    return Notice(id=d["id"], kind=d["kind"], time=t, deadline=deadline,
                  hold_until=hold if hold is not None else deadline + HOLD_SLACK_S,
                  from_nodes=from_nodes, to_nodes=to_nodes, release=release)


def parse_ack(text: str) -> Ack | None:
    try:
        d = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(d, dict) or not isinstance(d.get("id"), str) or (t := _number(d.get("time"))) is None:
        return None
    step = d.get("step")
    return Ack(id=d["id"], time=t, step=step if isinstance(step, int) and not isinstance(step, bool) else None)


def _read(path: str | None) -> str | None:
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 64 * 1024).decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_notice(path: str | None = None) -> Notice | None:
    """The notice currently written (acknowledged or not); None when there is none."""
    text = _read(path or default_path())
    return parse_notice(text) if text is not None else None


def read_ack(path: str | None = None) -> Ack | None:
    """The last acknowledgement written next to the notice at ``path``."""
    target = path or default_path()
    text = _read(ack_path(target)) if target else None
    return parse_ack(text) if text is not None else None


def notice(path: str | None = None, *, now: float | None = None) -> Notice | None:
    """The notice that asks this job to checkpoint: written, not yet acknowledged, and not expired."""
    n = read_notice(path)
    if n is None:
        return None
    t = time.time() if now is None else now
    if t > n.hold_until:
        return None
    ack = read_ack(path)
    return None if ack is not None and ack.id == n.id else n


def resize_pending(path: str | None = None) -> bool:
    """True when a resize is coming and has not been acknowledged: checkpoint, then :func:`acknowledge`."""
    return notice(path) is not None


def deadline(path: str | None = None) -> float | None:
    """Unix time by which the pending resize happens at the latest; None when none is pending."""
    n = notice(path)
    return n.deadline if n else None


def write_atomic(path: str, text: str) -> bool:
    """Write ``text`` to ``path`` through a temporary file and a rename (never through a link); False on an OS
    error, with nothing left behind."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
    return True


def acknowledge(step: int | None = None, *, path: str | None = None, now: float | None = None) -> bool:
    """Say that the checkpoint for the current notice is saved (call it from one process, e.g. rank 0, after
    the checkpoint is on disk). Returns False when there is no notice or the write failed."""
    target = path or default_path()
    n = read_notice(target)
    if target is None or n is None:
        return False
    record: dict[str, object] = {"id": n.id, "time": round(time.time() if now is None else now, 3)}
    if step is not None:
        record["step"] = int(step)
    return write_atomic(ack_path(target), json.dumps(record, separators=(",", ":")) + "\n")


def post(n: Notice, path: str | None = None) -> bool:
    """Write a notice (the controller writes its own safely as root; an extension job uses this one)."""
    target = path or default_path()
    return bool(target) and write_atomic(str(target), n.render())


def held(acked: str, path: str | None = None, *, now: float | None = None) -> bool:
    """True while the acknowledged notice ``acked`` is still the one written and its hold has not expired."""
    n = read_notice(path)
    t = time.time() if now is None else now
    return n is not None and n.id == acked and t <= n.hold_until


def hold(acked: str, *, path: str | None = None, agree: Callable[[bool], bool] | None = None,
         poll_s: float = 0.25) -> None:
    """Take no training step until the resize restarts this process, the notice is withdrawn or replaced, or
    its hold expires.

    ``agree(done)`` makes all ranks leave together: it gets this rank's view and returns the group's (e.g. an
    all-reduce MAX of a one-element tensor). It is also a heartbeat: when a peer's node is taken away, the
    collective fails and the launcher restarts the group at its new size."""
    while True:
        done = not held(acked, path)
        if agree is not None:
            done = agree(done)
        if done:
            return
        time.sleep(poll_s)


def wait_acknowledged(n: Notice, path: str | None = None, *, poll_s: float = 0.2) -> Ack | None:
    """Wait until notice ``n`` is acknowledged (or replaced, or its deadline passes); the acknowledgement or None."""
    while True:
        ack = read_ack(path)
        if ack is not None and ack.id == n.id:
            return ack
        current = read_notice(path)
        if current is None or current.id != n.id or time.time() >= n.deadline:
            return None
        time.sleep(poll_s)


def gate_join(grace_s: float, path: str | None = None, *, margin_s: float = 20.0,
              log: Callable[[str], None] | None = None, fresh: bool = False,
              notice_id: str | None = None) -> Ack | None:
    """In an extension job, before its workers join: make sure the running workers have checkpointed.

    The controller posted a grow notice when it submitted this job. When it is missing, or so old that the
    running workers will stop holding within ``margin_s`` (the job waited in the queue), a fresh one is posted
    with ``grace_s`` (always, with ``fresh``: after a prewarm the controller posted none). Then wait for its
    acknowledgement, at most until its deadline."""
    target = path or default_path()
    if target is None:
        return None
    n = read_notice(target)
    if fresh or n is None or n.kind != "grow" or time.time() > n.hold_until - margin_s:
        job = os.environ.get("SLURM_JOB_ID", "x")
        n = make_notice("grow", grace_s, notice_id=notice_id or f"ext:{job}:{uuid.uuid4().hex[:8]}")
        if not post(n, target):
            return None
    got = wait_acknowledged(n, target)
    if log is not None:
        what = f"acknowledged after {got.time - n.time:.1f}s" if got else "not acknowledged by its deadline"
        log(f"resize notice {n.id}: {what}")
    return got


def follow_join(notice_id: str, grace_s: float, path: str | None = None, *, poll_s: float = 0.2) -> Ack | None:
    """Another node of the same extension job: wait until the notice ``notice_id`` (posted by the job's first
    node with :func:`gate_join`) is there, then for its acknowledgement; at most ``grace_s`` for each."""
    target = path or default_path()
    if target is None:
        return None
    until = time.time() + grace_s
    while (n := read_notice(target)) is None or n.id != notice_id:
        if time.time() >= until:
            return None
        time.sleep(poll_s)
    return wait_acknowledged(n, target, poll_s=poll_s)
