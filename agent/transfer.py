"""The low-speed limit of `agent init`: bytes received while a transfer is under way, judged over a
sliding window, as git's ``http.lowSpeedLimit``/``http.lowSpeedTime`` do for one HTTP transfer.

Counting happens at the socket layer because the transports (urllib, dulwich over urllib3, paramiko,
git://) share nothing above it, and a server that trickles one valid byte at a time defeats every
per-read timeout they have. Only the network phases are judged: checkout and extraction receive
nothing and must not count as slow.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

_lock = threading.Lock()
_received = 0
_depth = 0
_phase_started: float | None = None
_installed = False


def _count(n: int) -> None:
    global _received
    if n > 0:
        with _lock:
            _received += n


def received() -> int:
    """Bytes received over any socket of this process since counting began."""
    with _lock:
        return _received


def install() -> None:
    """Count every byte this process receives. Idempotent; process-wide by design (`init` is a
    short-lived process of its own)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True

    plain_recv = socket.socket.recv
    plain_recv_into = socket.socket.recv_into
    tls_read = ssl.SSLSocket.read

    def recv(self: socket.socket, bufsize: int, flags: int = 0) -> bytes:
        data = plain_recv(self, bufsize, flags)
        _count(len(data))
        return data

    def recv_into(self: socket.socket, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        n = plain_recv_into(self, buffer, nbytes, flags)
        _count(n)
        return n

    def read(self: ssl.SSLSocket, n: int = 1024, buffer: Any = None) -> Any:
        # SSLSocket.recv/recv_into call read(): counting here alone avoids counting twice.
        data = tls_read(self, n, buffer)
        _count(data if isinstance(data, int) else len(data))
        return data

    socket.socket.recv = recv  # type: ignore[method-assign,assignment]
    socket.socket.recv_into = recv_into  # type: ignore[method-assign,assignment]
    ssl.SSLSocket.read = read  # type: ignore[method-assign,assignment]


@contextlib.contextmanager
def network() -> Iterator[None]:
    """Marks a span in which bytes are expected to arrive; spans may nest."""
    global _depth, _phase_started
    with _lock:
        _depth += 1
        if _depth == 1:
            _phase_started = time.monotonic()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _phase_started = None


class LowSpeedCheck:
    """Fed a sample a second; says when a network phase has lasted ``window`` seconds with fewer than
    ``limit`` bytes per second on average over the last ``window`` seconds."""

    def __init__(self, limit: float, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()

    def too_slow(self, phase_start: float | None, total: int) -> int | None:
        """The bytes received in the last window when that is too few, else None."""
        now = self._clock()
        if phase_start is None or self.limit <= 0 or self.window <= 0:
            self._samples.clear()
            return None
        self._samples.append((now, total))
        while len(self._samples) > 1 and self._samples[1][0] <= now - self.window:
            self._samples.popleft()
        oldest_time, oldest_total = self._samples[0]
        if now - phase_start < self.window or now - oldest_time < self.window:
            return None
        got = total - oldest_total
        return got if got < self.limit * self.window else None


def phase_start() -> float | None:
    """When the current network phase began (monotonic), or None outside one."""
    with _lock:
        return _phase_started
