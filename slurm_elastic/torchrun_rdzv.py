"""The launcher's hold on its torchrun agent's rendezvous (torch's c10d ``DynamicRendezvousHandler``).

The launcher runs torchrun in its own process (slurm_elastic/launch.py), so it can reach the agent's rendezvous
handler: :func:`capture` wraps torch's handler factory and keeps the handler the agent creates. Two uses:

* **Leave on a shrink notice** (:func:`leave`): on a node that a shrink releases, the agent removes itself from
  the rendezvous' participants at once (the exit step torch itself runs at the start of every new round) and
  stops its heartbeats. Without it the others, once their workers fail, wait for its missed heartbeats
  (``keep_alive_interval`` x ``keep_alive_max_attempt``, 2 s x 3 in the templates) before the round without it
  can start. Nothing else changes for the running workers: agents react to the wait list, not to participants.
* **Re-form at once after the checkpoint** (:func:`expect`): once the job acknowledged a resize notice, the
  size of the next round is known (the notice's ``to``). The agent restarts its workers at once (its
  ``num_nodes_waiting`` answers 1 a single time, which is how torch's agent learns of a membership change)
  instead of waiting for Slurm to kill a released node's task (a shrink) or for the new agent to appear (a
  grow), and that one round admits exactly ``to`` nodes (min = max): it closes the moment the last one joins,
  without the last call (``last_call_timeout``) and without closing early on a grow whose new agent is still
  starting. The agents of released nodes do not join it: their ``next_rendezvous`` waits while the notice
  releases their node (Slurm ends them). The override ends with that round, when the notice's hold ends
  (``hold_until``: a grow whose extension job never starts; the round then closes at the old size as before), or
  when the notice is withdrawn or replaced.
* **Phase times** (:func:`capture` with ``log``): each call of ``next_rendezvous`` is logged when it starts
  (``rendezvous join role=leader|extension t=T``) and when it returns (``rendezvous complete world=N rank=R
  t=T``), the re-form phase of a resize (bench/resize_phases.py).

Only torch's private ``_stop_heartbeats``/``_op_executor`` and ``_RendezvousExitOp`` are used (torch 2.x); any
difference in them makes :func:`leave` say so and return False: the resize then goes as before, waiting for the
heartbeats. Imports torch lazily: only the torchrun mode of the launcher calls this module.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slurm_elastic import resize

HANDLERS: list[Any] = []  # the agent's rendezvous handler(s), newest last
LEAVE_TIMEOUT_S = 10.0
RELEASED_POLL_S = 0.2


@dataclass
class Round:
    """The next rendezvous round after an acknowledged notice."""

    notice_id: str
    size: int  # nodes (agents) after the resize
    released: bool  # this node is one the shrink takes away
    until: float  # Unix time: the override is dropped then (the notice's hold_until, when held workers would
    #               train on; its deadline is shortened to a few acknowledgement times before a grow)
    restart: bool  # make the running agent restart its workers (False: it has formed no round yet)
    used: bool = False


EXPECT: list[Round | None] = [None]
ACTIVE: list[Callable[[], None] | None] = [None]  # puts the settings back while an override is in force
ROUNDS = [0]  # rendezvous rounds this agent completed
LOCK = threading.Lock()


def expect(n: resize.Notice, node: str | None) -> None:
    """Notice ``n`` is acknowledged: the next round has ``n.to_nodes`` agents (once per notice)."""
    with LOCK:
        cur = EXPECT[0]
        if (cur is not None and cur.notice_id == n.id) or n.to_nodes <= 0:
            return
        EXPECT[0] = Round(n.id, n.to_nodes, n.releases(node), n.hold_until, restart=ROUNDS[0] > 0)


def drop(keep: str | None = None) -> None:
    """The notice is gone (withdrawn, expired) or replaced by notice ``keep``: no override, no restart for it."""
    with LOCK:
        cur = EXPECT[0]
        if cur is None or cur.notice_id == keep:
            return
        EXPECT[0] = None
        restore = ACTIVE[0]
    if restore is not None:
        restore()


def follow(n: resize.Notice | None, node: str | None, now: float | None = None) -> None:
    """The launcher's notice watcher, at every poll: expect the round of an acknowledged notice; forget one that
    is gone or replaced."""
    t = time.time() if now is None else now
    if n is None or t > n.hold_until:
        drop()
        return
    drop(keep=n.id)
    ack = resize.read_ack()
    if ack is not None and ack.id == n.id:
        expect(n, node)


def capture(log: Callable[[str], None] | None = None) -> None:
    """Keep every rendezvous handler torchrun creates in this process (call before torchrun's main)."""
    registry: Any = importlib.import_module("torch.distributed.elastic.rendezvous.registry")
    make = registry.get_rendezvous_handler
    if getattr(make, "_slurm_elastic", False):
        return

    def get_rendezvous_handler(params: Any) -> Any:
        handler = make(params)
        HANDLERS.append(handler)
        if log is not None:
            _log_rounds(handler, log)
        return handler

    get_rendezvous_handler._slurm_elastic = True  # type: ignore[attr-defined]  # wrapped once per process
    registry.get_rendezvous_handler = get_rendezvous_handler


def _log_rounds(handler: Any, log: Callable[[str], None]) -> None:
    nxt = getattr(handler, "next_rendezvous", None)
    waiting = getattr(handler, "num_nodes_waiting", None)
    if nxt is None or waiting is None:
        return

    def num_nodes_waiting() -> int:
        n = int(waiting())
        with LOCK:
            cur = EXPECT[0]
            if n == 0 and cur is not None and cur.restart:
                cur.restart = False
                log(f"notice {cur.notice_id} acknowledged: restarting the workers for a round of {cur.size} node(s)")
                return 1
        return n

    def next_rendezvous() -> Any:
        with LOCK:
            cur = EXPECT[0]
            if cur is not None and (cur.used or time.time() > cur.until):
                cur = None
            if cur is not None:  # this is the round the notice announced: no restart for it after this one
                cur.used, cur.restart = True, False
        if cur is not None and cur.released:
            _wait_released(cur, log)
        log(f"rendezvous join role={os.environ.get('SLURM_ELASTIC_ROLE', 'leader')} t={time.time():.3f}")
        restore = _admit_exactly(handler, cur.size, cur.until, log) if cur is not None and not cur.released else None
        try:
            info = nxt()
        finally:
            if restore is not None:
                restore()
        ROUNDS[0] += 1
        log(f"rendezvous complete world={getattr(info, 'world_size', '?')} rank={getattr(info, 'rank', '?')} "
            f"t={time.time():.3f}")
        return info

    handler.num_nodes_waiting = num_nodes_waiting
    handler.next_rendezvous = next_rendezvous


def _wait_released(cur: Round, log: Callable[[str], None]) -> None:
    """A node the shrink takes away joins no round while the notice still releases it (Slurm ends its task)."""
    log(f"notice {cur.notice_id} releases this node: not joining the next round")
    while True:
        n = resize.read_notice()
        if n is None or n.id != cur.notice_id or time.time() > n.hold_until:
            log("the shrink was called off: joining again")
            return
        time.sleep(RELEASED_POLL_S)


def _admit_exactly(handler: Any, size: int, until: float, log: Callable[[str], None]) -> Callable[[], None] | None:
    """Set the handler's rendezvous settings to min = max = ``size`` until the round completes or ``until``
    passes; returns the function that puts them back (None: left as they were)."""
    settings = getattr(handler, "_settings", None)
    lo, hi = getattr(settings, "min_nodes", None), getattr(settings, "max_nodes", None)
    if not isinstance(lo, int) or not isinstance(hi, int) or not 1 <= size <= hi:
        return None
    done = threading.Event()

    def restore() -> None:
        if not done.is_set():
            done.set()
            object.__setattr__(settings, "min_nodes", lo)  # a frozen dataclass, shared with torch's op executor
            object.__setattr__(settings, "max_nodes", hi)

    def expire() -> None:
        if not done.is_set():
            log(f"the round of {size} node(s) has not formed and its notice is over: admitting {lo}..{hi} again")
            restore()

    object.__setattr__(settings, "min_nodes", size)
    object.__setattr__(settings, "max_nodes", size)
    timer = threading.Timer(max(0.0, until - time.time()), expire)
    timer.daemon = True
    timer.start()
    ACTIVE[0] = expire  # the notice withdrawn while the round waits (drop)

    def put_back() -> None:
        ACTIVE[0] = None
        timer.cancel()
        restore()
    return put_back


def leave(log: Callable[[str], None] | None = None) -> bool:
    """Remove this node from the current rendezvous round and stop its heartbeats; False when there is no
    handler yet or torch's internals differ (then nothing was changed beyond the heartbeats)."""
    if not HANDLERS:
        return False
    handler = HANDLERS[-1]
    try:
        dynamic = importlib.import_module("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
        handler._stop_heartbeats()
        handler._op_executor.run(dynamic._RendezvousExitOp(), time.monotonic() + LEAVE_TIMEOUT_S)
    except Exception as e:  # torch's private API: a newer torch may differ; the heartbeats then expire as before
        if log is not None:
            log(f"could not leave the rendezvous ({type(e).__name__}: {e}); the others wait for its heartbeats")
        return False
    if log is not None:
        log(f"left the rendezvous t={time.time():.3f}")
    return True
