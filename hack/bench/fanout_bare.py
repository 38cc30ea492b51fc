#!/usr/bin/env python3
"""Fan-out anchor: a bare kubernetes-asyncio loop. List once, then patch each status, 25 at a time.

Usage: fanout_bare.py KUBECONFIG NAMESPACE [WORKERS [pko-client]]   (exits when every status is written)

With ``pko-client`` it uses the operator's ApiClient (``pko.devtools.apiclient``) instead of
kubernetes-asyncio's stock one: the same loop, so the difference to our machinery is the machinery.
"""

from __future__ import annotations

import asyncio
import resource
import sys

from common import GROUP, PLURAL, VERSION, WORKERS, api_client, mark_start, patch_status
from kubernetes_asyncio import client


async def main(kubeconfig: str, namespace: str, workers: int, pko_client: bool) -> None:
    mark_start()
    async with await api_client(kubeconfig, pko_client=pko_client) as api:
        objects = client.CustomObjectsApi(api)
        listed = await objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        items = listed["items"]
        names = iter([o["metadata"]["name"] for o in items if not (o.get("status") or {}).get("observed")])

        async def worker() -> None:
            for name in names:  # one shared iterator: each name goes to exactly one worker
                await patch_status(objects, namespace, name)

        await asyncio.gather(*(worker() for _ in range(workers)))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    # The driver cannot read an exited process's CPU from /proc: report it.
    print(f"CPU {usage.ru_utime + usage.ru_stime:.3f}", flush=True)


if __name__ == "__main__":
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else WORKERS
    asyncio.run(main(sys.argv[1], sys.argv[2], workers, sys.argv[4:5] == ["pko-client"]))
