"""The low-speed rule of `agent init` (pko.agent.transfer), on a clock the test moves."""

from __future__ import annotations

import subprocess
import sys

from pko.agent import transfer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def feed(
    check: transfer.LowSpeedCheck, clock: Clock, start: float | None, per_second: int, seconds: int
) -> list[int | None]:
    verdicts = []
    total = 0
    for _ in range(seconds):
        clock.now += 1
        total += per_second
        verdicts.append(check.too_slow(start, total))
    return verdicts


def test_slow_is_judged_only_after_a_whole_window() -> None:
    clock = Clock()
    check = transfer.LowSpeedCheck(limit=100, window=5, clock=clock)
    verdicts = feed(check, clock, clock.now, per_second=10, seconds=8)
    assert verdicts[:4] == [None] * 4  # less than a window of samples: no verdict yet
    assert verdicts[5:] == [50, 50, 50]  # 10 bytes/s over the last 5 s


def test_fast_enough_is_never_slow() -> None:
    clock = Clock()
    check = transfer.LowSpeedCheck(limit=100, window=5, clock=clock)
    assert feed(check, clock, clock.now, per_second=100, seconds=20) == [None] * 20


def test_nothing_is_slow_outside_a_network_phase() -> None:
    """Checkout and extraction receive nothing; they must not be taken for a stalled server."""
    clock = Clock()
    check = transfer.LowSpeedCheck(limit=100, window=5, clock=clock)
    assert feed(check, clock, None, per_second=0, seconds=20) == [None] * 20
    # A new phase starts a fresh window: what happened before it does not count.
    assert feed(check, clock, clock.now, per_second=0, seconds=4) == [None] * 4


def test_zero_disables_the_limit() -> None:
    clock = Clock()
    check = transfer.LowSpeedCheck(limit=0, window=5, clock=clock)
    assert feed(check, clock, clock.now, per_second=0, seconds=20) == [None] * 20


_COUNTING = """
import socket
from pko.agent import transfer
transfer.install()
transfer.install()  # idempotent: counting twice would double the figures
a, b = socket.socketpair()
before = transfer.received()
a.sendall(b"x" * 300)
assert len(b.recv(100)) == 100
assert b.recv_into(bytearray(200)) == 200
print(transfer.received() - before)
"""


def test_bytes_received_on_any_socket_are_counted() -> None:
    # In a process of its own: install() patches the socket module process-wide, as `init` wants.
    out = subprocess.run([sys.executable, "-c", _COUNTING], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "300", out.stderr


def test_network_phases_nest() -> None:
    assert transfer.phase_start() is None
    with transfer.network():
        started = transfer.phase_start()
        assert started is not None
        with transfer.network():
            assert transfer.phase_start() == started
        assert transfer.phase_start() == started
    assert transfer.phase_start() is None
