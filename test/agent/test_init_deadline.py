"""`agent init` has one deadline for the whole fetch (issue 11): hostile servers started here, on
loopback, that stall or trickle where no socket timeout fires."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
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


def test_a_trickling_artifact_server_is_dropped_at_the_low_speed_limit(
    tmp_path: Path, trickling_server: int
) -> None:
    code, err, took = run_init(
        tmp_path, "--flux-url", f"http://127.0.0.1:{trickling_server}/a.tar.gz",
        "--flux-digest", "sha256:" + "0" * 64, "--low-speed-limit", "100", "--low-speed-time", "2",
    )  # fmt: skip
    assert code == 1, err
    assert "below the low-speed limit of 100 bytes/s" in err and "artifact download" in err, err
    assert "127.0.0.1" in err and "gave up after" not in err, err
    assert took < 30


def test_the_low_speed_limit_comes_from_the_environment_and_zero_disables_it(
    tmp_path: Path, trickling_server: int
) -> None:
    args = (
        "--flux-url",
        f"http://127.0.0.1:{trickling_server}/a.tar.gz",
        "--flux-digest",
        "sha256:" + "0" * 64,
    )
    code, err, _ = run_init(
        tmp_path, *args, extra_env={"INIT_LOW_SPEED_LIMIT": "100", "INIT_LOW_SPEED_TIME": "2"}
    )
    assert code == 1 and "low-speed limit of 100 bytes/s" in err, err
    code, err, _ = run_init(
        tmp_path,
        *args,
        "--deadline",
        "4",
        extra_env={"INIT_LOW_SPEED_LIMIT": "0", "INIT_LOW_SPEED_TIME": "1"},
    )
    assert code == 1 and "gave up after 4s" in err, err


def test_bad_limits_are_usage_errors(tmp_path: Path) -> None:
    code, err, _ = run_init(
        tmp_path, "--flux-url", "http://127.0.0.1:1/a.tar.gz", "--flux-digest", "sha256:" + "0" * 64,
        extra_env={"INIT_LOW_SPEED_TIME": "soon"},
    )  # fmt: skip
    assert code == 2 and "INIT_LOW_SPEED_TIME must be a number" in err, err


@pytest.fixture
def trickling_git_http() -> Iterator[int]:
    """A smart-HTTP git server that starts a valid ref advertisement, then sends one byte every 0.5 s."""

    def handler(conn: socket.socket, stop: threading.Event) -> None:
        conn.recv(65536)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-git-upload-pack-advertisement\r\n"
            b"Cache-Control: no-cache\r\nContent-Length: 100000\r\n\r\n"
        )
        line = b"# service=git-upload-pack\n"
        body = b"%04x%s0000" % (len(line) + 4, line)
        ref = b"0" * 40 + b" HEAD\0multi_ack side-band-64k ofs-delta shallow\n"
        body += b"%04x%s" % (len(ref) + 4, ref)
        for byte in body:
            if stop.is_set():
                return
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return
            time.sleep(0.5)

    yield from _serve(handler)


def test_a_trickling_git_http_server_cannot_hold_init_past_its_deadline(
    tmp_path: Path, trickling_git_http: int
) -> None:
    code, err, took = run_init(
        tmp_path, "--git-url", f"http://127.0.0.1:{trickling_git_http}/repo.git", "--git-revision", "main",
        "--timeout", "600", "--deadline", "3",
    )  # fmt: skip
    assert code == 1, err
    assert "gave up after 3s" in err and "git repository" in err and "127.0.0.1" in err, err
    assert took < 30


def test_a_trickling_git_http_server_is_dropped_at_the_low_speed_limit(
    tmp_path: Path, trickling_git_http: int
) -> None:
    code, err, took = run_init(
        tmp_path, "--git-url", f"http://127.0.0.1:{trickling_git_http}/repo.git", "--git-revision", "main",
        "--timeout", "600", "--low-speed-limit", "50", "--low-speed-time", "2",
    )  # fmt: skip
    assert code == 1, err
    assert "below the low-speed limit of 50 bytes/s" in err and "git repository" in err, err
    assert took < 30


class _SilentUploadPack(paramiko.ServerInterface):
    """Authenticates anyone, accepts `git-upload-pack`, then never answers."""

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_env_request(self, channel: paramiko.Channel, name: bytes, value: bytes) -> bool:
        return True

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        return True


def test_an_ssh_server_silent_after_auth_cannot_hold_init_past_its_deadline(
    tmp_path: Path, new_ssh_key: Callable[[], str]
) -> None:
    host_key = paramiko.ECDSAKey.generate()
    transports: list[paramiko.Transport] = []

    def handler(conn: socket.socket, stop: threading.Event) -> None:
        transport = paramiko.Transport(conn)
        transport.add_server_key(host_key)
        transports.append(transport)
        try:
            transport.start_server(server=_SilentUploadPack())
            channel = transport.accept(30)  # held: a collected channel closes itself
        except (paramiko.SSHException, EOFError, OSError):
            return
        stop.wait()
        if channel is not None:
            channel.close()

    servers = _serve(handler)
    port = next(servers)
    try:
        known = tmp_path / "known_hosts"
        known.write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
        code, err, took = run_init(
            tmp_path, "--git-url", f"ssh://git@127.0.0.1:{port}/repo.git", "--git-revision", "main",
            "--git-ssh-known-hosts-file", str(known), "--timeout", "600", "--deadline", "3",
            extra_env={"GIT_SSH_PRIVATE_KEY": new_ssh_key()},
        )  # fmt: skip
    finally:
        for transport in transports:
            transport.close()
        next(servers, None)
    assert code == 1, err
    assert "gave up after 3s" in err and "git repository" in err and "127.0.0.1" in err, err
    assert transports, "the SSH server was never reached"
    assert took < 30
