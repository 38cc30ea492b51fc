"""Deleting a Stack with ``destroyOnFinalize`` on the real engine, where its state lives on the workspace
pod's own disk (an ``emptyDir``): the destroy runs in the pod that holds the stack, and a destroy that
finds no state, or a stack emptied by a lost pod, never reports success while the resources stay.

Each Stack deploys one ConfigMap through pulumi-kubernetes (as the seed's walkthrough does) with its
file backend on an ``emptyDir`` mounted at ``/state``.

Against either operator (``PKO_E2E_OPERATOR``). The Go operator (v2.9.0) differs in each test, which
asserts what it does (docs/differences.md): its destroy at a Stack's deletion runs in a new pod (a
Workspace of the saved project), whose ``emptyDir`` holds no state, and it creates the stack missing
from the backend (``create: true``) and destroys that empty stack; so the Stack is released while the
ConfigMap its program made stays, owned by nothing. What only pko has (the ``EphemeralBackend``
warning, ``status.resourceCount``, ``StackNotFound``) is asserted for pko alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import OPERATOR, Kube
from .stacks import gone, program, ready, stack

pytestmark = pytest.mark.timeout(1800)


def emptydir_stack(name: str) -> str:
    """The walkthrough's Stack (state at file:///state), with an emptyDir where its claim was."""
    _claim, manifest = stack(name, f"programRef:\n    name: {name}").split("---\n")
    claim = f"persistentVolumeClaim:\n                claimName: {name}-state"
    assert claim in manifest
    return manifest.replace(claim, "emptyDir: {}")


def deploy_on_emptydir(k: Kube, name: str) -> dict[str, Any]:
    k.apply(program(name))
    k.apply(emptydir_stack(name))
    s = ready(k, name)
    assert k.get("configmap", f"{name}-settings") is not None
    return s


def pulumi(k: Kube, name: str, command: str) -> str:
    return k.run("exec", f"{name}-workspace-0", "-c", "pulumi", "--", "sh", "-c",
                 f"cd /share/workspace && {command}")  # fmt: skip


def stalled(k: Kube, name: str, reason: str, within: float = 600) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        s = k.get("stack", name)
        c = k.condition(s, "Stalled")
        return s if c.get("status") == "True" and c.get("reason") == reason else None

    result: dict[str, Any] = k.until(f"stack {name} Stalled {reason}", probe, within)
    return result


def release_by_hand(k: Kube, name: str) -> None:
    k.run("patch", "stack", name, "--type=merge", "-p", '{"metadata":{"finalizers":[]}}')
    gone(k, "stack", name)
    k.run("delete", "configmap", f"{name}-settings", "--ignore-not-found")
    k.run("delete", "program", name)


def released_with_its_configmap_left(k: Kube, name: str) -> None:
    """The Go operator: Stack ``name``, deleted, goes by itself (its destroy succeeded: it releases the
    finalizer only then) though the destroy found nothing to delete: the ConfigMap its program made
    stays, and is removed by hand with the Program."""
    gone(k, "stack", name, within=600)
    assert k.get("configmap", f"{name}-settings") is not None, "the Go operator's destroy deleted it"
    k.run("delete", "configmap", f"{name}-settings")
    k.run("delete", "program", name)


def test_state_on_an_emptydir_is_destroyed_in_the_pod_that_holds_it(kube: Kube) -> None:
    """The issue's scenario: ``kubectl delete stack`` with the state on an emptyDir. The workspace pod
    is not replaced for the destroy (one pod uid, one Workspace generation throughout), the ConfigMap
    Pulumi created is destroyed, and the Stack warned at creation that its state dies with the pod.
    The Go operator destroys in a new pod, whose emptyDir has no state: the Stack goes, the ConfigMap
    stays."""
    k = kube
    s = deploy_on_emptydir(k, "ephemeral")
    if OPERATOR == "pko":
        warning = k.condition(s, "EphemeralBackend")
        assert warning.get("status") == "True", s["status"]["conditions"]
        assert 'emptyDir volume "state"' in warning["message"] and "file:///state" in warning["message"]
        events = k.json("get", "events", "--field-selector", "involvedObject.name=ephemeral")["items"]
        assert any(e["reason"] == "EphemeralBackend" and e["type"] == "Warning" for e in events), events
    else:  # it warns of nothing (docs/differences.md)
        assert k.condition(s, "EphemeralBackend") == {}, s["status"]["conditions"]
    pod = k.get("pod", "ephemeral-workspace-0")
    assert pod is not None

    pods, generations = k.delete_stack_watching("ephemeral")
    if OPERATOR == "pko":
        assert pods == {pod["metadata"]["uid"]}, "the workspace pod was replaced for the destroy"
        assert len(generations) == 1, f"the Workspace was respecified for the destroy: {generations}"
        gone(k, "configmap", "ephemeral-settings")
        k.run("delete", "program", "ephemeral")
    else:  # a Workspace of the saved project: a new pod, an empty emptyDir (docs/differences.md)
        assert pods - {pod["metadata"]["uid"]}, (pods, generations)
        released_with_its_configmap_left(k, "ephemeral")


def test_a_stack_missing_from_its_backend_is_stack_not_found_until_released_by_hand(kube: Kube) -> None:
    """The destroy never creates the stack it should destroy: one removed from its backend ends the
    destroy Update ``StackNotFound``, naming the stack and the backend; the Stack keeps its finalizer,
    Stalled with what it last knew and what to do; removing the finalizer by hand releases it. The Go
    operator creates an empty stack, destroys that and releases the Stack, the ConfigMap left."""
    k = kube
    deploy_on_emptydir(k, "vanished")
    pulumi(k, "vanished", "pulumi stack rm dev --force --yes --preserve-config --non-interactive")
    k.run("delete", "stack", "vanished", "--wait=false")
    if OPERATOR == "go":  # docs/differences.md
        released_with_its_configmap_left(k, "vanished")
        return
    s = stalled(k, "vanished", "StackNotFound")
    message = k.condition(s, "Stalled")["message"]
    assert "stack 'dev' not found in backend file:///state; nothing was destroyed" in message, message
    assert "resource(s)" in message and "outputs greeting, uid" in message, message
    assert "kubectl patch stack vanished -n default" in message, message
    assert s["metadata"]["finalizers"] == ["finalizer.stack.pulumi.com"]
    assert s["status"]["lastUpdate"]["type"] == "destroy" and s["status"]["lastUpdate"]["state"] == "failed"
    update = k.get("update", s["status"]["lastUpdate"]["name"])
    failed = k.condition(update, "Failed")
    assert failed.get("status") == "True" and failed.get("reason") == "StackNotFound", update
    assert k.get("configmap", "vanished-settings") is not None  # nothing claims it was destroyed
    release_by_hand(k, "vanished")


def test_a_stack_emptied_by_a_lost_pod_is_not_reported_destroyed(kube: Kube) -> None:
    """State lost with a replaced pod before the delete: the new pod's stack is empty, so the destroy
    deletes nothing; the Stack says so (StackNotFound) instead of releasing itself. The Go operator
    (which writes no ``status.resourceCount``) releases it, the ConfigMap left."""
    k = kube
    s = deploy_on_emptydir(k, "amnesia")
    if OPERATOR == "pko":
        assert s["status"]["resourceCount"] >= 2, s["status"]  # the stack, its provider, the ConfigMap
    old = k.get("pod", "amnesia-workspace-0")
    assert old is not None
    k.run("delete", "pod", "amnesia-workspace-0")

    def new_pod_initialized() -> bool:
        pod = k.get("pod", "amnesia-workspace-0")
        ws = k.get("workspace", "amnesia")
        return bool(
            pod
            and pod["metadata"]["uid"] != old["metadata"]["uid"]
            and (pod["metadata"].get("annotations") or {}).get("auto.pulumi.com/initialized") == "true"
            and k.condition(ws, "Ready").get("status") == "True"
        )

    k.until("the replacement pod initialized", new_pod_initialized, 300)
    k.run("delete", "stack", "amnesia", "--wait=false")
    if OPERATOR == "go":  # docs/differences.md
        released_with_its_configmap_left(k, "amnesia")
        return
    s = stalled(k, "amnesia", "StackNotFound")
    message = k.condition(s, "Stalled")["message"]
    assert "the destroy deleted nothing" in message and "kubectl patch stack amnesia" in message, message
    assert s["metadata"]["finalizers"] == ["finalizer.stack.pulumi.com"]
    assert k.get("configmap", "amnesia-settings") is not None
    release_by_hand(k, "amnesia")
