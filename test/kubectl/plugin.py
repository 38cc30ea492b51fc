"""Running the plugin against the test apiserver: its console-script entry point with a kubeconfig
of its own, and objects created with the statuses the operator writes."""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio.client import ApiClient

from pko.kubectl.__main__ import main
from pko.kubectl.cluster import STACKS, UPDATES, WORKSPACES
from pko.machinery.resource import ResourceClient

Obj = dict[str, Any]
_RESOURCES = {"stacks": STACKS, "updates": UPDATES, "workspaces": WORKSPACES}


@dataclass
class Result:
    code: int
    out: str
    err: str


@dataclass
class Env:
    api: ApiClient
    ns: str
    kubeconfig: Path
    kubelet_logs: dict[tuple[str, bool], str] = field(default_factory=dict)

    async def pko(self, *argv: str, kubeconfig: Path | None = None) -> Result:
        """``kubectl pko ARGV`` run as the console script runs it (its own event loop, in a thread)."""
        out, err = io.StringIO(), io.StringIO()
        args = ["--kubeconfig", str(kubeconfig or self.kubeconfig), *argv]
        code = await asyncio.to_thread(main, args, stdout=out, stderr=err)
        return Result(code, out.getvalue(), err.getvalue())

    def client(self, plural: str) -> ResourceClient:
        return ResourceClient(self.api, _RESOURCES[plural], self.ns)

    async def put(self, plural: str, obj: Obj) -> Obj:
        """Create ``obj`` in the namespace, then write its status as the operator would."""
        body = {k: v for k, v in obj.items() if k != "status"}
        body["metadata"] = {**obj["metadata"], "namespace": self.ns}
        created = await self.client(plural).create(body)
        if obj.get("status") is not None:
            created = await self.client(plural).patch(
                obj["metadata"]["name"], {"status": obj["status"]}, subresource="status"
            )
        return created


def kubeconfig_for(
    source: Path, dest: Path, namespace: str, *, server: str | None = None, token: str | None = None
) -> Path:
    """The test cluster's kubeconfig with contexts ``pko-test`` (current, namespace ``namespace``)
    and ``elsewhere`` (another namespace); ``server``/``token`` replace the cluster's."""
    config = yaml.safe_load(source.read_text())
    cluster, user = config["clusters"][0], config["users"][0]
    if server:
        cluster["cluster"]["server"] = server
    if token:
        user["user"] = {"token": token}
    config["contexts"] = [
        {
            "name": "pko-test",
            "context": {"cluster": cluster["name"], "user": user["name"], "namespace": namespace},
        },
        {
            "name": "elsewhere",
            "context": {"cluster": cluster["name"], "user": user["name"], "namespace": "elsewhere"},
        },
    ]
    config["current-context"] = "pko-test"
    dest.write_text(yaml.safe_dump(config))
    return dest
