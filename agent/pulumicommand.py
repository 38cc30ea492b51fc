"""The Pulumi CLI processes the agent's runner starts, and how it stops them.

Every CLI process the Automation API starts for the runner goes through ``TrackingPulumiCommand``, so
an interrupt reaches exactly the Pulumi processes the runner started (never other children of the
agent) and a cancel that arrives before the operation's process starts still stops it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

import structlog
from pulumi import automation as auto
from pulumi.automation import CommandResult, OnOutput
from pulumi.automation import errors as auto_errors

log = structlog.get_logger("pko.agent.pulumi")

OPERATION_VERBS = frozenset({"up", "preview", "refresh", "destroy"})


def _child_environ() -> dict[str, str]:
    """The agent's environment as Pulumi should see it.

    A PyInstaller one-file agent runs with LD_LIBRARY_PATH pointing at its bundled libraries; Pulumi
    and its plugins must get the library path the agent was started with (PyInstaller keeps it in
    LD_LIBRARY_PATH_ORIG), or they would load our OpenSSL instead of their own.
    """
    env = dict(os.environ)
    if getattr(sys, "frozen", False):
        original = env.pop("LD_LIBRARY_PATH_ORIG", None)
        if original is None:
            env.pop("LD_LIBRARY_PATH", None)
        else:
            env["LD_LIBRARY_PATH"] = original
    return env


class TrackingPulumiCommand(auto.PulumiCommand):
    """A PulumiCommand that knows the processes it runs, so they can be interrupted.

    ``run`` behaves like the Automation API's (non-interactive, ``PULUMI_AUTOMATION_API`` set,
    bundled plugins first on PATH) but starts each CLI in its own session, so a signal meant for
    the agent never reaches Pulumi directly: the agent decides when Pulumi sees CTRL-C. A failed
    command raises the Automation API's typed error with the CommandResult attached as
    ``command_result``.
    """

    def __init__(self, root: str | None = None, skip_version_check: bool = False) -> None:
        super().__init__(root=root, skip_version_check=skip_version_check)
        self._lock = threading.Lock()
        self._running: dict[int, tuple[subprocess.Popen[str], bool]] = {}
        self._interrupt = threading.Event()

    def reset_interrupt(self) -> None:
        self._interrupt.clear()

    @property
    def interrupted(self) -> bool:
        """Whether the running operation was asked to stop (CTRL-C) since the last reset."""
        return self._interrupt.is_set()

    def interrupt_operations(self) -> int:
        """Send SIGINT to running operation processes; later ones are refused. Returns how many."""
        self._interrupt.set()
        return self._signal(signal.SIGINT)

    def kill_operations(self) -> int:
        return self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> int:
        with self._lock:
            targets = [p for p, is_op in self._running.values() if is_op and p.poll() is None]
        for proc in targets:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
        if targets:
            log.info("signalled pulumi", signal=sig.name, pids=[p.pid for p in targets])
        return len(targets)

    def run(
        self,
        args: list[str],
        cwd: str,
        additional_env: Mapping[str, str],
        on_output: OnOutput | None = None,
        on_error: OnOutput | None = None,
    ) -> CommandResult:
        end = args.index("--") if "--" in args else len(args)
        if "--non-interactive" not in args[:end]:
            args.insert(0, "--non-interactive")
        verb = next((a for a in args if not a.startswith("-")), "")
        is_op = verb in OPERATION_VERBS
        env = {**_child_environ(), **additional_env, "PULUMI_AUTOMATION_API": "true"}
        if os.path.isabs(self.command):
            env["PATH"] = os.pathsep.join([os.path.dirname(self.command), env.get("PATH", "")])
        stdout: list[str] = []
        stderr: list[str] = []

        def pump(stream: Any, callback: OnOutput | None, sink: list[str]) -> None:
            for line in iter(stream.readline, ""):
                line = line.rstrip()
                sink.append(line)
                if callback is not None:
                    callback(line)
            stream.close()

        with self._lock:
            if is_op and self._interrupt.is_set():
                cancelled = CommandResult("", "error: the operation was cancelled before it started", -1)
                err = auto_errors.create_command_error(cancelled)
                err.command_result = cancelled  # type: ignore[attr-defined]
                raise err
            proc = subprocess.Popen(
                [self.command, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                env=env,
                encoding="utf-8",
                errors="replace",
                start_new_session=True,
            )
            self._running[proc.pid] = (proc, is_op)
        try:
            readers = [
                threading.Thread(target=pump, args=(proc.stdout, on_output, stdout), daemon=True),
                threading.Thread(target=pump, args=(proc.stderr, on_error, stderr), daemon=True),
            ]
            for t in readers:
                t.start()
            for t in readers:
                t.join()
            code = proc.wait()
        finally:
            with self._lock:
                self._running.pop(proc.pid, None)
        result = CommandResult(stdout="\n".join(stdout), stderr="\n".join(stderr), code=code)
        if code != 0:
            err = auto_errors.create_command_error(result)
            err.command_result = result  # type: ignore[attr-defined]
            raise err
        return result
