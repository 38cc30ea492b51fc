"""The Stack reconciler alone against a real apiserver; the test plays the Workspace and Update controllers.

Only the stack controller runs in the manager: the test writes the Workspace's and the Updates'
status as their controllers would (and a Program's or Flux source's artifact as theirs would), so
each Stack behaviour is driven step by step and checked exactly: what the Stack creates, what it
records, and that it stops writing once it has nothing to do. :class:`Env` holds those moves; the
test_stack_reconciler*.py modules bind ``env = stack_env()``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Final

import pytest

from pko.controllers.resources import PROGRAMS, STACKS, UPDATES, WORKSPACES
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack import reconciler as stack_controller
from pko.controllers.stack.branchpoll import BranchResolver
from pko.controllers.stack.waits import waits_with
from pko.devtools.fluxsource import GITREPOSITORY_CRD
from pko.devtools.operatorharness import new_manager, running
from pko.devtools.waiting import wait_until
from pko.machinery.conditions import format_time
from pko.machinery.kubeclient import ApiException
from pko.machinery.resource import EVENTS, SECRETS, Obj, Resource, ResourceClient, api_error_status

SECRET_RECHECK = 4.0
FAST = RetrySettings(deterministic_base=1.0, deterministic_factor=2.0, transient_base=1.0, transient_cap=2.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Env:
    """The namespace, clients, and the moves the other controllers would make."""

    def __init__(self, api: Any, namespace: str, reconciler: stack_controller.StackReconciler) -> None:
        self.ns = namespace
        self.reconciler = reconciler
        self.stacks = ResourceClient(api, STACKS, namespace=namespace)
        self.workspaces = ResourceClient(api, WORKSPACES, namespace=namespace)
        self.updates = ResourceClient(api, UPDATES, namespace=namespace)
        self.programs = ResourceClient(api, PROGRAMS, namespace=namespace)
        self.secrets = ResourceClient(api, SECRETS, namespace=namespace)

    async def get(self, client: ResourceClient, name: str) -> Obj | None:
        try:
            return await client.get(name, self.ns)
        except Exception as exc:
            if api_error_status(exc) == 404:
                return None
            raise

    async def stack(self, name: str) -> Obj:
        obj = await self.get(self.stacks, name)
        assert obj is not None, name
        return obj

    async def create_stack(self, name: str, spec: Obj, **meta: Any) -> None:
        body = {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": name, "namespace": self.ns, **meta},
            "spec": {"stack": "dev", **spec},
        }
        await self.stacks.create(body)

    async def program(self, name: str, revision: int = 1) -> None:
        if await self.get(self.programs, name) is None:
            await self.programs.create(
                {
                    "apiVersion": "pulumi.com/v1",
                    "kind": "Program",
                    "metadata": {"name": name, "namespace": self.ns},
                    "program": {"outputs": {"x": 1}},
                }
            )
        artifact = {
            "path": f"programs/{self.ns}/{name}/{revision}.tar.gz",
            "url": f"http://artifacts/programs/{self.ns}/{name}/{revision}",
            "revision": str(revision),
            "digest": "sha256:" + f"{revision:064x}",
            "lastUpdateTime": format_time(),
        }
        await self.programs.apply_status(
            {
                "apiVersion": "pulumi.com/v1",
                "kind": "Program",
                "metadata": {"name": name, "namespace": self.ns},
                "status": {"observedGeneration": 1, "artifact": artifact},
            },
            field_manager="test-program",
        )

    async def workspace(self, name: str) -> Obj:
        found: list[Obj] = []

        async def exists() -> bool:
            ws = await self.get(self.workspaces, name)
            if ws is not None:
                found[:] = [ws]
            return ws is not None

        await wait_until(f"workspace {name}", exists, within=30.0)
        return found[0]

    async def make_ready(
        self, name: str, *, stalled: tuple[str, str] | None = None, newer_than: int | None = None
    ) -> Obj:
        """Mark the Workspace Ready (or Stalled) for its generation (once it is above ``newer_than``)."""
        ws = await self.workspace(name)
        if newer_than is not None:

            async def changed() -> bool:
                ws.update(await self.workspace(name))
                return int(ws["metadata"]["generation"]) > newer_than

            await wait_until(f"workspace {name} respecified", changed, within=30.0)
        if stalled is None:
            conditions = [self._cond("Ready", "True", "Succeeded", "")]
        else:
            conditions = [
                self._cond("Ready", "False", stalled[0], stalled[1]),
                self._cond("Stalled", "True", stalled[0], stalled[1]),
            ]
        return await self.workspaces.apply_status(
            {
                "apiVersion": "auto.pulumi.com/v1alpha1",
                "kind": "Workspace",
                "metadata": {"name": name, "namespace": self.ns},
                "status": {"observedGeneration": ws["metadata"]["generation"], "conditions": conditions},
            },
            field_manager="test-workspace",
        )

    @staticmethod
    def _cond(type_: str, status: str, reason: str, message: str) -> Obj:
        return {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": format_time(),
        }

    async def updates_of(self, stack: str) -> list[Obj]:
        listed = await self.updates.list(label_selector=f"pulumi.com/stack-name={stack}")
        return sorted(listed.items, key=lambda u: str(u["metadata"]["name"]))

    async def next_update(self, stack: str, seen: set[str], within: float = 30.0) -> Obj:
        found: list[Obj] = []

        async def new() -> bool:
            fresh = [u for u in await self.updates_of(stack) if u["metadata"]["name"] not in seen]
            found[:] = fresh
            return bool(fresh)

        await wait_until(f"a new Update of {stack}", new, within=within)
        assert len(found) == 1, [u["metadata"]["name"] for u in found]
        seen.add(found[0]["metadata"]["name"])
        return found[0]

    async def complete(
        self,
        update: Obj,
        *,
        failed: str | None = None,
        message: str = "",
        outputs: dict[str, Any] | None = None,
        secret_keys: list[str] | None = None,
        project: tuple[str, str] | None = ("proj", "yaml"),
        changes: dict[str, int] | None = None,
    ) -> None:
        name = update["metadata"]["name"]
        status: Obj = {"observedGeneration": update["metadata"]["generation"], "message": message}
        if changes is not None:
            status["resourceChanges"] = changes
        if outputs is not None:
            secret = f"{name}-stack-outputs"
            await self.secrets.create(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": secret,
                        "namespace": self.ns,
                        "annotations": {"pulumi.com/secrets": json.dumps(sorted(secret_keys or []))},
                    },
                    "data": {
                        k: base64.b64encode(json.dumps(v).encode()).decode() for k, v in outputs.items()
                    },
                    "immutable": True,
                }
            )
            status["outputs"] = secret
        if project is not None:
            status["projectInfo"] = {"name": project[0], "runtime": project[1]}
        status["permalink"] = f"https://app.example.com/{name}"
        status["conditions"] = [
            self._cond("Progressing", "False", "Complete", ""),
            self._cond("Complete", "True", "Updated", ""),
            self._cond("Failed", "True", failed, message)
            if failed
            else self._cond("Failed", "False", "UpdateSucceeded", ""),
        ]
        await self.updates.apply_status(
            {
                "apiVersion": "auto.pulumi.com/v1alpha1",
                "kind": "Update",
                "metadata": {"name": name, "namespace": self.ns},
                "status": status,
            },
            field_manager="test-update",
        )

    async def conditions(self, name: str) -> dict[str, tuple[str, str, str]]:
        obj = await self.stack(name)
        return {
            c["type"]: (c["status"], c["reason"], c["message"])
            for c in (obj.get("status") or {}).get("conditions") or []
        }

    async def wait_condition(
        self, name: str, type_: str, reason: str, within: float = 30.0
    ) -> dict[str, tuple[str, str, str]]:
        seen: list[dict[str, tuple[str, str, str]]] = [{}]

        async def holds() -> bool:
            seen[0] = await self.conditions(name)
            got = seen[0].get(type_)
            return got is not None and got[0] == "True" and got[1] == reason

        try:
            await wait_until(f"{name}: {type_}={reason}", holds, within=within)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; conditions: {seen[0]}") from None
        return seen[0]

    def reconciles(self) -> float:
        registry = self.reconciler.manager.registry
        return sum(
            registry.get_sample_value(
                "controller_runtime_reconcile_total", {"controller": "stack-controller", "result": result}
            )
            or 0.0
            for result in ("success", "error", "requeue", "requeue_after")
        )

    async def events_of(self, name: str) -> list[str]:
        """The reasons of the Events about ``name`` (one per Event object)."""
        listing = await ResourceClient(self.stacks.api, EVENTS, self.ns).list(
            field_selector=f"involvedObject.name={name}"
        )
        return [str(e.get("reason")) for e in listing.items]

    async def quiet(self, name: str, seconds: float = 3.0) -> None:
        """No writes to the Stack for ``seconds`` (no hot loop)."""
        before = (await self.stack(name))["metadata"]["resourceVersion"]
        await asyncio.sleep(seconds)
        after = (await self.stack(name))["metadata"]["resourceVersion"]
        assert before == after, f"{name} was written while idle"


def stack_env() -> Any:
    """A module-scoped ``env`` fixture: the stack controller alone in a Manager of the module's
    namespace, with this module's fast retries, a fake clock for branch polls and SECRET_RECHECK.

    Bind it in the module: ``env = stack_env()``.
    """

    @pytest.fixture(scope="module", name="env")
    async def env(api_client: Any, namespace: str) -> AsyncIterator[Env]:
        manager = new_manager(
            api_client,
            namespace,
            discovery_interval=2.0,
            optional_sync_timeout=10.0,
            shutdown_grace_period=5.0,
        )
        clock = FakeClock()
        reconciler = stack_controller.setup(
            manager,
            retry=FAST,
            branches=BranchResolver(clock=clock),
            waits=waits_with(secret_recheck=SECRET_RECHECK),
        )
        reconciler.clock = clock  # type: ignore[attr-defined]
        async with running(manager):
            yield Env(api_client, namespace, reconciler)

    return env


# Flux's GitRepository (test_stack_reconciler_sources.py and test_stack.py install its CRD).
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
GITREPOSITORIES = Resource("source.toolkit.fluxcd.io", "v1", "gitrepositories", "GitRepository")
FLUX_CRD: Obj = GITREPOSITORY_CRD  # the CRD alone: no source-controller runs here

# A source's Ready condition (status, reason, message) once source-controller stored an artifact.
STORED: Final = ("True", "Succeeded", "stored artifact")


async def serve_flux_crd(crds: ResourceClient, sources: ResourceClient) -> None:
    """Install the GitRepository CRD and wait until it is served (another module may have just
    deleted it: that deletion ends first)."""
    name = FLUX_CRD["metadata"]["name"]

    async def not_terminating() -> bool:
        try:
            found = await crds.get(name)
        except ApiException as exc:
            return exc.status == 404
        return not found["metadata"].get("deletionTimestamp")

    await wait_until("the Flux CRD not terminating", not_terminating, within=120.0)
    await crds.apply(FLUX_CRD, field_manager="test")

    async def served() -> bool:
        try:
            await sources.list()
        except Exception:
            return False
        return True

    await wait_until("the GitRepository CRD served", served, within=30.0)


async def remove_flux_crd(crds: ResourceClient) -> None:
    """Delete the GitRepository CRD and wait until it is gone: a CRD is deleted asynchronously, and a
    module after this one on the same apiserver may rely on Flux's kind not being served."""
    name = FLUX_CRD["metadata"]["name"]
    with contextlib.suppress(ApiException):
        await crds.delete(name)

    async def gone() -> bool:
        try:
            await crds.get(name)
        except ApiException as exc:
            return exc.status == 404
        return False

    await wait_until("the Flux CRD removed", gone, within=120.0)


async def create_source(sources: ResourceClient, name: str) -> None:
    """A GitRepository ``name`` in ``sources``' namespace, with no status (no source-controller runs)."""
    meta = {"name": name, "namespace": sources.namespace}
    body = {"apiVersion": GITREPOSITORIES.api_version, "kind": "GitRepository", "metadata": meta}
    await sources.create({**body, "spec": {"url": f"https://e/{name}"}})


def source_artifact_url(namespace: str, name: str, revision: str) -> str:
    """Where source-controller would serve ``name``'s artifact of ``revision`` (nothing serves it here)."""
    return f"http://source-controller/gitrepository/{namespace}/{name}/{revision}.tar.gz"


async def write_source_status(
    sources: ResourceClient, name: str, revision: str | None, ready: tuple[str, str, str] = STORED
) -> None:
    """Write GitRepository ``name``'s status as source-controller would: its Ready condition
    (``ready``) and, for a ``revision``, the artifact (digest ``sha256:<revision * 16>``)."""
    condition = {"type": "Ready", "status": ready[0], "reason": ready[1], "message": ready[2]}
    status: Obj = {"conditions": [{**condition, "lastTransitionTime": format_time()}]}
    if revision is not None:
        status["artifact"] = {
            "url": source_artifact_url(str(sources.namespace), name, revision),
            "digest": f"sha256:{revision * 16}",
            "revision": f"main@sha1:{revision}",
            "lastUpdateTime": format_time(),
        }
    meta = {"name": name, "namespace": sources.namespace}
    body = {"apiVersion": GITREPOSITORIES.api_version, "kind": "GitRepository", "metadata": meta}
    await sources.apply_status({**body, "status": status}, field_manager="source-controller")
