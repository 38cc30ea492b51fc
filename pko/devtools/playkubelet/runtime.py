"""What the play-kubelet's container runtime keeps: each container's state, the process groups it
started (killed when the test process exits), the pods' loopback IPs, and the timestamps it writes."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import random
import signal
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]
log = logging.getLogger("pko.test.kubelet")

AGENT_PORT = 50051

# Every process group this module started, so nothing outlives the test process.
LIVE_GROUPS: set[int] = set()


@atexit.register
def _kill_leftovers() -> None:
    for pgid in list(LIVE_GROUPS):
        killpg(pgid, signal.SIGKILL)


def killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodIPs:
    """Loopback pod IPs: a random second octet per process (parallel test runs rarely meet), never reused,
    skipping any address whose agent port something already holds."""

    def __init__(self) -> None:
        self._second = random.randint(16, 239)
        self._n = 0

    def next(self, port: int = AGENT_PORT) -> str:
        while True:
            self._n += 1
            second = self._second + self._n // 62500
            rest = self._n % 62500
            ip = f"127.{second}.{rest // 250}.{rest % 250 + 1}"
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((ip, port))
                except OSError:
                    continue
            return ip


IP_POOL = PodIPs()


class ConfigError(Exception):
    """A container's configuration cannot be resolved (CreateContainerConfigError)."""


# -- one container's runtime state -----------------------------------------------------------------


@dataclass
class Container:
    spec: Obj
    init: bool
    state: Obj
    image: str
    last_state: Obj = field(default_factory=dict)
    restarts: int = 0
    ready: bool = False
    started: bool = False
    image_id: str = ""
    container_id: str = ""
    proc: asyncio.subprocess.Process | None = None
    attempts: int = 0
    failures: int = 0
    task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def sidecar(self) -> bool:
        return self.init and self.spec.get("restartPolicy") == "Always"

    def status(self) -> Obj:
        out: Obj = {
            "name": self.name,
            "state": self.state,
            "lastState": self.last_state,
            "ready": self.ready,
            "restartCount": self.restarts,
            "image": self.image,
            "imageID": self.image_id,
            "started": self.started,
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out
