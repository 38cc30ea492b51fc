"""`agent init` has one deadline for the whole fetch (issue 11): hostile servers started here, on
loopback, that stall or trickle where no socket timeout fires."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _serve(handler: object) -> Iterator[int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def loop() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=handler, args=(conn, stop), daemon=True).start()  # type: ignore[arg-type]

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    listener.close()
    for conn in conns:
        conn.close()


@pytest.fixture
def silent_server() -> Iterator[int]:
    """Accepts, then never says a word (a git:// daemon gone quiet)."""

    def handler(conn: socket.socket, stop: threading.Event) -> None:
        stop.wait()

    yield from _serve(handler)


@pytest.fixture
def trickling_server() -> Iterator[int]:
    """An HTTP server that sends headers, then one byte every 0.5 s: each read succeeds in time."""

    def handler(conn: socket.socket, stop: threading.Event) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nContent-Type: application/gzip\r\n\r\n")
        while not stop.is_set():
            try:
                conn.sendall(b"x")
            except OSError:
                return
            time.sleep(0.5)

    yield from _serve(handler)


def run_init(
    tmp_path: Path, *args: str, timeout: float = 60, extra_env: dict[str, str] | None = None
) -> tuple[int, str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "FLUX_", "INIT_"))}
    env.update(extra_env or {})
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pko.agent", "init", "--target-dir", str(tmp_path / "src"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    return proc.returncode, proc.stderr, time.monotonic() - start


def test_a_silent_git_daemon_cannot_hold_init_past_its_deadline(tmp_path: Path, silent_server: int) -> None:
    code, err, took = run_init(
        tmp_path, "--git-url", f"git://127.0.0.1:{silent_server}/repo.git", "--git-revision", "main",
        "--timeout", "600", "--deadline", "3",
    )  # fmt: skip
    assert code == 1, err
    assert "gave up after 3s" in err and "127.0.0.1" in err and "git repository" in err, err
    assert took < 30


def test_a_trickling_artifact_server_cannot_hold_init_past_its_deadline(
    tmp_path: Path, trickling_server: int
) -> None:
    code, err, took = run_init(
        tmp_path, "--flux-url", f"http://127.0.0.1:{trickling_server}/a.tar.gz",
        "--flux-digest", "sha256:" + "0" * 64, "--deadline", "3",
    )  # fmt: skip
    assert code == 1, err
    assert "gave up after 3s" in err and "artifact download" in err and "127.0.0.1" in err, err
    assert took < 30


def test_the_deadline_comes_from_the_environment(tmp_path: Path, silent_server: int) -> None:
    code, err, took = run_init(
        tmp_path, "--git-url", f"git://127.0.0.1:{silent_server}/r.git", "--git-revision", "main",
        "--timeout", "600", extra_env={"INIT_DEADLINE": "2"},
    )  # fmt: skip
    assert code == 1 and "gave up after 2s" in err, err
    assert took < 30
