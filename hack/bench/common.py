"""What the benchmark's driver and its contenders share: the bench CRD, kube clients, RSS, and the
record that goes beside a run's raw JSON.

Contenders run in their own processes (a fresh interpreter each, so one's memory or event loop
never colours another's numbers). Every contender prints ``START <unix time>`` once its imports
are done and before it talks to the apiserver; the driver measures from there.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
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


# --- the record beside a run's raw JSON ------------------------------------------------------------
# A figure means little without when, on what and under what load it was measured: the machine is
# shared, so the load average at start and end is part of the result.


def cpu_model(cpuinfo: str) -> str:
    """The CPU's name from ``/proc/cpuinfo`` text (x86's ``model name``; else ``Processor`` or
    ``cpu model``, as some ARM and MIPS kernels write it); empty if none is given."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model name", "Processor", "cpu model") and value.strip():
            return value.strip()
    return ""


def dirty_paths(porcelain: str) -> list[str]:
    """Tracked paths with uncommitted changes, from ``git status --porcelain=v1`` output (untracked
    files excluded by the caller); a rename lists its new path."""
    return [line[3:].split(" -> ")[-1] for line in porcelain.splitlines() if len(line) > 3]


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else ""


def start_record(benchmark: str, argv: list[str] | None = None) -> dict[str, Any]:
    """What to write beside a run's figures, taken as it starts: the UTC date, the git commit and the
    tracked files changed from it (the tree the run measured), the machine and its load average."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    dirty = dirty_paths(_git("status", "--porcelain=v1", "--untracked-files=no"))
    return {
        "benchmark": benchmark,
        "command": [Path(sys.executable).name, *(sys.argv if argv is None else argv)],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "HEAD").strip(),
        "dirty": bool(dirty),
        "dirty_paths": dirty,
        "machine": {
            "nproc": os.cpu_count() or 0,
            "cpu": cpu_model(cpuinfo) or platform.processor(),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "loadavg_start": list(os.getloadavg()),  # 1, 5 and 15 minutes
    }


def finish_record(record: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """The record with the load average at the end and the run's figures, ready to write."""
    return {**record, "loadavg_end": list(os.getloadavg()), **figures}


def write_record(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")


def table_rows(markdown: str) -> list[dict[str, str]]:
    """The rows of every Markdown table in ``markdown`` as {header: cell}, so the raw JSON holds each
    figure exactly as it was printed."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in markdown.splitlines():
        line = line.strip()
        if not (line.startswith("|") and line.endswith("|")):
            header = None
            continue
        cells = [c.strip() for c in line[1:-1].split("|")]
        if header is None:
            header = cells
        elif not all(set(c) <= set(":-") and c for c in cells):  # not the |---|:-:| line
            rows.append(dict(zip(header, cells, strict=False)))
    return rows


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
    """kubernetes-asyncio's stock ``ApiClient``, or (``pko_client``) the one the operator uses."""
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    if pko_client:
        from pko.machinery.apiclient import new_api_client

        return new_api_client(cfg)
    return client.ApiClient(configuration=cfg)


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
