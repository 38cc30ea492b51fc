"""The Program controller and its artifact server against a real apiserver.

A Manager runs in-process with only the program controller: the seed Program gets
``status.artifact``, the URL serves bytes with that digest (and the agent's extractor takes
them), a spec change moves the artifact, an invalid body gets a condition without a hot loop, and
a settled Program costs no writes, also after a restart.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client
from multidict import CIMultiDict
from pko.agent.artifact import fetch_artifact

from pko.controllers.options import ControllerOptions
from pko.controllers.program import reconciler as program
from pko.controllers.resources import FIELD_MANAGER_PROGRAM_STATUS, PROGRAMS
from pko.devtools.operatorharness import new_manager
from pko.devtools.waiting import wait_until
from pko.machinery.manager import Manager
from pko.machinery.resource import ResourceClient

SEED = Path(__file__).resolve().parents[1] / "data" / "seeds" / "001-staticwebsite-program.yaml"
Obj = dict[str, Any]


@dataclass
class Operator:
    manager: Manager
    task: asyncio.Task[None]
    programs: ResourceClient
    reconciler: program.ProgramReconciler

    async def address(self) -> tuple[str, int]:
        bound = await self.reconciler.server.wait_serving()
        assert bound is not None
        return bound

    def reconciles(self) -> float:
        total = 0.0
        for result in ("success", "error", "requeue", "requeue_after"):
            value = self.manager.registry.get_sample_value(
                "controller_runtime_reconcile_total", {"controller": "program-controller", "result": result}
            )
            total += value or 0.0
        return total

    async def stop(self) -> None:
        self.manager.stop()
        await asyncio.wait_for(self.task, 30)


async def start_operator(api_client: Any, namespace: str, advertised: str = "") -> Operator:
    manager = new_manager(api_client, namespace)
    # No advertised address: it is derived from the bound one (127.0.0.1:<free port>).
    options = ControllerOptions(program_fs_addr="127.0.0.1:0", program_fs_adv_addr=advertised)
    reconciler = program.setup(manager, options)
    task = asyncio.create_task(manager.run())
    await manager.wait_serving()
    return Operator(manager, task, ResourceClient(api_client, PROGRAMS, namespace), reconciler)


@pytest.fixture(scope="module")
async def operator(api_client: Any, namespace: str) -> AsyncIterator[Operator]:
    op = await start_operator(api_client, namespace)
    try:
        yield op
    finally:
        await op.stop()


def seed(name: str | None = None) -> Obj:
    doc: Obj = next(d for d in yaml.safe_load_all(SEED.read_text()) if d)
    if name:
        doc["metadata"]["name"] = name
    return doc


async def artifact_of(op: Operator, name: str, generation: int) -> Obj:
    async def check() -> Obj | None:
        obj = await op.programs.get(name)
        status = obj.get("status") or {}
        if status.get("observedGeneration") == generation and status.get("artifact"):
            return obj
        return None

    obj: Obj = await wait_until(f"{name} artifact for generation {generation}", check, within=30.0)
    return obj


async def http_get(url: str, method: str = "GET", **headers: str) -> tuple[int, bytes, CIMultiDict[str]]:
    async with aiohttp.ClientSession() as session, session.request(method, url, headers=headers) as resp:
        return resp.status, await resp.read(), CIMultiDict(resp.headers)


async def quiet(op: Operator, name: str, seconds: float = 3.0) -> None:
    """Neither the object nor the reconcile count moves for ``seconds``."""
    before = (await op.programs.get(name))["metadata"]["resourceVersion"]
    count = op.reconciles()
    await asyncio.sleep(seconds)
    assert (await op.programs.get(name))["metadata"]["resourceVersion"] == before, "status was rewritten"
    assert op.reconciles() == count, "reconciled again without a change"


async def test_the_seed_program_gets_an_artifact_the_server_serves(
    operator: Operator, namespace: str
) -> None:
    await operator.programs.create(seed())
    obj = await artifact_of(operator, "staticwebsite", 1)
    art = obj["status"]["artifact"]
    host, port = await operator.address()
    base = f"http://{host}:{port}/programs/{namespace}/staticwebsite"
    assert art["url"] == f"{base}/1"
    assert art["path"] == f"programs/{namespace}/staticwebsite/1.tar.gz"
    assert art["revision"] == "1" and art["digest"].startswith("sha256:") and art["lastUpdateTime"]
    ready = {c["type"]: c for c in obj["status"]["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "ArtifactReady")

    status, body, headers = await http_get(art["url"])
    assert status == 200 and headers["Content-Type"] == "application/gzip"
    assert "sha256:" + hashlib.sha256(body).hexdigest() == art["digest"] and len(body) == art["size"]
    assert (await http_get(f"{base}/1.tar.gz"))[1] == body
    head_status, head_body, head_headers = await http_get(art["url"], "HEAD")
    assert (head_status, head_body, head_headers["Content-Length"]) == (200, b"", str(len(body)))
    assert (await http_get(art["url"], **{"If-None-Match": headers["ETag"]}))[0] == 304
    for missing in (f"{base}/2", f"{base}/1.zip", f"{base}/x", f"{base}", f"{base}/", f"{base}-nope/1"):
        assert (await http_get(missing))[0] == 404, missing
    assert (await http_get(f"http://{host}:{port}/programs/"))[0] == 404
    assert (await http_get(art["url"], "POST"))[0] == 405

    # (1.20's managedFields do not name the subresource; the status fields are ours alone.)
    owners = {
        m["manager"]: m for m in obj["metadata"]["managedFields"] if "f:status" in m.get("fieldsV1", {})
    }
    assert (
        list(owners) == [FIELD_MANAGER_PROGRAM_STATUS]
        and owners[FIELD_MANAGER_PROGRAM_STATUS]["operation"] == "Apply"
    )
    await quiet(operator, "staticwebsite")


async def test_a_spec_change_moves_the_artifact_to_the_new_generation(operator: Operator) -> None:
    await operator.programs.create(seed("moving"))
    first = (await artifact_of(operator, "moving", 1))["status"]["artifact"]
    await operator.programs.patch("moving", {"program": {"outputs": {"extra": "${my-bucket.arn}"}}})
    second = (await artifact_of(operator, "moving", 2))["status"]["artifact"]
    assert second["revision"] == "2" and second["url"].endswith("/moving/2")
    assert second["digest"] != first["digest"]
    assert (await http_get(first["url"]))[0] == 404  # only the current generation is served
    status, body, _ = await http_get(second["url"])
    assert status == 200 and "sha256:" + hashlib.sha256(body).hexdigest() == second["digest"]
    await quiet(operator, "moving")


async def test_an_invalid_program_gets_a_condition_and_no_hot_loop(operator: Operator) -> None:
    bad = seed("invalid")
    bad["program"]["resources"]["my-bucket"]["type"] = "BucketV2"  # no package: not a type token
    bad["program"]["configuration"] = {"region": {}}  # neither type nor default
    await operator.programs.create(bad)

    async def stalled() -> Obj | None:
        obj = await operator.programs.get("invalid")
        conditions = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        return conditions if "Stalled" in conditions else None

    conditions: Obj = await wait_until("Stalled condition", stalled, within=30.0)
    assert (conditions["Stalled"]["status"], conditions["Stalled"]["reason"]) == ("True", "ProgramInvalid")
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "ProgramInvalid")
    message = conditions["Stalled"]["message"]
    assert "program.resources[my-bucket].type" in message and "program.configuration[region]" in message
    obj = await operator.programs.get("invalid")
    assert "artifact" not in obj["status"] and obj["status"]["observedGeneration"] == 1
    host, port = await operator.address()
    url = f"http://{host}:{port}/programs/{obj['metadata']['namespace']}/invalid/1"
    assert (await http_get(url))[0] == 404
    await quiet(operator, "invalid")

    # Fixed: the artifact appears and the Stalled condition goes.
    fixed = copy.deepcopy(obj)
    fixed["program"] = seed()["program"]
    await operator.programs.replace(fixed)
    done = await artifact_of(operator, "invalid", 2)
    types = {c["type"]: c["status"] for c in done["status"]["conditions"]}
    assert types == {"Ready": "True"}


async def test_the_agent_extractor_accepts_the_served_artifact(operator: Operator, tmp_path: Path) -> None:
    await operator.programs.create(seed("fetched"))
    art = (await artifact_of(operator, "fetched", 1))["status"]["artifact"]
    dest = tmp_path / "workspace"
    dest.mkdir()
    # The extractor is synchronous (it runs in the fetch init container): keep the loop serving.
    await asyncio.to_thread(fetch_artifact, art["url"], art["digest"], dest, retries=1)
    assert sorted(p.name for p in dest.iterdir()) == ["Pulumi.yaml"]
    project = yaml.safe_load((dest / "Pulumi.yaml").read_text())
    assert project["name"] == "fetched" and project["runtime"] == "yaml"
    assert project["resources"] == seed()["program"]["resources"]


async def test_a_restarted_operator_serves_the_same_bytes_and_writes_nothing(
    api_client: Any, crds: list[str]
) -> None:
    namespace = f"program-restart-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api_client)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    first = await start_operator(api_client, namespace, advertised="files.example:80")
    try:
        await first.programs.create(seed("restarted"))
        obj = await artifact_of(first, "restarted", 1)
        assert obj["status"]["artifact"]["url"] == f"http://files.example:80/programs/{namespace}/restarted/1"
        await first.stop()
        second = await start_operator(api_client, namespace, advertised="files.example:80")
        try:
            await wait_until(
                "the new operator to reconcile the Program", lambda: _at_least(second, 1), within=30.0
            )
            await asyncio.sleep(1.0)
            assert await second.programs.get("restarted") == obj  # not a single write
            host, port = await second.address()
            status, body, _ = await http_get(f"http://{host}:{port}/programs/{namespace}/restarted/1")
            assert status == 200
            assert "sha256:" + hashlib.sha256(body).hexdigest() == obj["status"]["artifact"]["digest"]
        finally:
            await second.stop()
    finally:
        if not first.task.done():
            await first.stop()
        await core.delete_namespace(namespace)


async def _at_least(op: Operator, count: int) -> bool:
    return op.reconciles() >= count


async def test_programs_active_counts_the_programs(operator: Operator) -> None:
    name = f"counted-{uuid.uuid4().hex[:6]}"
    await operator.programs.create(seed(name))
    total = len((await operator.programs.list()).items)

    async def counted() -> bool:
        return operator.manager.registry.get_sample_value("programs_active") == total

    await wait_until(f"programs_active == {total}", counted, within=30.0)
    await operator.programs.delete(name)

    async def uncounted() -> bool:
        return operator.manager.registry.get_sample_value("programs_active") == total - 1

    await wait_until(f"programs_active == {total - 1}", uncounted, within=30.0)
