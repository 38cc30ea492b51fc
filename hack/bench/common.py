"""What the benchmark's driver and its contenders share: the bench CRD, kube clients, RSS.

Contenders run in their own processes (a fresh interpreter each, so one's memory or event loop
never colours another's numbers). Every contender prints ``START <unix time>`` once its imports
are done and before it talks to the apiserver; the driver measures from there.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

GROUP, VERSION, PLURAL, KIND = "bench.pko.dev", "v1", "fanouts", "FanOut"
STATUS_BODY: dict[str, Any] = {"status": {"observed": True}}
WORKERS = 25

FANOUT_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "fanout", "kind": KIND, "listKind": f"{KIND}List"},
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


def mark_start() -> None:
    print(f"START {time.time():.6f}", flush=True)


def rss_bytes() -> int:
    """Resident set size now (VmRSS)."""
    return _status_kb("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """Highest resident set size so far (VmHWM)."""
    return _status_kb("VmHWM") * 1024


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


async def api_client(kubeconfig: str) -> Any:
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return client.ApiClient(configuration=cfg)


async def patch_status(objects: Any, namespace: str, name: str) -> None:
    """The one write every contender but kopf makes per object: a merge patch of its status."""
    await objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, STATUS_BODY,
        _content_type="application/merge-patch+json",
    )  # fmt: skip
