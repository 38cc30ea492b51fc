"""Who pko says it is: its User-Agent on every request, a field manager on every write.

The apiserver files a write in ``managedFields`` under its ``fieldManager``, or, when there is none,
under the User-Agent's part before the first ``/``: kubernetes-asyncio's default made that
``OpenAPI-Generator``. Against the real kube-apiserver: the writes pko's machinery makes (a create,
a replace, a finalizer patch, a server-side apply, a status patch and apply, an Event, a Lease) are
filed under the Go operator's manager names only, and a write that names no manager (the generated
API, as a controller bypassing ResourceClient sends it) under pko's product name. A loopback server
shows the header and the query parameters as sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from kubernetes_asyncio import client, config
from prometheus_client import CollectorRegistry
from recordingserver import RecordingServer, recording_server

from pko.controllers.resources import (
    FIELD_MANAGER,
    FIELD_MANAGER_STACK_FINALIZER,
    FIELD_MANAGER_WORKSPACE_STATUS,
)
from pko.devtools.apiclient import OPERATOR_USER_AGENT, new_api_client
from pko.devtools.waiting import wait_until
from pko.machinery.events import EventRecorder
from pko.machinery.leaderelection import LeaderElectionConfig, LeaderElector
from pko.machinery.objects import add_finalizer, remove_finalizer
from pko.machinery.resource import (
    CONFIGMAPS,
    DEFAULT_FIELD_MANAGER,
    EVENTS,
    LEASES,
    SERVICES,
    Obj,
    ResourceClient,
)
from pko.version import OPERATOR_PRODUCT, VERSION, user_agent

STOCK_USER_AGENT_MANAGER = "OpenAPI-Generator"  # kubernetes-asyncio's default, before the first "/"


def _entries(obj: Obj) -> set[tuple[str, str, str]]:
    """(manager, operation, subresource) of each managedFields entry."""
    fields = (obj.get("metadata") or {}).get("managedFields") or []
    return {(e["manager"], e["operation"], e.get("subresource", "")) for e in fields}


def _managers(obj: Obj) -> set[str]:
    return {manager for manager, _, _ in _entries(obj)}


# ----- pure --------------------------------------------------------------------------------------


def test_the_user_agent_names_pko_before_its_first_slash() -> None:
    assert OPERATOR_USER_AGENT.split("/", 1)[0] == OPERATOR_PRODUCT == "pulumi-kubernetes-operator-pko"
    assert OPERATOR_USER_AGENT.startswith(f"{OPERATOR_PRODUCT}/{VERSION} (python/")
    assert "aiohttp/" in OPERATOR_USER_AGENT
    # Not the Go operator's manager: a write that forgot its manager stays recognisable.
    assert OPERATOR_PRODUCT != FIELD_MANAGER
    assert user_agent("pko-agent", "x/1").endswith("; x/1)")
    for bad in ("", "a/b", "a b"):
        with pytest.raises(ValueError):
            user_agent(bad)


def test_the_default_field_manager_is_the_go_operators() -> None:
    assert DEFAULT_FIELD_MANAGER == FIELD_MANAGER == "pulumi-kubernetes-operator"
    with pytest.raises(ValueError):
        ResourceClient(None, CONFIGMAPS, field_manager="")  # type: ignore[arg-type]


# ----- as sent, to a loopback server -------------------------------------------------------------


@pytest.fixture
async def recording() -> AsyncIterator[RecordingServer]:
    async with recording_server(lambda req: (200, {"metadata": {}})) as rec:
        yield rec


async def test_every_request_carries_pkos_user_agent_and_every_write_a_field_manager(
    recording: RecordingServer,
) -> None:
    cfg = client.Configuration(host=f"http://127.0.0.1:{recording.port}")
    async with new_api_client(cfg) as api:
        cms = ResourceClient(api, CONFIGMAPS, "ns")
        await cms.get("a")
        await cms.list()
        await cms.create({"metadata": {"name": "a"}})
        await cms.replace({"metadata": {"name": "a", "namespace": "ns"}})
        await cms.patch("a", {"data": {}})
        await cms.patch("a", {"data": {}}, field_manager=FIELD_MANAGER_STACK_FINALIZER)
        await cms.apply({"metadata": {"name": "a", "namespace": "ns"}}, field_manager=FIELD_MANAGER)
        await client.CoreV1Api(api).read_namespace("ns")  # the generated API, on the same client

    assert [r.headers.get("user-agent") for r in recording.requests] == [OPERATOR_USER_AGENT] * 8
    managers = [
        (r.method, dict(parse_qsl(urlsplit(r.target).query)).get("fieldManager")) for r in recording.requests
    ]
    assert managers == [
        ("GET", None),
        ("GET", None),
        ("POST", FIELD_MANAGER),
        ("PUT", FIELD_MANAGER),
        ("PATCH", FIELD_MANAGER),
        ("PATCH", FIELD_MANAGER_STACK_FINALIZER),
        ("PATCH", FIELD_MANAGER),
        ("GET", None),
    ]


# ----- against the apiserver ---------------------------------------------------------------------


@pytest.fixture
async def pko_api(cluster: Any) -> AsyncIterator[client.ApiClient]:
    """The operator's ApiClient, made as pko/__main__.py makes it."""
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
    async with new_api_client(cfg) as api:
        yield api


async def test_pkos_writes_are_filed_under_its_field_managers(pko_api: Any, namespace: str) -> None:
    cms = ResourceClient(pko_api, CONFIGMAPS, namespace)

    created = await cms.create({"metadata": {"name": "cm"}, "data": {"a": "1"}})
    assert _entries(created) == {(FIELD_MANAGER, "Update", "")}

    finalized = await add_finalizer(cms, created, "example.com/first")
    assert _entries(finalized) == {(FIELD_MANAGER, "Update", "")}
    finalized = await add_finalizer(
        cms, finalized, "example.com/second", field_manager=FIELD_MANAGER_STACK_FINALIZER
    )
    assert _entries(finalized) == {
        (FIELD_MANAGER, "Update", ""),
        (FIELD_MANAGER_STACK_FINALIZER, "Update", ""),
    }

    replaced = await cms.replace({**finalized, "data": {"a": "2"}})
    applied = await cms.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cm", "namespace": namespace},
            "data": {"b": "3"},
        },
        field_manager=FIELD_MANAGER,
    )
    assert _entries(applied) == {
        (FIELD_MANAGER, "Update", ""),
        (FIELD_MANAGER_STACK_FINALIZER, "Update", ""),
        (FIELD_MANAGER, "Apply", ""),
    }
    assert replaced["data"] == {"a": "2"}

    # Finalizers off again (the namespace must be deletable), still under pko's names only.
    current = await cms.get("cm")
    current = await remove_finalizer(
        cms, current, "example.com/second", field_manager=FIELD_MANAGER_STACK_FINALIZER
    )
    current = await remove_finalizer(cms, current, "example.com/first")
    assert _managers(current) <= {FIELD_MANAGER, FIELD_MANAGER_STACK_FINALIZER}

    # A status write, as a merge patch (the client's manager) and as a server-side apply (its own).
    services = ResourceClient(pko_api, SERVICES, namespace)
    await services.create({"metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}})
    patched = await services.patch(
        "svc", {"status": {"conditions": [_condition("Patched")]}}, subresource="status"
    )
    assert (FIELD_MANAGER, "Update", "status") in _entries(patched)
    status_applied = await services.apply_status(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "svc", "namespace": namespace},
            "status": {"conditions": [_condition("Applied")]},
        },
        field_manager=FIELD_MANAGER_WORKSPACE_STATUS,
    )
    assert _entries(status_applied) == {
        (FIELD_MANAGER, "Update", ""),
        (FIELD_MANAGER, "Update", "status"),
        (FIELD_MANAGER_WORKSPACE_STATUS, "Apply", "status"),
    }
    assert [c["type"] for c in status_applied["status"]["conditions"]] == ["Patched", "Applied"]


def _condition(type_: str) -> Obj:
    return {
        "type": type_,
        "status": "True",
        "reason": "Test",
        "message": "",
        "lastTransitionTime": "2026-01-02T03:04:05Z",
    }


async def test_events_and_leases_are_filed_under_the_operators_field_manager(
    pko_api: Any, namespace: str
) -> None:
    cm = await ResourceClient(pko_api, CONFIGMAPS, namespace).create({"metadata": {"name": "about"}})
    recorder = EventRecorder(pko_api, "pulumi-kubernetes-operator", registry=CollectorRegistry())
    recorder.start()
    recorder.event(cm, "Normal", "Said", "once")
    recorder.event(cm, "Normal", "Said", "once")  # the repeat patches the Event's count
    await recorder.stop(drain_timeout=30)
    [event] = (await ResourceClient(pko_api, EVENTS, namespace).list()).items
    assert event["count"] == 2
    assert _entries(event) == {(FIELD_MANAGER, "Update", "")}

    leases = ResourceClient(pko_api, LEASES, namespace)
    started = asyncio.Event()

    async def lead() -> None:
        started.set()
        await asyncio.Event().wait()

    cfg = LeaderElectionConfig("pko-lease", namespace, "me", 3.0, 2.0, 0.5)
    elector = LeaderElector(pko_api, cfg, on_started_leading=lead)
    task = asyncio.create_task(elector.run())
    await asyncio.wait_for(started.wait(), 30)
    acquired = await leases.get("pko-lease")

    async def renewed() -> bool:
        lease = await leases.get("pko-lease")
        return bool(lease["spec"]["renewTime"] != acquired["spec"]["renewTime"])

    await wait_until("the leader renews its lease", renewed)  # a replace
    elector.stop()
    await asyncio.wait_for(task, 30)  # released: another replace
    lease = await leases.get("pko-lease")
    assert lease["spec"].get("holderIdentity") in (None, "")
    assert _entries(lease) == {(FIELD_MANAGER, "Update", "")}


async def test_a_write_without_a_manager_is_filed_under_pkos_user_agent(
    pko_api: Any, api_client: Any, namespace: str
) -> None:
    """What a controller bypassing ResourceClient writes through the generated API (no
    ``field_manager``) is named after the User-Agent: pko's client says pko, a stock one does not."""
    cms = ResourceClient(pko_api, CONFIGMAPS, namespace)
    # With data: an object created with no managed fields at all is never tracked by non-apply writes.
    await cms.create({"metadata": {"name": "bypassed"}, "data": {"a": "1"}})
    body = {"metadata": {"labels": {"by": "generated-api"}}}
    written = await client.CoreV1Api(pko_api).patch_namespaced_config_map("bypassed", namespace, body)
    managers = {e.manager for e in written.metadata.managed_fields}
    assert managers == {FIELD_MANAGER, OPERATOR_PRODUCT}

    # The control: the same write from a stock kubernetes-asyncio client on the fixture's configuration.
    body = {"metadata": {"labels": {"by": "stock-client"}}}
    async with client.ApiClient(configuration=api_client.configuration) as stock:
        written = await client.CoreV1Api(stock).patch_namespaced_config_map("bypassed", namespace, body)
    assert STOCK_USER_AGENT_MANAGER in {e.manager for e in written.metadata.managed_fields}
