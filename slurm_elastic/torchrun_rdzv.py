"""The launcher's hold on its torchrun agent's rendezvous (torch's c10d ``DynamicRendezvousHandler``).

The launcher runs torchrun in its own process (slurm_elastic/launch.py), so it can reach the agent's rendezvous
handler: :func:`capture` wraps torch's handler factory and keeps the handler the agent creates. Two uses:

* **Leave on a shrink notice** (:func:`leave`): on a node that a shrink releases, the agent removes itself from
  the rendezvous' participants at once (the exit step torch itself runs at the start of every new round) and
  stops its heartbeats. Without it the others, once their workers fail, wait for its missed heartbeats
  (``keep_alive_interval`` x ``keep_alive_max_attempt``, 2 s x 3 in the templates) before the round without it
  can start. Nothing else changes for the running workers: agents react to the wait list, not to participants.
* **Phase times** (:func:`capture` with ``log``): each call of ``next_rendezvous`` is logged when it starts
  (``rendezvous join t=T``) and when it returns (``rendezvous complete world=N rank=R t=T``), the re-form phase
  of a resize (bench/resize_phases.py).

Only torch's private ``_stop_heartbeats``/``_op_executor`` and ``_RendezvousExitOp`` are used (torch 2.x); any
difference in them makes :func:`leave` say so and return False: the resize then goes as before, waiting for the
heartbeats. Imports torch lazily: only the torchrun mode of the launcher calls this module.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

HANDLERS: list[Any] = []  # the agent's rendezvous handler(s), newest last
LEAVE_TIMEOUT_S = 10.0


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
    if nxt is None:
        return

    def next_rendezvous() -> Any:
        log(f"rendezvous join t={time.time():.3f}")
        info = nxt()
        log(f"rendezvous complete world={getattr(info, 'world_size', '?')} rank={getattr(info, 'rank', '?')} "
            f"t={time.time():.3f}")
        return info

    handler.next_rendezvous = next_rendezvous


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
