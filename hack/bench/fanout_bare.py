#!/usr/bin/env python3
"""Fan-out anchor: a bare kubernetes-asyncio loop. List once, then patch each status, 25 at a time.

Usage: fanout_bare.py KUBECONFIG NAMESPACE [WORKERS]   (exits when every status is written)
"""

from __future__ import annotations

import asyncio
import sys

from common import GROUP, PLURAL, VERSION, WORKERS, api_client, mark_start, patch_status
from kubernetes_asyncio import client


async def main(kubeconfig: str, namespace: str, workers: int) -> None:
    mark_start()
    async with await api_client(kubeconfig) as api:
        objects = client.CustomObjectsApi(api)
        listed = await objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        names = iter([o["metadata"]["name"] for o in listed["items"] if not (o.get("status") or {}).get("observed")])

        async def worker() -> None:
            for name in names:  # one shared iterator: each name goes to exactly one worker
                await patch_status(objects, namespace, name)

        await asyncio.gather(*(worker() for _ in range(workers)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else WORKERS))
