"""The launcher an elastic template runs as each node's task: it makes the resize notice reach the workers.

``scancel --signal=USR1 --full`` reaches only a step's task processes (proctrack/cgroup signals tasks, not their
children), so a torchrun agent, or any program started by a wrapper, never passes the grace signal on. This
launcher is the task and does:

* **Forward the grace signal** (``--signal``, default USR1) to its child processes: torchrun's workers, or the
  program given with ``--exec``; the launcher itself survives it.
* **Turn a resize notice into the same signal**: a new notice (slurm_elastic/resize.py) that the job has not
  acknowledged yet is forwarded as the signal too, so a program that only knows signals checkpoints before a
  grow as well.
* **Gate an extension's join** (``SLURM_ELASTIC_ROLE=extension``): before its workers start, wait until the
  running workers acknowledged their checkpoint (:func:`slurm_elastic.resize.gate_join`), at most
  ``SLURM_ELASTIC_NOTICE_GRACE`` seconds (the controller's ``[extension] notice_grace_s``).
* **Prewarm an extension's nodes** (``SLURM_ELASTIC_PREWARM``, from ``#ELASTIC --prewarm``): run the command
  on this node, wait until all the extension's nodes are ready (:mod:`slurm_elastic.prewarm`), and only then
  post the grow notice that asks the running workers to checkpoint; a failed or timed-out prewarm exits 3
  without joining (the controller ends that grow).
* **Pin the rendezvous store** (torchrun mode): only the agent on the leader's batch host
  (``SLURM_ELASTIC_RDZV_HOST_NODE``, set by the batch script) hosts the c10d store (``is_host=true``); every
  other agent is a client, even where all nodes share one hostname.
* **Leave the rendezvous on a shrink notice** (torchrun mode): on a node the notice releases, the agent leaves
  the c10d rendezvous at once (:mod:`slurm_elastic.torchrun_rdzv`), so the other agents re-form without waiting
  for its heartbeats to expire; each rendezvous round is logged with its time (the resize's phases).
* **Record how its task ended** (``SLURM_ELASTIC_TASKS_DIR``, set by the templates): running, released by a
  shrink notice that names this node, or exited with a status; ``outcome`` turns the records and srun's status
  into the job's exit status, so a task killed because a shrink released its node is no failure
  (:mod:`slurm_elastic.taskexit`).

Usage (one task per node): ``srun python3 -m slurm_elastic.launch torchrun <torchrun arguments>`` or
``srun python3 -m slurm_elastic.launch exec <program> [args]``; then, in the batch script,
``python3 -m slurm_elastic.launch outcome "$srun_status"`` as its last command.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

from slurm_elastic import prewarm, resize, taskexit, torchrun_rdzv

FAST_RESIZE_ENV = "SLURM_ELASTIC_FAST_RESIZE"  # "0": torch's own re-form (heartbeats, last call), for comparison
NOTICE_POLL_S = 0.2  # a resize's phases wait on it twice (the notice, its acknowledgement): keep it short


def child_pids(parent: int | None = None) -> list[int]:
    """Direct children of ``parent`` (this process by default), from /proc."""
    me = os.getpid() if parent is None else parent
    out: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode("utf-8", errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "(comm)": state, ppid, ...
        if len(fields) > 1 and fields[1] == str(me):
            out.append(int(name))
    return out


def forward(signum: int) -> list[int]:
    """Send ``signum`` to every child; returns the pids reached."""
    reached = []
    for pid in child_pids():
        try:
            os.kill(pid, signum)
            reached.append(pid)
        except OSError:
            pass
    return reached


def _log(text: str) -> None:
    print(f"slurm-elastic launch[{os.environ.get('SLURMD_NODENAME', '?')}]: {text}", file=sys.stderr, flush=True)


def install_forwarding(signum: int) -> None:
    def handler(sig: int, frame: object) -> None:
        _log(f"signal {signal.Signals(sig).name} forwarded to {len(forward(sig))} worker(s)")

    signal.signal(signum, handler)


def watch_notices(signum: int, path: str | None, stop: threading.Event,
                  follow: Callable[[resize.Notice | None], None] | None = None) -> threading.Thread:
    """Forward each new, unacknowledged notice as ``signum`` (once per notice id); ``follow`` sees the notice
    written (acknowledged or not) at every poll."""
    def run() -> None:
        seen: set[str] = set()
        first = resize.notice(path)
        if first is not None:  # already there when this launcher started: the workers read it themselves
            seen.add(first.id)
        while True:
            if follow is not None:
                follow(resize.read_notice(path))
            if stop.wait(NOTICE_POLL_S):
                return
            n = resize.notice(path)
            if n is not None and n.id not in seen:
                seen.add(n.id)
                _log(f"{n.kind} notice {n.id}: signal {signal.Signals(signum).name} to "
                     f"{len(forward(signum))} worker(s)")

    t = threading.Thread(target=run, name="resize-notices", daemon=True)
    t.start()
    return t


def rdzv_args(args: Sequence[str], env: dict[str, str] | os._Environ[str]) -> list[str]:
    """torchrun arguments with ``is_host`` added to ``--rdzv-conf``: true only on the leader's batch host."""
    host_node = env.get("SLURM_ELASTIC_RDZV_HOST_NODE")
    if not host_node:
        return list(args)
    is_host = env.get("SLURM_ELASTIC_ROLE", "leader") != "extension" and env.get("SLURMD_NODENAME") == host_node
    value = f"is_host={'true' if is_host else 'false'}"
    out, done = [], False
    for i, a in enumerate(args):
        if a.startswith("--rdzv-conf=") or a.startswith("--rdzv_conf="):
            out.append(f"{a},{value}" if a.split("=", 1)[1] else f"{a}{value}")
            done = True
        elif a in ("--rdzv-conf", "--rdzv_conf") and i + 1 < len(args):
            out.append(a)
        elif i > 0 and args[i - 1] in ("--rdzv-conf", "--rdzv_conf"):
            out.append(f"{a},{value}" if a else value)
            done = True
        else:
            out.append(a)
    return out if done else [f"--rdzv-conf={value}", *out]


PREWARM_FAILED_RC = 3


def gate() -> bool:
    """In an extension job: prewarm (when asked), then wait for the running workers' checkpoint. False: do not
    join (the prewarm failed here or on another node of the job)."""
    if os.environ.get("SLURM_ELASTIC_ROLE") != "extension":
        return True
    warmed = prewarm.prewarm_and_wait(os.environ, log=_log)
    if warmed is False:
        return False
    try:
        grace = float(os.environ.get("SLURM_ELASTIC_NOTICE_GRACE", "30"))
    except ValueError:
        grace = 30.0
    if not warmed:
        resize.gate_join(grace, log=_log)
        return True
    # After a prewarm the controller has posted nothing yet (the leader is not disturbed until the new nodes
    # are ready): the job's first node posts the notice now, fresh; its other nodes wait for the same one.
    job = os.environ.get("SLURM_JOB_ID", "0") or "0"
    notice_id = f"ext:{job}:prewarm"
    if os.environ.get("SLURM_NODEID", "0") == "0":
        resize.gate_join(grace, log=_log, fresh=True, notice_id=notice_id)
    else:
        resize.follow_join(notice_id, grace)
    prewarm.record(prewarm.default_path(), "joined", job=int(job), node=os.environ.get("SLURMD_NODENAME", "?"))
    return True


def notice_follower(rec: taskexit.Recorder | None) -> Callable[[resize.Notice | None], None] | None:
    """Keeps the task's record marked released while a shrink notice names its node."""
    if rec is None:
        return None
    marked: list[str | None] = [None]

    def follow(n: resize.Notice | None) -> None:
        marked[0] = rec.follow(n, marked[0])
    return follow


def rendezvous_leaver(node: str | None) -> Callable[[resize.Notice | None], None]:
    """Leaves the torchrun rendezvous once per shrink notice that releases ``node`` (this one), and has the
    agent re-form as soon as the notice is acknowledged (:mod:`slurm_elastic.torchrun_rdzv`)."""
    left: set[str] = set()

    def follow(n: resize.Notice | None) -> None:
        if n is not None and n.id not in left and n.releases(node):
            left.add(n.id)
            _log(f"shrink notice {n.id} releases this node: leaving the rendezvous")
            torchrun_rdzv.leave(_log)
        torchrun_rdzv.follow(n, node)  # after the acknowledgement: re-form at once at the notice's size
    return follow


def both(*follows: Callable[[resize.Notice | None], None] | None) -> Callable[[resize.Notice | None], None] | None:
    calls = [f for f in follows if f is not None]
    if not calls:
        return None

    def follow(n: resize.Notice | None) -> None:
        for f in calls:
            f(n)
    return follow


def outcome(args: Sequence[str]) -> int:
    """``outcome SRUN_STATUS``: the job's exit status (:func:`slurm_elastic.taskexit.job_status`), said on
    stderr when it is not simply srun's 0."""
    try:
        srun_status = int(args[0])
    except (IndexError, ValueError):
        print("usage: python -m slurm_elastic.launch outcome SRUN_STATUS", file=sys.stderr)
        return 2
    records = taskexit.read_records(os.environ.get(taskexit.ENV_DIR))
    status, why = taskexit.job_status(srun_status, records, resize.read_notice())
    if why:
        print(f"slurm-elastic: {why}; the job exits {status}", file=sys.stderr, flush=True)
    return status


def run_torchrun(rest: Sequence[str]) -> int:
    torchrun = importlib.import_module("torch.distributed.run")  # only in this mode: torch is the job's own
    sys.argv = ["torchrun", *rdzv_args(rest, os.environ)]
    torchrun_rdzv.capture(_log)
    try:
        torchrun.main()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception:  # torchrun raises ChildFailedError when its workers failed: print it, exit 1
        import traceback

        traceback.print_exc()
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["outcome"]:
        return outcome(args[1:])
    signum = signal.SIGUSR1
    if len(args) >= 2 and args[0] == "--signal":
        signum = signal.Signals["SIG" + args[1].upper().removeprefix("SIG")]
        args = args[2:]
    if not args or args[0] not in ("torchrun", "exec") or (args[0] == "exec" and len(args) < 2):
        print("usage: python -m slurm_elastic.launch [--signal USR1] torchrun ARGS... | exec PROGRAM [ARGS...]"
              " | outcome SRUN_STATUS", file=sys.stderr)
        return 2
    mode, rest = args[0], args[1:]
    install_forwarding(signum)
    rec = taskexit.Recorder.from_env(os.environ)
    if rec is not None:
        rec.write("running")
    rc = 1  # what the record says if something below raises
    stop = threading.Event()
    watcher: threading.Thread | None = None
    try:
        if not gate():
            rc = PREWARM_FAILED_RC
            return rc
        fast = mode == "torchrun" and os.environ.get(FAST_RESIZE_ENV, "1") != "0"
        leaver = rendezvous_leaver(os.environ.get("SLURMD_NODENAME")) if fast else None
        watcher = watch_notices(signum, None, stop, both(notice_follower(rec), leaver))
        rc = subprocess.Popen(rest).wait() if mode == "exec" else run_torchrun(rest)
        return rc
    finally:
        stop.set()
        if watcher is not None:  # its last mark must not overwrite the exit
            watcher.join(timeout=5)
        if rec is not None:
            rec.write("exited", rc=rc)


if __name__ == "__main__":
    sys.exit(main())
