"""What the benchmark's driver and its contenders share: the bench CRD, kube clients, RSS, Stack-shaped
objects. (The record beside a run's raw JSON is pko.devtools.benchrecord.)

Contenders run in their own processes (a fresh interpreter each, so one's memory or event loop
never colours another's numbers). Every contender prints ``START <unix time>`` once its imports
are done and before it talks to the apiserver; the driver measures from there.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

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


async def api_client(kubeconfig: str, *, pko_client: bool = False) -> Any:
    """kubernetes-asyncio's stock ``ApiClient``, or (``pko_client``) the one the operator uses; either
    can be handed to pko's machinery too (pko.devtools.apiclient)."""
    from kubernetes_asyncio import client, config

    from pko.devtools.apiclient import new_api_client, stock_api_client

    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return new_api_client(cfg) if pko_client else stock_api_client(cfg)


async def patch_status(objects: Any, namespace: str, name: str) -> None:
    """The one write every contender but kopf makes per object: a merge patch of its status."""
    await objects.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        STATUS_BODY,
        _content_type="application/merge-patch+json",
    )


# --- Stack-shaped objects (informer memory benchmark) -----------------------------------------------

STACK_GROUP, STACK_VERSION, STACK_PLURAL = "pulumi.com", "v1", "stacks"


def stack_spec(i: int) -> dict[str, Any]:
    """A Stack spec like the ones platform teams write: git source, env refs, a dozen config keys."""
    team = f"team-{i % 37}"
    return {
        "apiVersion": f"{STACK_GROUP}/{STACK_VERSION}",
        "kind": "Stack",
        "metadata": {
            "name": f"stack-{i:05d}",
            "labels": {
                "app.kubernetes.io/part-of": team,
                "pulumi.com/env": ("prod", "staging", "dev")[i % 3],
            },
            "annotations": {"pulumi.com/owner": f"{team}@example.com"},
        },
        "spec": {
            "stack": f"acmecorp/{team}-service-{i}/production",
            "projectRepo": f"https://github.com/acmecorp/{team}-infrastructure",
            "branch": "refs/heads/main",
            "repoDir": f"services/service-{i}/infra",
            "refresh": True,
            "destroyOnFinalize": False,
            "resyncFrequencySeconds": 600,
            "envRefs": {
                "PULUMI_ACCESS_TOKEN": {
                    "type": "Secret",
                    "secret": {"name": "pulumi-api-secret", "key": "token"},
                },
                "AWS_ACCESS_KEY_ID": {"type": "Secret", "secret": {"name": f"{team}-aws", "key": "id"}},
                "AWS_SECRET_ACCESS_KEY": {
                    "type": "Secret",
                    "secret": {"name": f"{team}-aws", "key": "secret"},
                },
                "AWS_REGION": {"type": "Literal", "literal": {"value": "eu-west-1"}},
            },
            "config": {f"service-{i}:setting{k}": f"value-{k}-{i * 7919 % 100000}" for k in range(12)},
        },
    }


def stack_status(i: int, generation: int = 1) -> dict[str, Any]:
    """The status our Stack controller writes: kstatus conditions, outputs, the last update."""
    when = f"2026-11-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:00Z"
    commit = f"{i * 2654435761 % 2**160:040x}"
    return {
        "apiVersion": f"{STACK_GROUP}/{STACK_VERSION}",
        "kind": "Stack",
        "metadata": {"name": f"stack-{i:05d}"},
        "status": {
            "observedGeneration": generation,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "ProcessingCompleted",
                    "message": "the stack is up to date",
                    "lastTransitionTime": when,
                    "observedGeneration": generation,
                },
                {
                    "type": "Reconciling",
                    "status": "False",
                    "reason": "ProcessingCompleted",
                    "message": "",
                    "lastTransitionTime": when,
                    "observedGeneration": generation,
                },
                {
                    "type": "Stalled",
                    "status": "False",
                    "reason": "ProcessingCompleted",
                    "message": "",
                    "lastTransitionTime": when,
                    "observedGeneration": generation,
                },
            ],
            "outputs": {
                "url": f"https://service-{i}.example.com",
                "bucketName": f"acmecorp-service-{i}-artifacts-{commit[:8]}",
                "clusterEndpoint": f"https://{commit[:12]}.gr7.eu-west-1.eks.amazonaws.com",
                "replicas": i % 5 + 1,
                "subnets": [f"subnet-{commit[k : k + 8]}" for k in range(0, 24, 8)],
            },
            "lastUpdate": {
                "name": f"stack-{i:05d}-{commit[:8]}",
                "type": "up",
                "state": "succeeded",
                "generation": generation,
                "lastAttemptedCommit": commit,
                "lastSuccessfulCommit": commit,
                "lastResyncTime": when,
                "permalink": f"https://app.pulumi.com/acmecorp/service-{i}/production/updates/{i % 300 + 1}",
                "message": "",
                "failures": 0,
            },
        },
    }
