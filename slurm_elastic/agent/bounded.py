"""Runs blocking calls (NVML) on one dedicated daemon thread, with a timeout, so the agent never blocks forever.

A call that times out keeps running on the worker: NVML calls cannot be cancelled. Until it returns, further
calls fail at once with :class:`NvmlBusyError` instead of piling up threads stuck in the driver. The worker is a
daemon thread, so a hung call does not keep the agent from exiting.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from slurm_elastic.agent.errors import NvmlBusyError, NvmlTimeoutError

T = TypeVar("T")


class BoundedCaller:
    def __init__(self, name: str = "nvml") -> None:
        self._name = name
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending: Future[Any] | None = None
        self._pending_since = 0.0
        self._thread = threading.Thread(target=self._work, name=f"{name}-worker", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller, who re-raises it
                fut.set_exception(exc)

    def call(self, fn: Callable[[], T], timeout_s: float) -> T:
        """``fn()`` on the worker; raises NvmlTimeoutError after ``timeout_s``, NvmlBusyError if still stuck."""
        with self._lock:
            if self._pending is not None and not self._pending.done():
                stuck = time.monotonic() - self._pending_since
                raise NvmlBusyError(f"an earlier {self._name} call has been blocked for {stuck:.1f} s")
            fut: Future[T] = Future()
            self._pending, self._pending_since = fut, time.monotonic()
            self._queue.put((fn, fut))
        try:
            return fut.result(timeout=timeout_s)
        except FutureTimeout:
            raise NvmlTimeoutError(f"{self._name} call did not return within {timeout_s:g} s") from None

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._pending is not None and not self._pending.done()

    def close(self) -> None:
        """Stops the worker once it is idle (a stuck call is abandoned with the daemon thread)."""
        self._queue.put(None)
