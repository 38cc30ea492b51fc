"""The URLs the operator's client sends (pko.machinery.kubeclient): built from the host parsed once,
the path as the resource quoted it and the query encoded once per distinct query. A server behind a
path (an apiserver proxied under a prefix, as Rancher serves its clusters) must see that prefix on
every request, and every query value must arrive as it was given."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from pko.machinery.kubeclient import QUERY_MEMORY, ClientConfig, KubeClient
from pko.machinery.resource import CONFIGMAPS, ResourceClient

SELECTOR = "app in (a, b),tier!=web"  # spaces, parentheses, commas, "!", "=": each encoded


@pytest.fixture
async def seen() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A plain HTTP server answering every request with an empty list: its address and the
    requests it received (method, path and query decoded, content type, body)."""
    requests: list[dict[str, Any]] = []

    async def answer(request: web.Request) -> web.Response:
        body = await request.read()
        requests.append(
            {
                "method": request.method,
                "path": request.path,
                "query": list(request.query.items()),
                "content_type": request.headers.get("Content-Type"),
                "body": body,
            }
        )
        return web.json_response({"items": [], "metadata": {"resourceVersion": "7"}})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", requests
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("prefix", ["", "/k8s/clusters/c-1", "/k8s/clusters/c-1/"])
async def test_the_host_path_and_query_reach_the_server(
    seen: tuple[str, list[dict[str, Any]]], prefix: str
) -> None:
    address, requests = seen
    async with KubeClient(ClientConfig(host=address + prefix)) as api:
        client = ResourceClient(api, CONFIGMAPS, "team-a")
        for _ in range(2):  # the second from the remembered query string
            await client.list(label_selector=SELECTOR, limit=50)
        await client.patch("cm", {"data": {"k": "v"}}, field_manager="pko/stack status")
    assert len(requests) == 3
    collection = prefix.rstrip("/") + "/api/v1/namespaces/team-a/configmaps"
    for listed in requests[:2]:
        assert (listed["method"], listed["path"], listed["body"]) == ("GET", collection, b"")
        assert listed["query"] == [("labelSelector", SELECTOR), ("limit", "50")]
    patched = requests[2]
    assert (patched["method"], patched["path"]) == ("PATCH", collection + "/cm")
    assert patched["query"] == [("fieldManager", "pko/stack status")]
    assert patched["content_type"] == "application/merge-patch+json"
    assert json.loads(patched["body"]) == {"data": {"k": "v"}}


def test_the_remembered_query_strings_are_bounded() -> None:
    api = KubeClient(ClientConfig(host="https://127.0.0.1:6443"))
    for version in range(QUERY_MEMORY + 10):  # a watch's query carries its resourceVersion
        url = api.url("/api/v1/pods", [("watch", "true"), ("resourceVersion", str(version))])
        assert url.query == {"watch": "true", "resourceVersion": str(version)}
        assert len(api._queries) <= QUERY_MEMORY
    assert str(api.url("/api/v1/pods")) == "https://127.0.0.1:6443/api/v1/pods"
