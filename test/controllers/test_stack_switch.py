"""Which Program and Flux statuses name an artifact that is served now (pure): only such a digest
is written into a Workspace under a running Update (:mod:`pko.controllers.stack.switch`)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from pko.controllers.program.artifact import build_artifact
from pko.controllers.program.reconciler import desired_status
from pko.controllers.stack.switch import artifact_served, stale_artifact
from pko.controllers.stack.takeover import merge_fields, take_over_status
from pko.controllers.stack.workspaceobject import ArtifactRevision, GitRevision

Obj = dict[str, Any]
ADDRESS = "pulumi-kubernetes-operator.pulumi-kubernetes-operator.svc.cluster.local"


def program(generation: int = 1) -> Obj:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Program",
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p", "generation": generation},
        "program": {"resources": {"r": {"type": "random:RandomPet"}}},
    }


def go_status(obj: Obj) -> Obj:
    """What the Go operator v2.9.0 records: observedGeneration and the artifact, no conditions."""
    url = f"http://{ADDRESS}/programs/ns/p/1"
    artifact = {"path": "programs/ns/p/1.tar.gz", "url": url, "revision": "1",
                "digest": "sha256:9e9a" + "0" * 60, "size": 300,
                "lastUpdateTime": "2026-11-27T04:00:00Z"}  # fmt: skip
    return {**obj, "status": {"observedGeneration": 1, "artifact": artifact}}


def test_the_go_operators_program_status_is_not_served() -> None:
    assert not artifact_served(go_status(program()))
    assert not artifact_served(program())


def test_pkos_program_status_is_served_for_its_generation_only() -> None:
    obj = program()
    written = {**obj, "status": desired_status(obj, build_artifact(obj), ADDRESS)}
    assert artifact_served(written)
    bumped = copy.deepcopy(written)
    bumped["metadata"]["generation"] = 2  # a new body not packed yet
    assert not artifact_served(bumped)


def test_a_flux_source_is_served_when_ready_for_its_generation() -> None:
    artifact = {"url": "http://source-controller/gitrepository/ns/r/abc.tar.gz", "digest": "sha256:ab"}
    ready = {"type": "Ready", "status": "True", "reason": "Succeeded", "observedGeneration": 3}
    source = {"metadata": {"generation": 3}, "status": {"artifact": artifact, "conditions": [ready]}}
    assert artifact_served(source)
    failing = copy.deepcopy(source)
    failing["status"]["conditions"][0]["status"] = "False"
    assert not artifact_served(failing)


def test_only_an_artifact_workspace_can_be_stale() -> None:
    flux = {"url": "http://a/programs/ns/p/1", "digest": "sha256:go"}
    ws: Obj = {"metadata": {"name": "s"}, "spec": {"flux": flux}}
    served = ArtifactRevision("http://a/programs/ns/p/1", "sha256:pko", "1")
    assert stale_artifact(ws, served, served=True)
    assert not stale_artifact(ws, served, served=False)
    assert not stale_artifact(ws, GitRevision("https://g/r", "abc"), served=True)
    assert not stale_artifact({"metadata": {}, "spec": {"git": {"url": "x"}}}, served, served=True)
    going = {**ws, "metadata": {"name": "s", "deletionTimestamp": "2026-11-27T04:00:00Z"}}
    assert not stale_artifact(going, served, served=True)


# --- the status the Go operator wrote, taken over -------------------------------------------------

GO_ENTRY: Obj = {  # the Go operator's plain status update (no field owner: its User-Agent's name)
    "manager": "manager", "operation": "Update", "apiVersion": "pulumi.com/v1",
    "time": "2026-12-06T17:00:00Z", "fieldsType": "FieldsV1", "subresource": "status",
    "fieldsV1": {"f:status": {"f:currentUpdate": {".": {}, "f:name": {}, "f:commit": {}},
                              "f:conditions": {'k:{"type":"Reconciling"}': {".": {}, "f:message": {}}}}},
}  # fmt: skip
PKO_ENTRY: Obj = {
    "manager": "pulumi-kubernetes-operator/stack-status", "operation": "Apply", "apiVersion": "pulumi.com/v1",
    "time": "2026-12-06T17:01:00Z", "fieldsType": "FieldsV1", "subresource": "status",
    "fieldsV1": {"f:status": {"f:conditions": {'k:{"type":"Ready"}': {".": {}, "f:status": {}}}}},
}  # fmt: skip
SPEC_ENTRY: Obj = {"manager": "kubectl", "operation": "Apply", "apiVersion": "pulumi.com/v1",
                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:stack": {}}}}  # fmt: skip
NOW = datetime(2026, 12, 6, 17, 2, tzinfo=UTC)


def test_the_go_operators_claims_on_the_status_become_pkos() -> None:
    manager = "pulumi-kubernetes-operator/stack-status"
    entries = take_over_status([SPEC_ENTRY, GO_ENTRY, PKO_ENTRY], manager, "pulumi.com/v1", NOW)
    assert entries is not None
    assert entries[0] == SPEC_ENTRY  # the spec's managers are left alone
    (mine,) = [e for e in entries if e.get("subresource") == "status"]
    assert (mine["manager"], mine["operation"], mine["time"]) == (manager, "Apply", "2026-12-06T17:02:00Z")
    status = mine["fieldsV1"]["f:status"]
    assert status["f:currentUpdate"] == {".": {}, "f:name": {}, "f:commit": {}}
    assert status["f:conditions"] == {
        'k:{"type":"Reconciling"}': {".": {}, "f:message": {}},
        'k:{"type":"Ready"}': {".": {}, "f:status": {}},
    }
    # without an apply entry of its own yet, one is made; with no other claim, nothing to do
    made = take_over_status([GO_ENTRY], manager, "pulumi.com/v1", NOW)
    assert made is not None and made[0]["fieldsV1"] == GO_ENTRY["fieldsV1"]
    assert take_over_status([SPEC_ENTRY, PKO_ENTRY], manager, "pulumi.com/v1", NOW) is None


def test_merged_field_sets_keep_every_path_of_both() -> None:
    a = {"f:a": {"f:x": {}}, "f:b": {}}
    b = {"f:a": {"f:y": {}}, "f:c": {".": {}}}
    assert merge_fields(a, b) == {"f:a": {"f:x": {}, "f:y": {}}, "f:b": {}, "f:c": {".": {}}}
    assert a == {"f:a": {"f:x": {}}, "f:b": {}}  # inputs untouched
