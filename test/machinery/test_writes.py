"""The two write rules (pko.machinery.writes) against a real apiserver: a status is written only if
it changed (and, preconditioned, fails on a stale read); an object is applied only if its digest
changed, or if someone else changed its spec since this process applied it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from pko.devtools.waiting import wait_until
from pko.machinery.informer import SharedInformer
from pko.machinery.resource import Obj, Resource, ResourceClient, api_error_status
from pko.machinery.writes import ANNOTATION_APPLIED_DIGEST, DigestApplier, StatusWriter, digest, stamp

UPDATES = Resource("auto.pulumi.com", "v1alpha1", "updates", "Update")
FIELDS = ("observedGeneration", "message")


def update(namespace: str, name: str, workspace: str = "ws") -> Obj:
    return {
        "apiVersion": UPDATES.api_version,
        "kind": UPDATES.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"workspaceName": workspace, "type": "up"},
    }


@pytest.fixture
async def informer(api_client: Any, crds: list[str], namespace: str) -> AsyncIterator[SharedInformer]:
    informer = SharedInformer(ResourceClient(api_client, UPDATES, namespace))
    informer.start()
    assert await informer.wait_for_sync(30)
    yield informer
    await informer.stop()


def test_the_digest_ignores_its_own_annotation_and_key_order() -> None:
    a = {"metadata": {"name": "x"}, "spec": {"a": 1, "b": [1, 2]}}
    b = {"spec": {"b": [1, 2], "a": 1}, "metadata": {"name": "x"}}
    assert digest(a) == digest(b) == digest(stamp(dict(a)))
    assert digest(a) != digest({**a, "spec": {"a": 1, "b": [2, 1]}})


async def test_a_status_is_written_only_when_it_changed(informer: SharedInformer, namespace: str) -> None:
    client = informer.client
    created = await client.create(update(namespace, "u1"))
    writer = StatusWriter(informer, "pko/test-status", FIELDS)
    written = await writer.write(created, {"message": "one", "observedGeneration": 1, "other": "x"})
    assert written is not None and written["status"] == {"message": "one", "observedGeneration": 1}
    key = f"{namespace}/u1"
    # Read-your-writes: the informer answers with the write until its watch delivers it.
    latest = informer.latest(key)
    assert latest is not None and latest["status"]["message"] == "one"
    assert "managedFields" not in latest["metadata"]  # shaped as the cache keeps objects
    # The same status again (None-valued fields are unset ones): no request at all.
    assert await writer.write(latest, {"message": "one", "observedGeneration": 1, "endTime": None}) is None
    await wait_until("the watch", lambda: (informer.indexer.get_by_key(key) or {}).get("status") is not None)
    assert not informer.writes  # the watch caught up: the write is forgotten
    stored = await client.get("u1")
    assert stored["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]


async def test_a_preconditioned_status_write_from_a_stale_read_conflicts(
    informer: SharedInformer, namespace: str
) -> None:
    client = informer.client
    stale = await client.create(update(namespace, "u2"))
    writer = StatusWriter(informer, "pko/test-status", FIELDS)
    assert await writer.write(stale, {"message": "first"}, precondition=True) is not None
    with pytest.raises(ApiException) as raised:
        await writer.write(stale, {"message": "second"}, precondition=True)
    assert api_error_status(raised.value) == 409
    # Without the precondition the last writer wins.
    assert (await writer.write(stale, {"message": "second"}))["status"]["message"] == "second"  # type: ignore[index]


async def test_an_object_is_applied_only_when_its_digest_or_someone_else_changed_it(
    informer: SharedInformer, namespace: str
) -> None:
    applier = DigestApplier(informer, "pko/test-apply", force=True)
    body = stamp(update(namespace, "u3"))
    first, applied = await applier.ensure(body)
    assert applied and first["metadata"]["annotations"][ANNOTATION_APPLIED_DIGEST] == digest(body)
    # (An object the cache has not seen yet is applied again: a missing one may have been deleted.)
    await wait_until("the cache", lambda: informer.indexer.get_by_key(f"{namespace}/u3") is not None)
    again, applied = await applier.ensure(stamp(update(namespace, "u3")))
    assert not applied and again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]

    # Another digest: applied.
    changed, applied = await applier.ensure(stamp(update(namespace, "u3", workspace="other")))
    assert applied and changed["spec"]["workspaceName"] == "other"
    assert changed["metadata"]["generation"] == first["metadata"]["generation"] + 1

    # Someone else edits the spec (the digest annotation stays): the generation moved, so the
    # same body is applied again and restores it.
    edited = await informer.client.patch("u3", {"spec": {"workspaceName": "edited"}})
    await wait_until(
        "the edit in the cache",
        lambda: (
            (informer.indexer.get_by_key(f"{namespace}/u3") or {}).get("metadata", {}).get("generation")
            == edited["metadata"]["generation"]
        ),
    )
    restored, applied = await applier.ensure(stamp(update(namespace, "u3", workspace="other")))
    assert applied and restored["spec"]["workspaceName"] == "other"

    # A new process (no memory) trusts the digest on the object: nothing to apply.
    fresh = DigestApplier(informer, "pko/test-apply")
    assert not fresh.needed(stamp(update(namespace, "u3", workspace="other")), restored)
    assert fresh.needed(stamp(update(namespace, "u3", workspace="third")), restored)
