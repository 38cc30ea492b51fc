"""The informer cold-sync benchmark (run.py's table 3): N Stack-shaped objects applied as an apiserver
and the operator would leave them, then cached by each contender in a fresh process (informer_mem.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import REPO, STACK_GROUP, STACK_PLURAL, STACK_VERSION, stack_spec, stack_status
from driver import CREATE_CONCURRENCY, bounded

from pko.devtools.localcluster import LocalCluster
from pko.machinery.resource import Resource, ResourceClient

HERE = Path(__file__).resolve().parent


async def apply_stacks(
    api: Any, namespace: str, n: int, spec: Callable[[int], dict[str, Any]] = stack_spec
) -> None:
    from kubernetes_asyncio import client

    objects = client.CustomObjectsApi(api)
    args = (STACK_GROUP, STACK_VERSION, namespace, STACK_PLURAL)

    async def make(i: int) -> None:
        name = f"stack-{i:05d}"
        await objects.patch_namespaced_custom_object(
            *args,
            name,
            spec(i),
            field_manager="kubectl",
            force=True,
            _content_type="application/apply-patch+yaml",
        )
        await objects.patch_namespaced_custom_object_status(
            *args,
            name,
            stack_status(i),
            field_manager="pulumi-kubernetes-operator",
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    await bounded(n, CREATE_CONCURRENCY, make)


def run_informer_mem(cluster: LocalCluster, namespace: str, mode: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(HERE / "informer_mem.py"), str(cluster.kubeconfig), namespace, mode],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def object_sizes(api: Any, namespace: str) -> tuple[float, float]:
    """Mean JSON size of a Stack as served and as cached (transformed), in KB, over a sample."""
    from pko.machinery.informer import strip_managed_fields

    stacks = Resource(STACK_GROUP, STACK_VERSION, STACK_PLURAL, "Stack")
    page = await ResourceClient(api, stacks, namespace).list(limit=50)
    served = [len(json.dumps(o)) for o in page.items]
    cached = [len(json.dumps(strip_managed_fields(o))) for o in page.items]
    return sum(served) / len(served) / 1024, sum(cached) / len(cached) / 1024
