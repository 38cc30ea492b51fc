#!/usr/bin/env python3
"""Fan-out on our machinery: a Manager with one trivial controller (25 workers) that writes each
object's status once. Same write as the bare loop (``common.patch_status``).

The reconciler is level-triggered like a real one: it reads the object from the informer cache and
does nothing if the status is already written. The primary watch uses ``generation_changed``, as
the Stack controller will, so our own status writes do not enqueue the objects again.

Usage: fanout_ours.py KUBECONFIG NAMESPACE [WORKERS]   (runs until SIGTERM)
With $PKO_BENCH_PROFILE=FILE the run is profiled (cProfile) into FILE.
"""

from __future__ import annotations

import asyncio
import cProfile
import functools
import os
import signal
import sys

from common import GROUP, KIND, PLURAL, VERSION, WORKERS, api_client, mark_start, patch_status
from kubernetes_asyncio import client

from pko.logging import configure_logging
from pko.machinery.controller import Result
from pko.machinery.manager import Manager, ManagerOptions, generation_changed
from pko.machinery.resource import Resource
from pko.machinery.store import split_key

FANOUTS = Resource(GROUP, VERSION, PLURAL, KIND)


async def main(kubeconfig: str, namespace: str, workers: int) -> None:
    mark_start()
    configure_logging("info", "json")  # as the operator runs in a cluster
    async with await api_client(kubeconfig, pko_client=True) as api:  # as pko.__main__ makes it
        objects = client.CustomObjectsApi(api)
        manager = Manager(
            api, ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0", namespace=namespace)
        )
        cache = manager.informer(FANOUTS).indexer

        class StatusWriter:
            async def reconcile(self, key: str) -> Result:
                obj = cache.get_by_key(key)
                if obj is None or (obj.get("status") or {}).get("observed"):
                    return Result.done()
                ns, name = split_key(key)
                await patch_status(objects, ns or namespace, name)
                return Result.done()

        manager.controller("fanout-controller", StatusWriter(), workers=workers).for_(
            FANOUTS, predicate=generation_changed
        )
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, manager.stop)
        loop.add_signal_handler(signal.SIGINT, manager.stop)
        await manager.run()


if __name__ == "__main__":
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else WORKERS
    run = functools.partial(main, sys.argv[1], sys.argv[2], workers)
    profile_to = os.environ.get("PKO_BENCH_PROFILE")  # a file name: cProfile the run, for hunting hot paths
    if profile_to:
        with cProfile.Profile() as profiler:
            asyncio.run(run())
        profiler.dump_stats(profile_to)
    else:
        asyncio.run(run())
