"""The Workspace reconciler end to end: the real operator, apiserver, kube-controller-manager (garbage
collection, the StatefulSet controller) and the play-kubelet running real agents."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pko.controllers.resources import WORKSPACES
from pko.controllers.workspace.workloads import (
    ANNOTATION_INITIALIZED,
    ANNOTATION_REVISION_HASH,
    ANNOTATION_STACKS_HASH,
    revision_hash,
    stacks_hash,
)
from pko.devtools.operatorharness import OperatorEnv
from pko.devtools.playkubelet import KNOWN_IMAGES, create_service_account
from pko.devtools.waiting import wait_until
from pko.machinery.conditions import get_condition
from pko.machinery.kubeclient import KubeClient
from pko.machinery.resource import EVENTS, PODS, SERVICES, STATEFULSETS, ResourceClient

from .conftest import operator_env

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

Obj = dict[str, Any]
SEED = Path(__file__).parents[1] / "data" / "seeds" / "000-my-stack-customized.yaml"
SEED_IMAGE = "example/pulumi-with-dependencies:v3.334"
KUBELET_IMAGES = (*KNOWN_IMAGES, SEED_IMAGE)
LABELS = {"auto.pulumi.com/component": "workspace", "auto.pulumi.com/workspace-name": "my-stack"}
WRITES = ("POST", "PUT", "PATCH", "DELETE")


class Env(OperatorEnv):
    def __post_init__(self) -> None:
        self.workspaces = ResourceClient(self.api, WORKSPACES, self.ns)
        self.statefulsets = ResourceClient(self.api, STATEFULSETS, self.ns)
        self.services = ResourceClient(self.api, SERVICES, self.ns)
        self.pods = ResourceClient(self.api, PODS, self.ns)
        self.events = ResourceClient(self.api, EVENTS, self.ns)

    async def create(self, name: str, spec: Obj) -> Obj:
        body = {
            "apiVersion": WORKSPACES.api_version,
            "kind": "Workspace",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": spec,
        }
        return await self.workspaces.apply(body, field_manager="pko-tests")

    async def get(self, rc: ResourceClient, name: str) -> Obj | None:
        return await rc.get_or_none(name)

    async def seeded(self, name: str) -> Obj:
        """A Workspace of the seed's spec (:func:`seed_spec`) of this test's own, once Ready."""
        await self.create(name, seed_spec())
        return await self.ready(name, "Succeeded", "True", within=180)

    async def until(self, what: str, probe: Callable[[], Awaitable[Any]], within: float = 120.0) -> Any:
        try:
            return await wait_until(what, probe, within=within)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.kubelet.describe()}") from None

    async def ready(self, name: str, reason: str, status: str = "False", within: float = 120.0) -> Obj:
        """The Workspace once its Ready condition has ``status`` and ``reason``."""

        async def probe() -> Obj | None:
            ws = await self.get(self.workspaces, name)
            c = ready_of(ws)
            return ws if c.get("status") == status and c.get("reason") == reason else None

        try:
            result: Obj = await self.until(f"workspace {name} Ready={status}/{reason}", probe, within)
        except AssertionError:
            ws = await self.get(self.workspaces, name)
            raise AssertionError(
                f"workspace {name} status: {(ws or {}).get('status')}\n{self.kubelet.describe()}"
            ) from None
        return result

    async def event_reasons(self, name: str) -> list[str]:
        listing = await self.events.list()
        return [
            e.get("reason", "")
            for e in listing.items
            if (e.get("involvedObject") or {}).get("name") == name
            and (e.get("involvedObject") or {}).get("kind") == "Workspace"
        ]


def ready_of(ws: Obj | None) -> Obj:
    return get_condition(((ws or {}).get("status") or {}).get("conditions"), "Ready") or {}


def stalled_of(ws: Obj | None) -> Obj:
    return get_condition(((ws or {}).get("status") or {}).get("conditions"), "Stalled") or {}


def seed_spec() -> Obj:
    """The seed's customized workspace; ``...`` is a sourceless project (projectInfo) with one stack."""
    spec: Obj = copy.deepcopy(yaml.safe_load(SEED.read_text())["spec"]["workspaceTemplate"]["spec"])
    spec["projectInfo"] = {"name": "my-stack", "runtime": "yaml"}
    spec["stacks"] = [{"name": "dev", "create": True, "config": [{"key": "greeting", "value": "hello"}]}]
    return spec


env = operator_env(Env)


class WriteCounter:
    """Counts the operator's API writes about one Workspace (its objects and Events; instrumentation
    of the operator's own client), so Workspaces of earlier tests still winding down do not count."""

    def __init__(self, api: KubeClient, namespace: str, workspace: str) -> None:
        self.api, self.namespace, self.workspace = api, namespace, workspace
        self.writes: list[str] = []
        self._original = api.call

    def _about(self, path: str, body: Any) -> bool:
        if f"/namespaces/{self.namespace}/" not in path:
            return False
        if f"/{self.workspace}" in path:  # workspaces/<ws>, statefulsets/<ws>-workspace, events/<ws>.<id>
            return True
        involved = (body or {}).get("involvedObject") if isinstance(body, dict) else None
        return bool(involved and involved.get("name") in (self.workspace, f"{self.workspace}-workspace"))

    def __enter__(self) -> WriteCounter:
        original = self._original

        async def counting(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            if method.upper() in WRITES and self._about(path, kwargs.get("body")):
                self.writes.append(f"{method} {path}")
            return await original(method, path, *args, **kwargs)

        self.api.call = counting  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self.api.call = self._original  # type: ignore[method-assign]


@pytest.fixture
def writes(env: Env) -> Iterator[Callable[[str], WriteCounter]]:
    counters: list[WriteCounter] = []

    def make(workspace: str) -> WriteCounter:
        assert env.operator.api is not None
        counter = WriteCounter(env.operator.api, env.ns, workspace).__enter__()
        counters.append(counter)
        return counter

    yield make
    for counter in reversed(counters):
        counter.__exit__()


# --- the seed's customized workspace ---------------------------------------------------------


async def test_seed_customized_workspace(env: Env, writes: Callable[[str], WriteCounter]) -> None:
    spec = seed_spec()
    created = await env.create("my-stack", spec)
    ws = await env.ready("my-stack", "Succeeded", "True", within=180)
    uid = created["metadata"]["uid"]

    sts = await env.statefulsets.get("my-stack-workspace")
    owner = {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Workspace",
        "name": "my-stack",
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert sts["metadata"]["ownerReferences"] == [owner]
    assert sts["metadata"]["labels"] == LABELS
    assert sts["spec"]["selector"] == {"matchLabels": LABELS}
    assert sts["spec"]["serviceName"] == "my-stack-workspace"
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    template = sts["spec"]["template"]
    assert template["metadata"]["labels"] == {**LABELS, "example.com/mylabel": "bar"}
    assert template["metadata"]["annotations"][ANNOTATION_REVISION_HASH] == revision_hash(created["spec"])
    pod = template["spec"]
    assert pod["terminationGracePeriodSeconds"] == 3600
    assert pod["tolerations"] == [{"key": "example.com/foo", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
    }
    assert [c["name"] for c in pod["initContainers"]] == ["bootstrap", "fetch", "extra"]
    assert pod["initContainers"][2]["command"] == ["sh", "-c", "echo 'Hello, extra init container!'"]
    (pulumi,) = pod["containers"]
    assert pulumi["image"] == SEED_IMAGE
    assert [m["name"] for m in pulumi["volumeMounts"]] == ["share", "cache", "oidc-token"]
    assert pulumi["volumeMounts"][2]["mountPath"] == "/var/run/secrets/pulumi"
    assert [v["name"] for v in pod["volumes"]] == ["share", "cache", "oidc-token"]
    for container in [*pod["initContainers"], *pod["containers"]]:
        assert {"name": "PULUMI_ENV", "value": "/share/.env"} in container["env"]

    svc = await env.services.get("my-stack-workspace")
    assert svc["metadata"]["ownerReferences"] == [owner]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == LABELS
    assert [(p["name"], p["port"], p["protocol"]) for p in svc["spec"]["ports"]] == [("grpc", 50051, "TCP")]

    status = ws["status"]
    assert status["observedGeneration"] == ws["metadata"]["generation"]
    assert status["pulumiVersion"]
    pod_ip = env.kubelet.pod_ip(f"{env.ns}/my-stack-workspace-0")
    assert status["address"] == f"{pod_ip}:50051"
    live = await env.pods.get("my-stack-workspace-0")
    assert live["metadata"]["annotations"][ANNOTATION_INITIALIZED] == "true"
    assert "Initialized" in await env.event_reasons("my-stack")

    # Steady state: events that make the operator reconcile (a touched Service and pod) cost no write.
    counter = writes("my-stack")
    await env.services.patch("my-stack-workspace", {"metadata": {"labels": {"touched": "1"}}})
    await env.pods.patch("my-stack-workspace-0", {"metadata": {"labels": {"touched": "1"}}})
    await asyncio.sleep(3)
    assert counter.writes == []


async def test_a_config_change_reaches_the_live_agent_without_a_new_pod(
    env: Env, writes: Callable[[str], WriteCounter]
) -> None:
    """``stacks`` are not in the pod's revision: the running agent gets them again, its stack settings
    file reset first, so a removed key goes as it would from a new pod."""
    ws = await env.seeded("config-change")
    before = await env.pods.get("config-change-workspace-0")
    settings = env.kubelet.pod_dir(f"{env.ns}/config-change-workspace-0")
    assert settings is not None
    settings = settings / "volumes" / "share" / "workspace" / "Pulumi.dev.yaml"
    assert "hello" in settings.read_text()
    counter = writes("config-change")
    stacks = [{"name": "dev", "create": True, "config": [{"key": "farewell", "value": "bye"}]}]
    patched = await env.workspaces.patch("config-change", {"spec": {"stacks": stacks}})
    generation = patched["metadata"]["generation"]
    assert generation > ws["metadata"]["generation"]

    async def reinitialized() -> Obj | None:
        current = await env.get(env.workspaces, "config-change")
        ready = ready_of(current)
        done = ready.get("status") == "True" and ready.get("observedGeneration") == generation
        return current if done else None

    await env.until("Ready for the new stacks", reinitialized, within=120)
    pod = await env.pods.get("config-change-workspace-0")
    assert pod["metadata"]["uid"] == before["metadata"]["uid"]
    assert pod["metadata"]["annotations"][ANNOTATION_STACKS_HASH] == stacks_hash(patched["spec"])
    text = settings.read_text()
    assert "farewell: bye" in text and "greeting" not in text, text
    assert "Reinitialized" in await env.event_reasons("config-change")
    assert not any("statefulsets" in w for w in counter.writes), counter.writes


async def test_spec_change_rolls_the_pod(env: Env) -> None:
    await env.seeded("spec-change")
    before = await env.pods.get("spec-change-workspace-0")
    await env.workspaces.patch("spec-change", {"spec": {"env": [{"name": "ROLL", "value": "1"}]}})

    async def new_pod() -> Obj | None:
        pod = await env.get(env.pods, "spec-change-workspace-0")
        return pod if pod and pod["metadata"]["uid"] != before["metadata"]["uid"] else None

    await env.until("a new pod", new_pod, within=120)
    ws = await env.ready("spec-change", "Succeeded", "True", within=180)
    assert ws["status"]["observedGeneration"] == ws["metadata"]["generation"]
    pod = await env.pods.get("spec-change-workspace-0")
    assert pod["metadata"]["annotations"][ANNOTATION_INITIALIZED] == "true"
    (pulumi,) = pod["spec"]["containers"]
    assert {"name": "ROLL", "value": "1"} in pulumi["env"]


async def test_deletion_cascades(env: Env) -> None:
    await env.create("doomed", {"securityProfile": "baseline", "image": "busybox"})
    await env.until("statefulset", lambda: env.get(env.statefulsets, "doomed-workspace"))
    await env.workspaces.delete("doomed")

    async def gone() -> bool:
        return all(
            [
                await env.get(env.workspaces, "doomed") is None,
                await env.get(env.statefulsets, "doomed-workspace") is None,
                await env.get(env.services, "doomed-workspace") is None,
                await env.get(env.pods, "doomed-workspace-0") is None,
            ]
        )

    await env.until("the workspace and its objects gone", gone, within=120)


# --- profiles ---------------------------------------------------------------------------------


async def test_baseline_profile(env: Env) -> None:
    await env.create(
        "baseline", {"securityProfile": "baseline", "projectInfo": {"name": "p", "runtime": "yaml"}}
    )
    sts = await env.until("statefulset", lambda: env.get(env.statefulsets, "baseline-workspace"))
    pod = sts["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["containers"][0]["image"] == "pulumi/pulumi:latest"
    assert all("securityContext" not in c for c in [*pod["initContainers"], *pod["containers"]])
    await env.ready("baseline", "Succeeded", "True", within=180)
    await env.workspaces.delete("baseline")


# --- the Ready reasons ------------------------------------------------------------------------


async def test_image_pull_failure_then_fix_replaces_the_never_ready_pod(env: Env) -> None:
    spec: Obj = {"image": "nope/missing:1", "projectInfo": {"name": "p", "runtime": "yaml"}}
    await env.create("badimage", spec)
    ws = await env.ready("badimage", "ImagePullFailed")
    message = ready_of(ws)["message"]
    assert 'container "pulumi"' in message and "nope/missing:1" in message
    before = await env.pods.get("badimage-workspace-0")

    await env.workspaces.patch("badimage", {"spec": {"image": "pulumi/pulumi:latest-nonroot"}})
    await env.ready("badimage", "Succeeded", "True", within=180)
    after = await env.pods.get("badimage-workspace-0")
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    await env.workspaces.delete("badimage")


async def test_failing_fetch_reports_its_log_and_stalls(env: Env) -> None:
    spec: Obj = {"git": {"url": "http://127.0.0.1:9/nothing.git", "ref": "main"}}
    await env.create("badgit", spec)
    ws = await env.ready("badgit", "InitContainerFailed", within=60)
    assert 'init container "fetch" failed' in ready_of(ws)["message"]

    async def stalled() -> Obj | None:
        current = await env.get(env.workspaces, "badgit")
        return current if stalled_of(current).get("status") == "True" else None

    ws = await env.until("Stalled", stalled, within=180)
    assert stalled_of(ws)["reason"] == "InitContainerFailed"
    # The last lines of the fetch's output: the agent's one-line error names the source.
    assert "127.0.0.1:9" in stalled_of(ws)["message"]
    await env.workspaces.delete("badgit")


async def test_install_failure_stalls_with_the_cli_message(env: Env) -> None:
    # The stand-in CLI installs only YAML projects: a Python project's `pulumi install` fails.
    await env.create("noinstall", {"projectInfo": {"name": "p", "runtime": "python"}})

    async def stalled() -> Obj | None:
        current = await env.get(env.workspaces, "noinstall")
        return current if stalled_of(current).get("status") == "True" else None

    ws = await env.until("Stalled", stalled, within=180)
    assert (ready_of(ws)["status"], ready_of(ws)["reason"]) == ("False", "InstallationFailed"), ws["status"]
    assert stalled_of(ws)["reason"] == "InstallationFailed"
    assert "installing dependencies failed" in ready_of(ws)["message"]
    assert "InstallationFailure" in await env.event_reasons("noinstall")
    await env.workspaces.delete("noinstall")


async def test_stack_initialization_failure_stalls_with_the_reason(env: Env) -> None:
    spec: Obj = {
        "projectInfo": {"name": "p", "runtime": "yaml"},
        "stacks": [
            {
                "name": "dev",
                "create": True,
                "config": [{"key": "token", "valueFrom": {"path": "/nonexistent/token"}, "secret": True}],
            }
        ],
    }
    await env.create("noinit", spec)

    async def stalled() -> Obj | None:
        current = await env.get(env.workspaces, "noinit")
        return current if stalled_of(current).get("status") == "True" else None

    ws = await env.until("Stalled", stalled, within=180)
    assert (ready_of(ws)["status"], ready_of(ws)["reason"]) == ("False", "InitializationFailed"), ws["status"]
    assert "/nonexistent/token" in ready_of(ws)["message"]
    assert "StackInitializationFailure" in await env.event_reasons("noinit")
    await env.workspaces.delete("noinit")


async def test_unschedulable(env: Env) -> None:
    env.kubelet.unschedulable(f"{env.ns}/pending-workspace-0", "0/1 nodes are available: 1 Insufficient cpu.")
    try:
        await env.create("pending", {"projectInfo": {"name": "p", "runtime": "yaml"}})
        ws = await env.ready("pending", "Unschedulable")
        assert "Insufficient cpu" in ready_of(ws)["message"]
    finally:
        env.kubelet.schedulable(f"{env.ns}/pending-workspace-0")
    await env.workspaces.delete("pending")


async def test_unauthenticated_without_auth_delegator_keeps_the_pod(env: Env) -> None:
    await create_service_account(env.api, env.ns, "no-delegation")
    spec: Obj = {"serviceAccountName": "no-delegation", "projectInfo": {"name": "p", "runtime": "yaml"}}
    await env.create("noauth", spec)
    ws = await env.ready("noauth", "Unauthenticated", within=120)
    assert ready_of(ws)["message"]
    pod = await env.pods.get("noauth-workspace-0")
    assert "deletionTimestamp" not in pod["metadata"]
    assert "ConnectionFailure" in await env.event_reasons("noauth")
    await env.workspaces.delete("noauth")


async def test_invalid_pod_template_is_a_condition_not_a_loop(
    env: Env, writes: Callable[[str], WriteCounter]
) -> None:
    # The CRD accepts a mount of a volume that does not exist; the StatefulSet validation does not.
    bad_mount = {"name": "pulumi", "volumeMounts": [{"name": "missing", "mountPath": "/data"}]}
    spec: Obj = {
        "projectInfo": {"name": "p", "runtime": "yaml"},
        "podTemplate": {"spec": {"containers": [bad_mount]}},
    }
    await env.create("invalid", spec)
    ws = await env.ready("invalid", "SpecInvalid")
    assert "missing" in ready_of(ws)["message"]
    assert stalled_of(ws)["status"] == "True"
    assert await env.get(env.statefulsets, "invalid-workspace") is None
    counter = writes("invalid")
    await asyncio.sleep(4)
    assert counter.writes == []
    # Fixed: it proceeds, and the Stalled condition goes.
    volume = {"name": "missing", "emptyDir": {}}
    await env.workspaces.patch("invalid", {"spec": {"podTemplate": {"spec": {"volumes": [volume]}}}})
    ws = await env.ready("invalid", "Succeeded", "True", within=180)
    assert stalled_of(ws) == {}
    await env.workspaces.delete("invalid")


async def test_immutable_statefulset_field_is_migrated(env: Env) -> None:
    # A StatefulSet as an older operator made it: another serviceName, an immutable field.
    legacy = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": "migrate-workspace",
            "labels": {**LABELS, "auto.pulumi.com/workspace-name": "migrate"},
        },
        "spec": {
            "selector": {"matchLabels": {**LABELS, "auto.pulumi.com/workspace-name": "migrate"}},
            "serviceName": "legacy",
            "replicas": 0,
            "template": {
                "metadata": {"labels": {**LABELS, "auto.pulumi.com/workspace-name": "migrate"}},
                "spec": {"containers": [{"name": "pulumi", "image": "busybox"}]},
            },
        },
    }
    old = await env.statefulsets.create(legacy)
    await env.create("migrate", {"projectInfo": {"name": "p", "runtime": "yaml"}})

    async def migrated() -> Obj | None:
        current = await env.get(env.statefulsets, "migrate-workspace")
        if current is None or current["metadata"]["uid"] == old["metadata"]["uid"]:
            return None
        return current if current["spec"]["serviceName"] == "migrate-workspace" else None

    await env.until("migrated", migrated, within=60)
    await env.until("Migrated event", lambda: _has_event(env, "migrate", "Migrated"), within=30)
    await env.ready("migrate", "Succeeded", "True", within=180)
    await env.workspaces.delete("migrate")


async def _has_event(env: Env, name: str, reason: str) -> bool:
    return reason in await env.event_reasons(name)


async def test_refused_pod_is_reported(env: Env) -> None:
    # The StatefulSet is accepted, its pod is not (no such ServiceAccount): the apiserver's words.
    await env.create(
        "ghostly", {"serviceAccountName": "ghost", "projectInfo": {"name": "p", "runtime": "yaml"}}
    )
    ws = await env.ready("ghostly", "PodCreationFailed")
    assert "ghost" in ready_of(ws)["message"]
    await env.workspaces.delete("ghostly")
