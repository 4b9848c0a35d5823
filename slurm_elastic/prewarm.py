"""Cold start in an extension job: run the job's ``#ELASTIC --prewarm`` command on each new node before it joins.

Standard library only (it runs in the job's Python, like :mod:`slurm_elastic.resize`). The controller passes the
command and its timeout to an extension job of a unit whose directives have ``--prewarm``
(``SLURM_ELASTIC_PREWARM``, ``SLURM_ELASTIC_PREWARM_TIMEOUT``); the launcher (slurm_elastic/launch.py), as each
node's task and so as the job's user, calls :func:`prewarm_and_wait` before its workers start:

1. ``launch``: the launcher runs on the node (the node is up, Slurm started the job);
2. the command runs as an argument list (directives/words.py splits it; never a shell), in its own process
   group, with the timeout: ``ready`` when it exits 0, else ``failed`` (exit status, not found, timed out:
   the group is killed) and the launcher ends without joining;
3. it waits until every node of the extension job is ``ready`` (within the same timeout): the leader is not
   told anything (no notice, no signal) until then;
4. after the running workers acknowledged the grow notice (resize.gate_join), ``joined``.

Each step is a line appended to ``<work dir>/.slurm-elastic/prewarm-<leader id>.jsonl``
(``SLURM_ELASTIC_PREWARM_FILE`` overrides it): ``{"job", "node", "event", "time"[, "rc", "error"]}``, which the
controller reads (controller/coldstart.py) to end a failed grow and to time each phase.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from slurm_elastic.directives.words import WordError, command_argv
from slurm_elastic.goodput import DIR_NAME, append_line, job_file

ENV_COMMAND = "SLURM_ELASTIC_PREWARM"
ENV_TIMEOUT = "SLURM_ELASTIC_PREWARM_TIMEOUT"
ENV_FILE = "SLURM_ELASTIC_PREWARM_FILE"
EVENTS = ("launch", "ready", "failed", "joined")
KILL_GRACE_S = 5.0
POLL_S = 0.25


def prewarm_path(work_dir: str, job_id: int | str) -> str:
    return os.path.join(work_dir, DIR_NAME, f"prewarm-{job_id}.jsonl")


def default_path() -> str | None:
    return job_file(ENV_FILE, prewarm_path)


@dataclass(frozen=True)
class Event:
    job: int  # the extension job
    node: str
    event: str
    time: float
    rc: int | None = None
    error: str | None = None


def parse_event(line: bytes) -> Event | None:
    """One line of the file; None for anything malformed."""
    try:
        d = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(d, dict):
        return None
    job, node, event, t = d.get("job"), d.get("node"), d.get("event"), d.get("time")
    if isinstance(job, bool) or not isinstance(job, int) or not isinstance(node, str) or event not in EVENTS:
        return None
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return None
    rc = d.get("rc")
    error = d.get("error")
    return Event(job=job, node=node[:64], event=event, time=float(t),
                 rc=rc if isinstance(rc, int) and not isinstance(rc, bool) else None,
                 error=error[:200] if isinstance(error, str) else None)


def record(path: str | None, event: str, *, job: int, node: str, rc: int | None = None,
           error: str | None = None, now: float | None = None) -> bool:
    d: dict[str, object] = {"job": job, "node": node, "event": event,
                            "time": round(time.time() if now is None else now, 3)}
    if rc is not None:
        d["rc"] = rc
    if error is not None:
        d["error"] = error[:200]
    return bool(path) and append_line(str(path), json.dumps(d, separators=(",", ":")) + "\n")


def run(argv: list[str], timeout_s: float) -> tuple[bool, int | None, str | None]:
    """Run the command without a shell; (ok, exit status, why it failed). On timeout its process group is
    terminated, then killed after KILL_GRACE_S."""
    try:
        proc = subprocess.Popen(argv, start_new_session=True)
    except OSError as e:
        return False, None, f"cannot start {argv[0]!r}: {e.strerror or e}"
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                pass
            try:
                proc.wait(timeout=KILL_GRACE_S)
                break
            except subprocess.TimeoutExpired:
                continue
        return False, None, f"timed out after {timeout_s:g}s"
    if rc != 0:
        return False, rc, f"exited with status {rc}"
    return True, 0, None


def read_events(path: str | None) -> list[Event]:
    if not path:
        return []
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    return [e for line in data.split(b"\n") if line.strip() and (e := parse_event(line)) is not None]


def peers_state(events: Iterable[Event], job: int, nodes: int) -> str:
    """``ready`` once ``nodes`` distinct nodes of extension ``job`` are ready, ``failed`` once one failed, else
    ``waiting``."""
    ready: set[str] = set()
    for e in events:
        if e.job != job:
            continue
        if e.event == "failed":
            return "failed"
        if e.event == "ready":
            ready.add(e.node)
    return "ready" if len(ready) >= nodes else "waiting"


def wait_peers(path: str | None, job: int, nodes: int, deadline: float) -> str:
    while True:
        state = peers_state(read_events(path), job, nodes)
        if state != "waiting":
            return state
        if time.time() >= deadline:
            return "timeout"
        time.sleep(POLL_S)


def prewarm_and_wait(env: dict[str, str] | os._Environ[str], *, path: str | None = None,
                     log: Callable[[str], None] | None = None) -> bool | None:
    """Run the prewarm on this node and wait for the job's other nodes; None when the job has no prewarm,
    True when every node is ready, False when this one failed or another one did (do not join)."""
    command = env.get(ENV_COMMAND)
    if not command:
        return None
    say = log or (lambda _: None)
    target = path or default_path()
    job = int(env.get("SLURM_JOB_ID", "0") or 0)
    node = env.get("SLURMD_NODENAME", "?")
    try:
        timeout_s = float(env.get(ENV_TIMEOUT, "600"))
    except ValueError:
        timeout_s = 600.0
    start = time.time()
    record(target, "launch", job=job, node=node, now=start)
    try:
        argv = command_argv(command)
    except WordError as e:
        argv, why = [], f"bad command: {e}"
    else:
        why = "empty command" if not argv else ""
    ok, rc = False, None
    if argv:
        ok, rc, err = run(argv, timeout_s)
        why = err or ""
    if not ok:
        record(target, "failed", job=job, node=node, rc=rc, error=why)
        say(f"prewarm {command!r} failed: {why}; not joining")
        return False
    record(target, "ready", job=job, node=node)
    say(f"prewarm done in {time.time() - start:.1f}s")
    nodes = int(env.get("SLURM_JOB_NUM_NODES", "1") or 1)
    state = wait_peers(target, job, nodes, start + timeout_s)
    if state != "ready":
        if state == "timeout":
            record(target, "failed", job=job, node=node, error=f"other nodes not ready after {timeout_s:g}s")
        say(f"prewarm: the job's other nodes are {state}; not joining")
        return False
    return True
