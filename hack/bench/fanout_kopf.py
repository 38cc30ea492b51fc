#!/usr/bin/env python3
"""Fan-out peer: kopf with a one-line handler that sets the same status field.

Runs in the benchmark's own environment (``.venv-bench``, where kopf is installed; the project
never depends on kopf), so it imports nothing from the project or from ``common``.

Settings: standalone (no peering objects), event posting off (otherwise kopf also creates a
Kubernetes Event per handled object, work the other contenders do not do). Everything else is
kopf's default, including what kopf itself stores per object (its last-handled annotation).

Usage: fanout_kopf.py KUBECONFIG NAMESPACE   (runs until SIGTERM)
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import kopf

GROUP, VERSION, PLURAL = "bench.pko.dev", "v1", "fanouts"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.enabled = False


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # kopf logs in through an installed client library; with none here, read $KUBECONFIG itself.
    return kopf.login_with_kubeconfig(**kwargs)


@kopf.on.create(GROUP, VERSION, PLURAL)
def observe(patch: kopf.Patch, **_: Any) -> None:
    patch.status["observed"] = True


if __name__ == "__main__":
    kubeconfig, namespace = sys.argv[1], sys.argv[2]
    os.environ["KUBECONFIG"] = kubeconfig
    logging.basicConfig(level=logging.WARNING)
    print(f"START {time.time():.6f}", flush=True)
    kopf.run(standalone=True, namespaces=[namespace])
