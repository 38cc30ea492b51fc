"""The node's processes: started detached with their logs under ``.node/logs``, their pids and command
lines in ``.node/pids.json`` and ``.node/run/commands.json``, stopped, waited for, restarted one at a
time (the fault matrix's restarts), and listed (``status``)."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from pko.devtools.kubectl import run
from pko.devtools.localnode.node import (
    APISERVER_PORT,
    COMPONENTS,
    NODE2_COMPONENTS,
    NODE_IP,
    STATE,
    _log,
    bin_dir,
)
from pko.devtools.waiting import NotReached, until


def _pids() -> dict[str, int]:
    try:
        return dict(json.loads((STATE / "pids.json").read_text()))
    except (OSError, ValueError):
        return {}


def _save_pid(name: str, pid: int) -> None:
    pids = _pids()
    pids[name] = pid
    (STATE / "pids.json").write_text(json.dumps(pids, indent=1))


def _spawn(name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log = open(STATE / "logs" / f"{name}.log", "ab")
    proc = subprocess.Popen(
        args,
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    log.close()
    _save_pid(name, proc.pid)
    commands = _commands()
    commands[name] = {"args": args, "env": env or {}}
    (STATE / "run" / "commands.json").write_text(json.dumps(commands, indent=1))
    return proc


def _commands() -> dict[str, dict[str, object]]:
    """How each component was started (``restart`` starts it again the same way)."""
    try:
        return dict(json.loads((STATE / "run" / "commands.json").read_text()))
    except (OSError, ValueError):
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        pass
    try:  # and so does anyone else's zombie (a killed node-2 component its reaper has not reaped yet)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _stop(name: str, pid: int, timeout: float = 20.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 5)
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.1)
    _log(f"{name} (pid {pid}) did not exit")


def _wait(what: str, probe: Callable[[], object], timeout: float, log: str | None = None) -> None:
    """Until ``probe()`` is true (an exception counts as not yet), naming the component's log if not."""
    try:
        until(f"{what} ready", probe, within=timeout, interval=0.5, transient=(Exception,))
    except NotReached as e:
        hint = f"; see {STATE / 'logs' / log}" if log else ""
        raise TimeoutError(f"{e}{hint}") from None


def _https_ok(path: str, token: str) -> bool:
    ctx = ssl.create_default_context(cafile=str(STATE / "pki" / "ca.crt"))
    req = urllib.request.Request(
        f"https://{NODE_IP}:{APISERVER_PORT}{path}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(req, timeout=3, context=ctx) as r:
        return bool(r.status == 200)


def _kubectl(*args: str, check: bool = True) -> str:
    """kubectl of the node's own release (the machine's may be outside the version skew)."""
    return run(*args, kubeconfig=STATE / "kubeconfig", binary=bin_dir() / "kubectl", check=check).stdout


def _forget(*names: str) -> None:
    """Drop components from pids.json and commands.json (read-modify-write, as ``_save_pid``)."""
    pids = _pids()
    if any(n in pids for n in names):
        (STATE / "pids.json").write_text(
            json.dumps({k: v for k, v in pids.items() if k not in names}, indent=1)
        )
    commands = _commands()
    if any(n in commands for n in names):
        (STATE / "run" / "commands.json").write_text(
            json.dumps({k: v for k, v in commands.items() if k not in names}, indent=1)
        )


def restart(name: str, sig: signal.Signals = signal.SIGTERM, down_for: float = 0.0) -> int:
    """Stop one component of a running node (``sig`` to its process only: containerd's shims, and so
    the containers, live on) and start it again as ``up`` did, after ``down_for`` seconds: the fault
    matrix's kubelet, containerd, kube-apiserver and etcd restarts. Returns the new pid."""
    pid, command = _pids().get(name), _commands().get(name)
    if pid is None or command is None:
        raise SystemExit(f"localnode: {name} is not running on this node (components: {', '.join(_pids())})")
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    time.sleep(down_for)
    args, env = command["args"], command["env"]
    assert isinstance(args, list) and isinstance(env, dict)
    new = _spawn(name, [str(a) for a in args], {str(k): str(v) for k, v in env.items()}).pid
    _log(f"{name} restarted (pid {pid} -> {new}, {sig.name}, down {down_for:.0f}s)")
    return new


def status() -> int:
    pids = _pids()
    if not pids:
        print("down")
        return 1
    node2 = NODE2_COMPONENTS if any(n in pids for n in NODE2_COMPONENTS) else ()
    for name in (*COMPONENTS, *node2):
        pid = pids.get(name)
        print(f"{name:25} {'running' if pid and _alive(pid) else 'STOPPED'} {pid or ''}")
    return 0
