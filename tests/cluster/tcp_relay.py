"""A TCP relay a test owns, in front of one client's database traffic, to cut that client off at network level.

Only the client pointed at the relay is cut; everything else reaches the server directly. ``cut()`` makes the
relay a silent black hole, as a partition is: connections are still accepted (the kernel completes the handshake
from the listen backlog) but nothing is forwarded either way, and nothing is closed, so the client sees no error,
only its own timeouts, and the server sees an idle client. What was sent during the cut stays in the sockets'
buffers and is delivered after ``heal()``, as TCP's retransmissions deliver it when a partition ends; connections
accepted during the cut reach the server only then. Sockets the client gave up on are closed after the heal, once
their buffered bytes are through.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator

POLL_S = 0.1


class TcpRelay:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._open = threading.Event()
        self._open.set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self.accepted = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name="tcp-relay", daemon=True)
        self._thread.start()

    @property
    def is_cut(self) -> bool:
        return not self._open.is_set()

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._stop.set()
        self._open.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()
        self._thread.join(timeout=5)

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._sockets.add(s)

    def _wait_open(self) -> bool:
        while not self._stop.is_set():
            if self._open.wait(POLL_S):
                return not self._stop.is_set()
        return False

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            r, _, _ = select.select([self._listener], [], [], POLL_S)
            if not r or self._stop.is_set():
                continue
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            self._track(client)
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        if not self._wait_open():  # accepted during a cut: the server hears of it only after the heal
            return
        try:
            server = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        server.settimeout(None)
        self._track(server)
        threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Copy ``src`` to ``dst`` while the relay is open; during a cut read nothing (the bytes wait)."""
        try:
            while self._wait_open():
                r, _, _ = select.select([src], [], [], POLL_S)
                if not r or self.is_cut:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):  # one side closed: close the pair (the other pump then ends too)
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def tcp_relay(target: tuple[str, int]) -> Iterator[TcpRelay]:
    relay = TcpRelay(target)
    try:
        yield relay
    finally:
        relay.close()
