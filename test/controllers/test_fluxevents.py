"""Stack Events forwarded to Flux's notification-controller (``--events-address``,
pko.controllers.fluxevents).

Against a real apiserver: the Stack controller with the forwarder as ``register`` wires it, and a
small HTTP receiver on loopback standing in for the notification-controller (it records the JSON
bodies). A Stack that is refused (plain-HTTP git credentials: Stalled at once, a Warning Event,
nothing fetched) has its Event in the apiserver and the same reason, message and involvedObject at
the receiver; with the receiver down the Stack is still reconciled and the failures are counted.
Flux's own side (the Alert, the Provider) is not run here: no notification-controller is built.
The body's shape and the bounded queue: the unit tests first.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from pko.api.stackterms import INSECURE_TRANSPORT_REFUSED
from prometheus_client import CollectorRegistry, Counter
from structlog.testing import capture_logs

from pko.controllers import fluxevents
from pko.controllers.options import ControllerOptions
from pko.controllers.resources import STACKS
from pko.controllers.stack import reconciler as stack_controller
from pko.devtools.operatorharness import new_manager, running
from pko.devtools.waiting import wait_until
from pko.machinery.manager import Manager
from pko.machinery.resource import EVENTS, SECRETS, Obj, ResourceClient
from pko.settings import parse_settings

AT = datetime(2026, 12, 7, 8, 30, 5, 123456, tzinfo=UTC)


def _stack(**status: Any) -> Obj:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": "web", "namespace": "apps", "uid": "u-1", "resourceVersion": "7"},
        "status": status,
    }


def _counter() -> tuple[CollectorRegistry, Counter]:
    registry = CollectorRegistry()
    return registry, Counter("pko_events_forwarded", "test", ["result"], registry=registry)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# --- the body, the queue, the sender ------------------------------------------------------------------


def test_a_warning_about_a_stack_is_an_error_event_with_its_last_commit_as_revision() -> None:
    stack = _stack(lastUpdate={"lastAttemptedCommit": "abc123", "lastSuccessfulCommit": "old"})
    body = fluxevents.flux_event(stack, "Warning", "UpdateFailed", "boom", AT, "pko-0")
    assert body == {
        "involvedObject": {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "name": "web",
            "namespace": "apps",
            "uid": "u-1",
        },
        "severity": "error",
        "timestamp": "2026-12-07T08:30:05Z",
        "message": "boom",
        "reason": "UpdateFailed",
        "metadata": {"pulumi.com/revision": "abc123"},
        "reportingController": "pko",
        "reportingInstance": "pko-0",
    }


def test_a_normal_event_is_info_and_has_no_metadata_without_a_commit() -> None:
    body = fluxevents.flux_event(_stack(), "Normal", "UpdateSucceeded", "ok", AT, "pko-0")
    assert body is not None
    assert body["severity"] == "info"
    assert "metadata" not in body
    with_success = _stack(lastUpdate={"lastSuccessfulCommit": "def456"})
    body = fluxevents.flux_event(with_success, "Normal", "UpdateSucceeded", "ok", AT, "pko-0")
    assert body is not None and body["metadata"] == {"pulumi.com/revision": "def456"}


def test_only_stacks_are_forwarded() -> None:
    workspace = {**_stack(), "apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace"}
    assert fluxevents.flux_event(workspace, "Warning", "X", "y", AT, "pko-0") is None
    other_group = {**_stack(), "apiVersion": "example.com/v1"}
    assert fluxevents.flux_event(other_group, "Warning", "X", "y", AT, "pko-0") is None


def test_a_full_queue_drops_its_oldest_and_counts_the_drop() -> None:
    registry, counter = _counter()
    forwarder = fluxevents.EventForwarder("http://127.0.0.1:1/", counter, instance="i", max_queued=2)
    for reason in ("First", "Second", "Third"):
        forwarder.submit(_stack(), "Normal", reason, "m")
    assert len(forwarder) == 2
    assert [b["reason"] for b in forwarder._queue] == ["Second", "Third"]
    assert registry.get_sample_value("pko_events_forwarded_total", {"result": "dropped"}) == 1


def test_the_setting_reaches_the_controller_options() -> None:
    url = "http://notification-controller.flux-system.svc.cluster.local./"
    assert parse_settings(["--events-address", url], env={}).controller_options().events_address == url
    assert parse_settings([], env={"EVENTS_ADDRESS": url}).controller_options().events_address == url
    assert parse_settings([], env={}).controller_options().events_address is None


async def test_failed_posts_are_counted_each_and_logged_once_per_interval() -> None:
    registry, counter = _counter()
    address = f"http://127.0.0.1:{_closed_port()}/"
    forwarder = fluxevents.EventForwarder(address, counter, instance="i", timeout=2.0, log_interval=3600)
    task = asyncio.create_task(forwarder.run())
    try:
        with capture_logs() as logs:
            for reason in ("A", "B", "C"):
                forwarder.submit(_stack(), "Warning", reason, "m")

            async def all_failed() -> bool:
                return registry.get_sample_value("pko_events_forwarded_total", {"result": "failed"}) == 3

            await wait_until("three failed posts", all_failed, within=10.0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert len(warnings) == 1, logs
    assert warnings[0]["address"] == address and warnings[0]["reason"] == "A"
    assert registry.get_sample_value("pko_events_forwarded_total", {"result": "sent"}) is None


# --- against the apiserver ------------------------------------------------------------------------------


class Receiver:
    """The notification-controller's stand-in: records every JSON body POSTed to ``/``."""

    def __init__(self) -> None:
        self.bodies: list[Obj] = []
        self.url = ""

    async def _post(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        return web.Response(status=202)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Receiver]:
        app = web.Application()
        app.router.add_post("/", self._post)
        runner = web.AppRunner(app, shutdown_timeout=1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/"
        try:
            yield self
        finally:
            await runner.cleanup()

    def about(self, name: str) -> list[Obj]:
        return [b for b in self.bodies if b["involvedObject"]["name"] == name]


@contextlib.asynccontextmanager
async def operator(api_client: Any, namespace: str, address: str) -> AsyncIterator[Manager]:
    """The Stack controller, forwarding to ``address`` as ``pko.controllers.register`` wires it."""
    manager = new_manager(api_client, namespace, shutdown_grace_period=5.0)
    options = ControllerOptions(events_address=address)
    stack_controller.setup(manager, options)
    fluxevents.setup(manager, options.events_address)
    async with running(manager):
        yield manager


async def refused_stack(api_client: Any, namespace: str, name: str) -> None:
    """A Stack the operator refuses before fetching anything: git credentials over plain HTTP
    (test_stack_insecuretransport_cluster.py), to a port nothing listens on."""
    secret = f"{name}-git"
    await ResourceClient(api_client, SECRETS, namespace=namespace).create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret, "namespace": namespace},
            "stringData": {"username": "u", "password": "p"},
        }
    )
    ref = {"type": "Secret", "secret": {"name": secret}}
    await ResourceClient(api_client, STACKS, namespace=namespace).create(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "stack": "dev",
                "projectRepo": f"http://127.0.0.1:{_closed_port()}/repo.git",
                "branch": "main",
                "gitAuth": {
                    "basicAuth": {
                        "userName": {**ref, "secret": {"name": secret, "key": "username"}},
                        "password": {**ref, "secret": {"name": secret, "key": "password"}},
                    }
                },
            },
        }
    )


async def _stalled(api_client: Any, namespace: str, name: str) -> bool:
    obj = await ResourceClient(api_client, STACKS, namespace=namespace).get(name)
    return any(
        c.get("type") == "Stalled" and c.get("reason") == INSECURE_TRANSPORT_REFUSED
        for c in (obj.get("status") or {}).get("conditions") or []
    )


async def test_a_stacks_event_reaches_the_apiserver_and_the_events_address_alike(
    api_client: Any, namespace: str
) -> None:
    name = f"forwarded-{uuid.uuid4().hex[:6]}"
    events = ResourceClient(api_client, EVENTS, namespace=namespace)
    async with Receiver().serving() as receiver, operator(api_client, namespace, receiver.url):
        await refused_stack(api_client, namespace, name)

        async def recorded() -> bool:
            listing = await events.list(field_selector=f"involvedObject.name={name}")
            return bool(listing.items) and bool(receiver.about(name))

        await wait_until(f"{name}: an Event in the apiserver and at the receiver", recorded, within=30.0)
        stack = await ResourceClient(api_client, STACKS, namespace=namespace).get(name)
    listing = await events.list(field_selector=f"involvedObject.name={name}")
    [event] = [e for e in listing.items if e["reason"] == INSECURE_TRANSPORT_REFUSED]
    [body] = [b for b in receiver.about(name) if b["reason"] == INSECURE_TRANSPORT_REFUSED]
    assert event["type"] == "Warning" and body["severity"] == "error"
    assert body["message"] == event["message"]
    assert body["involvedObject"] == {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "name": name,
        "namespace": namespace,
        "uid": stack["metadata"]["uid"],
    }
    assert {k: event["involvedObject"][k] for k in body["involvedObject"]} == body["involvedObject"]
    assert body["reportingController"] == "pko" and body["reportingInstance"]
    assert datetime.strptime(body["timestamp"], "%Y-%m-%dT%H:%M:%SZ")
    assert "metadata" not in body  # refused before any update: no commit to report


async def test_with_the_receiver_down_stacks_are_reconciled_and_failures_counted(
    api_client: Any, namespace: str
) -> None:
    names = [f"unheard-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    address = f"http://127.0.0.1:{_closed_port()}/"
    async with operator(api_client, namespace, address) as manager:
        for name in names:
            await refused_stack(api_client, namespace, name)
        for name in names:
            await wait_until(
                f"{name}: Stalled", lambda n=name: _stalled(api_client, namespace, n), within=30.0
            )

        async def counted() -> bool:
            failed = manager.registry.get_sample_value("pko_events_forwarded_total", {"result": "failed"})
            return (failed or 0) >= len(names)

        await wait_until("a failed forward per Stack", counted, within=30.0)
        assert manager.registry.get_sample_value("pko_events_forwarded_total", {"result": "sent"}) is None
