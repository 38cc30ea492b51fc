#!/usr/bin/env python3
"""A private OCI registry, run as users run theirs: the CNCF Distribution server (hack/build-registry.sh)
with TLS from a CA of its own (pko.devtools.pki; the address's IP in the cert's SANs), htpasswd auth (bcrypt,
the only hash Distribution accepts) and filesystem storage with deletes enabled. The node pulls from it
over the same protocol, and with the same credentials flow (an imagePullSecret), as from a real one.

    python3 hack/registry.py up [--host 10.87.0.1] [--port 0] [--state DIR]   # prints JSON: address, ca,
                                                                              # username, password
    python3 hack/registry.py up --env ...   # the same as shell exports: REGISTRY, REGISTRY_CA,
                                            # PKO_REGISTRY_USERNAME, PKO_REGISTRY_PASSWORD
    python3 hack/registry.py down [--state DIR]

The server runs detached (its own session), so ``up`` returns once it answers ``GET /v2/`` with 401
without credentials and 200 with them; ``down`` stops it. State (``--state``, default ``.node/registry``,
which the node's ``down`` keeps): ``pki/`` (the CA and the serving cert), ``htpasswd``,
``credentials.json`` (kept across restarts, as the CA is), ``config.yml``, ``data/`` (the blobs),
``registry.log`` and ``registry.pid``. Port 0 lets the server pick one: its address is read from its log.

Standard library only (it runs before the project's virtualenv exists). The bcrypt entry is written by
``htpasswd -B`` (Debian's apache2-utils, installed when missing): ``openssl passwd`` has no bcrypt, and
Python's ``crypt`` module is gone in 3.13.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import json
import os
import secrets
import shlex
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from pko.devtools.builds import built
from pko.devtools.localcluster import _apt_install
from pko.devtools.pki import Cert, ensure_pki

HACK = Path(__file__).resolve().parents[2] / "hack"
DEFAULT_STATE = HACK.parent / ".node" / "registry"
CA_CN = "pko-registry-ca"
USERNAME = "pko"
START_TIMEOUT = 30.0


def _log(msg: str) -> None:
    print(f"registry: {msg}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Registry:
    """A running registry: ``address`` is ``HOST:PORT`` (what image names start with), ``ca`` the CA
    certificate its serving cert is signed by."""

    address: str
    ca: Path
    username: str
    password: str
    state_dir: Path
    pid: int

    def stop(self) -> None:
        stop(self.state_dir)

    def auth_header(self) -> str:
        """The ``Authorization`` header value of its credentials (HTTP Basic, as htpasswd auth reads)."""
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    def as_json(self) -> dict[str, str | int]:
        return {
            "address": self.address,
            "ca": str(self.ca),
            "username": self.username,
            "password": self.password,
            "pid": self.pid,
        }


def binary() -> Path:
    """The ``registry`` server, built once (hack/build-registry.sh prints its dist directory last)."""
    return built("build-registry.sh", show_stderr=True) / "bin" / "registry"


def _pki(state_dir: Path, host: str) -> Path:
    """The CA and the serving cert (SANs: ``host``, the loopback and ``localhost``), made anew when the
    SANs asked for differ from the ones on disk (the CA goes with them: a node trusts one CA file)."""
    sans = tuple(dict.fromkeys((f"IP:{host}", "IP:127.0.0.1", "DNS:localhost")))
    pki = state_dir / "pki"
    recorded = pki / "sans"
    if recorded.exists() and recorded.read_text() != ",".join(sans):
        for f in pki.iterdir():
            f.unlink()
    ensure_pki(pki, CA_CN, [Cert("registry", "/CN=pko-registry", "serverAuth", sans)])
    recorded.write_text(",".join(sans))
    return pki


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """What subprocesses print (apt-get's progress) goes to stderr: stdout carries ``up``'s JSON only."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _credentials(state_dir: Path) -> tuple[str, str]:
    """The user and password (kept in ``credentials.json``), and their bcrypt entry in ``htpasswd``."""
    stored = state_dir / "credentials.json"
    if stored.exists():
        creds = json.loads(stored.read_text())
        username, password = str(creds["username"]), str(creds["password"])
    else:
        username, password = USERNAME, secrets.token_urlsafe(24)
        stored.write_text(json.dumps({"username": username, "password": password}))
        stored.chmod(0o600)
    with _stdout_to_stderr():
        _apt_install("apache2-utils")
    # -i: the password on stdin, never in a process listing; -B: bcrypt; -C 10: its cost (upstream's default).
    subprocess.run(
        ["htpasswd", "-c", "-i", "-B", "-C", "10", str(state_dir / "htpasswd"), username],
        input=password,
        text=True,
        check=True,
        capture_output=True,
    )
    return username, password


def _config(state_dir: Path, pki: Path, host: str, port: int) -> Path:
    config = state_dir / "config.yml"
    # JSON is YAML: one quoting rule for paths and secrets. The log in JSON, so the address is parsed, not
    # scraped; no storage health check (its first run reports the empty root as unhealthy for a while).
    config.write_text(
        json.dumps(
            {
                "version": 0.1,
                "log": {"level": "info", "formatter": "json", "accesslog": {"disabled": True}},
                "storage": {
                    "filesystem": {"rootdirectory": str(state_dir / "data")},
                    "delete": {"enabled": True},
                    "maintenance": {"uploadpurging": {"enabled": False}},
                },
                "http": {
                    "addr": f"{host}:{port}",
                    "secret": secrets.token_hex(16),
                    "tls": {"certificate": str(pki / "registry.crt"), "key": str(pki / "registry.key")},
                    "headers": {"X-Content-Type-Options": ["nosniff"]},
                },
                "auth": {"htpasswd": {"realm": "pko-registry", "path": str(state_dir / "htpasswd")}},
            },
            indent=1,
        )
    )
    return config


def _listening(log: Path, offset: int) -> str | None:
    """The address the server logged ``listening on HOST:PORT, tls`` for, after ``offset`` in its log."""
    with log.open("rb") as f:
        f.seek(offset)
        for line in f.read().decode(errors="replace").splitlines():
            try:
                msg = str(json.loads(line).get("msg", ""))
            except ValueError:
                continue
            if msg.startswith("listening on ") and msg.endswith(", tls"):
                return msg.removeprefix("listening on ").removesuffix(", tls")
    return None


def get_v2(address: str, ca: Path, authorization: str | None = None) -> int:
    """The status of ``GET https://ADDRESS/v2/``, the TLS verified against ``ca``."""
    request = urllib.request.Request(f"https://{address}/v2/")
    if authorization:
        request.add_header("Authorization", authorization)
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # our own child exited: a zombie until reaped
        return os.waitpid(pid, os.WNOHANG)[0] == 0
    except ChildProcessError:
        pass
    try:  # and so is anyone else's (`up`'s server, once `up` exited) until its new parent reaps it
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def start(state_dir: Path, host: str, port: int = 0) -> Registry:
    """Start the registry on ``host:port`` (0: a port the server picks) with its state in ``state_dir``
    (a registry already running there is stopped first) and return once it answers ``GET /v2/`` with 401
    without credentials and 200 with them."""
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    stop(state_dir)
    server = binary()
    pki = _pki(state_dir, host)
    username, password = _credentials(state_dir)
    config = _config(state_dir, pki, host, port)
    log_path = state_dir / "registry.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [str(server), "serve", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # outlives `registry.py up`; `down` signals its group
        )
    (state_dir / "registry.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + START_TIMEOUT
    address = None
    while address is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(state_dir)
            tail = log_path.read_bytes()[offset:].decode(errors="replace")[-2000:]
            raise RuntimeError(f"the registry did not start (exit {proc.returncode}); its log:\n{tail}")
        address = _listening(log_path, offset)
        time.sleep(0.05)
    registry = Registry(address, pki / "ca.crt", username, password, state_dir, proc.pid)
    while True:
        try:
            if (
                get_v2(address, registry.ca) == 401
                and get_v2(address, registry.ca, registry.auth_header()) == 200
            ):
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(state_dir)
            raise RuntimeError(
                f"the registry at {address} did not answer /v2/ with 401 then 200 (log: {log_path})"
            )
        time.sleep(0.1)
    _log(f"running at {address} (pid {proc.pid}, state {state_dir})")
    return registry


def stop(state_dir: Path, timeout: float = 15.0) -> None:
    """Stop the registry whose state is ``state_dir`` (a no-op when none runs there): SIGTERM to its
    process group, SIGKILL after ``timeout`` seconds. Its storage stays."""
    pid_file = state_dir / "registry.pid"
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    cmdline = Path(f"/proc/{pid}/cmdline")
    # Only our server: a pid reused since it exited is left alone.
    if _alive(pid) and cmdline.exists() and str(state_dir / "config.yml").encode() in cmdline.read_bytes():
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not _alive(pid):
                break
    pid_file.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("up", "down"))
    p.add_argument("--host", default="127.0.0.1", help="up: the address to serve on (the node's: 10.87.0.1)")
    p.add_argument("--port", type=int, default=0, help="up: the port (0: one the server picks)")
    p.add_argument("--state", type=Path, default=DEFAULT_STATE, help=f"its state (default {DEFAULT_STATE})")
    p.add_argument("--env", action="store_true", help="up: print shell exports, not JSON")
    args = p.parse_args(argv)
    if args.command == "up":
        running = start(args.state, args.host, args.port)
        if args.env:
            exports = {
                "REGISTRY": running.address,
                "REGISTRY_CA": str(running.ca),
                "PKO_REGISTRY_USERNAME": running.username,
                "PKO_REGISTRY_PASSWORD": running.password,
            }
            print("".join(f"export {k}={shlex.quote(v)}\n" for k, v in exports.items()), end="")
        else:
            print(json.dumps(running.as_json(), indent=1))
    else:
        stop(args.state.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
