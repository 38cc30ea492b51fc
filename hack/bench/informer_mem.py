#!/usr/bin/env python3
"""Cold-sync time and memory of caching every Stack in a namespace, in a fresh process.

Modes:
  ours      SharedInformer with its default transform (managedFields and last-applied dropped)
  ours-raw  SharedInformer keeping objects as the apiserver sends them (no transform)
  bare      one kubernetes-asyncio ``list_namespaced_custom_object``, result kept (the anchor)

Prints one JSON line: mode, objects, seconds (first request to synced), rss_baseline (after imports
and client set-up, before any request), rss_after (after sync and a GC), peak (VmHWM).

Usage: informer_mem.py KUBECONFIG NAMESPACE MODE
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time

from common import STACK_GROUP, STACK_PLURAL, STACK_VERSION, api_client, peak_rss_bytes, rss_bytes
from kubernetes_asyncio import client

from pko.machinery.informer import SharedInformer, strip_managed_fields
from pko.machinery.resource import Resource, ResourceClient

STACKS = Resource(STACK_GROUP, STACK_VERSION, STACK_PLURAL, "Stack")


async def main(kubeconfig: str, namespace: str, mode: str) -> None:
    async with await api_client(kubeconfig) as api:
        gc.collect()
        baseline = rss_bytes()
        start = time.perf_counter()
        if mode == "bare":
            listed = await client.CustomObjectsApi(api).list_namespaced_custom_object(
                STACK_GROUP, STACK_VERSION, namespace, STACK_PLURAL
            )
            count = len(listed["items"])
            seconds = time.perf_counter() - start
        else:
            informer = SharedInformer(
                ResourceClient(api, STACKS, namespace),
                transform=strip_managed_fields if mode == "ours" else None,
            )
            informer.start()
            await informer.wait_for_sync()
            seconds = time.perf_counter() - start
            count = len(informer.indexer)
        gc.collect()
        after = rss_bytes()
        print(
            json.dumps(
                {
                    "mode": mode,
                    "objects": count,
                    "seconds": seconds,
                    "rss_baseline": baseline,
                    "rss_after": after,
                    "peak": peak_rss_bytes(),
                }
            ),
            flush=True,
        )
        if mode != "bare":
            await informer.stop()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
