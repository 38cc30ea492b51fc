"""``spec.outputs`` end to end: the real operator (every controller, the shipped RBAC), apiserver,
kube-controller-manager and the play-kubelet running real agents with the stand-in Pulumi CLI.

* a Secret is created after the first successful up (strings as they are, other values JSON, the
  secret output in it), owned by the Stack and labelled with its name; a second up with changed
  outputs updates it in place (same uid); a failed up leaves it as it was; it goes with the Stack;
* a ConfigMap holds the same outputs but the secret one, which it names in an annotation;
* an object of that name the Stack does not own is left alone: the Stack is Ready, and its
  ``OutputsNotWritten`` condition and a Warning Event say what to do; once the object is gone the
  Stack writes its own.

(A pod mounting the Secret is the e2e suite's proof on a real node: e2e/, not here.)
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from pko.controllers.stack import outputs as outputs_module
from pko.devtools.waiting import wait_until
from pko.machinery.conditions import get_condition
from pko.machinery.resource import CONFIGMAPS, SECRETS, ResourceClient

from .conftest import operator_env
from .test_stack import Env

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

Obj = dict[str, Any]


def program(greeting: str, cloud: Path | None = None) -> Obj:
    """A password (a secret output), a greeting, a literal object; with ``cloud``, a ``value``
    read from that file at each refresh (how the outputs change between two ups with the same
    program, in the same workspace pod)."""
    body: Obj = {
        "resources": {
            "pw": {"type": "random:RandomPassword", "properties": {"length": 16}},
            "echo": {"type": "test:index:Echo", "properties": {"value": greeting}},
        },
        "outputs": {
            "greeting": "${echo.value}",
            "password": "${pw.result}",
            "settings": {"replicas": 3, "zones": ["a", "b"]},
        },
    }
    if cloud is not None:
        body["resources"]["thing"] = {"type": "test:index:Drift", "properties": {"path": str(cloud)}}
        body["outputs"]["value"] = "${thing.value}"
    return body


env = operator_env(Env)


def decoded(secret: Obj) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


async def last_update(env: Env, name: str, after: str | None = None, state: str = "succeeded") -> Obj:
    """The Stack once it recorded an Update other than ``after`` that ended ``state``."""

    async def recorded() -> Obj | None:
        stack = await env.get(env.stacks, name)
        last = ((stack or {}).get("status") or {}).get("lastUpdate") or {}
        return stack if last.get("name") not in (None, after) and last.get("state") == state else None

    return await env.stack_until(name, f"{name}: an Update {state} after {after}", recorded, within=240)


async def test_a_secret_is_created_updated_in_place_kept_on_failure_and_goes_with_the_stack(
    env: Env, tmp_path: Path
) -> None:
    secrets = ResourceClient(env.api, SECRETS, env.ns)
    cloud = tmp_path / "cloud-value"
    cloud.write_text("v1")
    await env.create_program("web", program("hello", cloud))
    spec = {"programRef": {"name": "web"}, "refresh": True, "outputs": {"name": "web-outputs"}}
    await env.create_stack("web", spec)
    stack = await env.condition("web", "Ready", "ProcessingCompleted")
    first = stack["status"]["lastUpdate"]["name"]

    secret = await env.get(secrets, "web-outputs")
    assert secret is not None, "no outputs Secret after the first successful up"
    values = decoded(secret)
    assert (values["greeting"], values["value"]) == ("hello", "v1")  # a string as it is, not JSON
    assert json.loads(values["settings"]) == {"replicas": 3, "zones": ["a", "b"]}
    assert len(values["password"]) == 16  # the secret output, in a Secret
    meta = secret["metadata"]
    assert meta["labels"]["pulumi.com/stack-name"] == "web"
    [owner] = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Stack", "web", stack["metadata"]["uid"], True)  # fmt: skip
    assert json.loads(meta["annotations"]["pulumi.com/secrets"]) == ["password"]
    reasons = {e["reason"]: e["message"] for e in await env.events_for("web")}
    assert reasons.get("OutputsWritten") == f"outputs of Update {first} written to Secret web-outputs"

    # a second up with changed outputs (the "cloud" changed; the up refreshes first): the same
    # object, new values
    cloud.write_text("v2")
    await env.stacks.patch("web", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "2"}}})
    stack = await last_update(env, "web", after=first)
    second = stack["status"]["lastUpdate"]["name"]
    assert stack["status"]["outputs"]["value"] == "v2"
    updated = await env.get(secrets, "web-outputs")
    assert updated is not None and updated["metadata"]["uid"] == meta["uid"]
    assert decoded(updated) == {**values, "value": "v2"}

    # a failed up (a target that names no resource) leaves it alone
    cloud.write_text("v3")
    await env.stacks.patch("web", {"spec": {"targets": ["urn:pulumi:dev::web::test:index:Echo::nothing"]}})
    await last_update(env, "web", after=second, state="failed")
    kept = await env.get(secrets, "web-outputs")
    assert kept is not None
    assert kept["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]
    assert decoded(kept)["value"] == "v2"

    # deleted with the Stack (kube-controller-manager's garbage collector, through the ownerReference)
    await env.stacks.delete("web")

    async def collected() -> bool:
        return await env.get(env.stacks, "web") is None and await env.get(secrets, "web-outputs") is None

    await wait_until("the outputs Secret garbage-collected with its Stack", collected, within=180)


async def test_a_configmap_holds_the_outputs_but_the_secret_ones(env: Env) -> None:
    config_maps = ResourceClient(env.api, CONFIGMAPS, env.ns)
    await env.create_program("plain", program("hello"))
    outputs = {"name": "plain-outputs", "kind": "ConfigMap"}
    await env.create_stack("plain", {"programRef": {"name": "plain"}, "outputs": outputs})
    stack = await env.condition("plain", "Ready", "ProcessingCompleted")
    config_map = await env.get(config_maps, "plain-outputs")
    assert config_map is not None
    assert config_map["data"] == {"greeting": "hello", "settings": '{"replicas": 3, "zones": ["a", "b"]}'}
    annotations = config_map["metadata"]["annotations"]
    assert json.loads(annotations["pulumi.com/secret-outputs-omitted"]) == ["password"]
    assert config_map["metadata"]["ownerReferences"][0]["uid"] == stack["metadata"]["uid"]
    secrets = ResourceClient(env.api, SECRETS, env.ns)
    assert await env.get(secrets, "plain-outputs") is None  # no Secret of that name either
    reasons = {e["reason"]: e["message"] for e in await env.events_for("plain")}
    assert reasons.get("OutputsWritten", "").endswith("(secret outputs left out: password)")


async def test_an_object_the_stack_does_not_own_is_left_alone_and_the_stack_says_so(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outputs_module, "OUTPUTS_RECHECK", 3.0)  # the operator runs in this process
    secrets = ResourceClient(env.api, SECRETS, env.ns)
    foreign = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "taken", "namespace": env.ns, "labels": {"owner": "someone-else"}},
        "stringData": {"greeting": "theirs"},
    }
    await secrets.create(foreign)
    before = await secrets.get("taken")
    await env.create_program("squatted", program("hello"))
    await env.create_stack("squatted", {"programRef": {"name": "squatted"}, "outputs": {"name": "taken"}})
    stack = await env.condition("squatted", "OutputsNotWritten", "OutputsObjectNotOwned")
    ready = get_condition(stack["status"]["conditions"], "Ready") or {}
    assert (ready.get("status"), ready.get("reason")) == ("True", "ProcessingCompleted")  # the stack is fine
    message = (get_condition(stack["status"]["conditions"], "OutputsNotWritten") or {})["message"]
    assert "Secret taken exists and is not owned by this Stack" in message, message
    assert "delete or rename that Secret, or set spec.outputs.name to another name" in message
    after = await secrets.get("taken")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert decoded(after) == {"greeting": "theirs"} and not after["metadata"].get("ownerReferences")
    warnings = [e for e in await env.events_for("squatted") if e["reason"] == "OutputsObjectNotOwned"]
    assert [e["type"] for e in warnings] == ["Warning"] and warnings[0]["message"] == message

    # its owner removes it: the Stack writes its own at its next look, and the condition goes
    await secrets.delete("taken")

    async def written() -> Obj | None:
        current = await env.get(env.stacks, "squatted")
        conditions = ((current or {}).get("status") or {}).get("conditions")
        secret = await env.get(secrets, "taken")
        owned = secret is not None and (secret["metadata"].get("ownerReferences") or [{}])[0].get("name")
        return current if get_condition(conditions, "OutputsNotWritten") is None and owned else None

    await env.stack_until("squatted", "the Stack's own outputs Secret written", written, within=60)
    secret = await secrets.get("taken")
    assert decoded(secret)["greeting"] == "hello"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == stack["metadata"]["uid"]
