"""peerscale.py's request accounting: the apiserver's request counters scraped, what this script sent
itself (kubectl at ``-v=6``, the Stack watch's LISTs), and the idle background they are measured against."""

from __future__ import annotations

import asyncio
import re
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import procstats
from node import KUBECONFIG
from peer import kubectl
from peerscale_operator import OperatorPod
from procstats import Requests, Tally

Obj = dict[str, Any]
SETTLE = 10.0  # after an install, before the background is measured
KLOG_INFO = re.compile(r"[IW]\d{4} ")  # kubectl's -v log lines, not its errors


# --- what this script sends ----------------------------------------------------------------------


class Sent:
    """The requests this script sent in measured windows: kubectl at ``-v=6`` (read from its log) and
    the Stack watch's LISTs. Thread-safe: kubectl calls run in threads while the watch reads events."""

    def __init__(self) -> None:
        self._tally: Tally = {}
        self._lock = threading.Lock()

    def add(self, tally: Tally) -> None:
        with self._lock:
            self._tally = procstats.add(self._tally, tally)

    def snapshot(self) -> Tally:
        with self._lock:
            return dict(self._tally)

    def since(self, before: Tally) -> Tally:
        return procstats.sub(self.snapshot(), before)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 600) -> str:
        """peer.kubectl, counted."""
        done = subprocess.run(
            ["kubectl", f"--kubeconfig={KUBECONFIG}", "-v=6", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        self.add(procstats.kubectl_tally(done.stderr))
        if check and done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if not KLOG_INFO.match(line)]
            raise RuntimeError(f"kubectl {' '.join(args)}: {' '.join(errors)[-2000:]}")
        return done.stdout


SENT = Sent()


@dataclass(frozen=True)
class Scrape:
    at: float
    tally: Tally


def scrape() -> Scrape:
    """The apiserver's request counters now (``/metrics`` is not among them)."""
    text = kubectl("get", "--raw", "/metrics")
    return Scrape(time.time(), procstats.parse_request_totals(text))


def caused(before: Scrape, after: Scrape, sent_before: Tally) -> Tally:
    """What the apiserver served between two scrapes, less what this script sent meanwhile."""
    return procstats.sub(procstats.sub(after.tally, before.tally), SENT.since(sent_before))


# --- the idle background -------------------------------------------------------------------------


@dataclass(frozen=True)
class Background:
    per_second: Tally  # requests per second by group, the operator idle with no Stacks
    cpu: float  # the idle operator's CPU, seconds per second


async def background(pod: OperatorPod, seconds: float) -> Background:
    await asyncio.sleep(SETTLE)
    before, cpu0, sent0 = scrape(), pod.cpu_seconds(), SENT.snapshot()
    await asyncio.sleep(seconds)
    after, cpu1 = scrape(), pod.cpu_seconds()
    span = after.at - before.at
    return Background(procstats.scaled(caused(before, after, sent0), 1 / span), (cpu1 - cpu0) / span)


def per_minute(tally: Tally, seconds: float, groups: Iterable[str] | None = None) -> Requests:
    return procstats.total(tally, groups).scaled(60 / seconds)
