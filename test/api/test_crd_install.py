"""The generated CRDs on a real kube-apiserver: they install (with server-side and client-side
apply), and keep every field we send."""

from __future__ import annotations

import copy
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from pko.devtools.kubectl import kubectl

from .manifests import (
    full_program,
    full_program_status,
    full_stack,
    full_stack_status,
    full_update,
    full_update_status,
    full_workspace,
    full_workspace_status,
    stack_variants,
)

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
MERGE = "application/merge-patch+json"
CRD_NAMES = [
    "programs.pulumi.com",
    "stacks.pulumi.com",
    "updates.auto.pulumi.com",
    "workspaces.auto.pulumi.com",
    "workspacetemplates.auto.pulumi.com",
]


def split(api_version: str) -> tuple[str, str]:
    group, version = api_version.split("/")
    return group, version


PLURALS = {"Stack": "stacks", "Program": "programs", "Workspace": "workspaces", "Update": "updates"}


async def create(api_client: Any, obj: dict[str, Any]) -> dict[str, Any]:
    group, version = split(obj["apiVersion"])
    api = client.CustomObjectsApi(api_client)
    ns = obj["metadata"]["namespace"]
    created: dict[str, Any] = await api.create_namespaced_custom_object(
        group, version, ns, PLURALS[obj["kind"]], obj
    )
    return created


async def set_status(api_client: Any, obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    group, version = split(obj["apiVersion"])
    api = client.CustomObjectsApi(api_client)
    meta = obj["metadata"]
    patched: dict[str, Any] = await api.patch_namespaced_custom_object_status(
        group,
        version,
        meta["namespace"],
        PLURALS[obj["kind"]],
        meta["name"],
        {"status": status},
        _content_type=MERGE,
    )
    return patched


async def get(api_client: Any, obj: dict[str, Any], version: str | None = None) -> dict[str, Any]:
    group, stored = split(obj["apiVersion"])
    api = client.CustomObjectsApi(api_client)
    meta = obj["metadata"]
    got: dict[str, Any] = await api.get_namespaced_custom_object(
        group, version or stored, meta["namespace"], PLURALS[obj["kind"]], meta["name"]
    )
    return got


async def test_every_crd_is_established(api_client: Any, crds: list[str]) -> None:
    assert sorted(crds) == CRD_NAMES
    ext = client.ApiextensionsV1Api(api_client)
    for name in CRD_NAMES:
        crd = await ext.read_custom_resource_definition(name)
        conditions = {c.type: c.status for c in crd.status.conditions}
        assert conditions.get("Established") == "True", name
        assert conditions.get("NamesAccepted") == "True", name


def _stack_variant(variant: str) -> Any:
    return lambda name, namespace: stack_variants(name, namespace)[variant]


@pytest.mark.parametrize(
    ("make", "make_status", "body"),
    [
        *(
            (_stack_variant(variant), full_stack_status, "spec")
            for variant in ("git-commit", "git-branch", "flux", "program")
        ),
        (full_workspace, full_workspace_status, "spec"),
        (full_update, full_update_status, "spec"),
        (full_program, full_program_status, "program"),
    ],
    ids=[
        "Stack-git-commit",
        "Stack-git-branch",
        "Stack-flux",
        "Stack-program",
        "Workspace",
        "Update",
        "Program",
    ],
)
async def test_full_object_round_trips_unpruned(
    api_client: Any, namespace: str, make: Any, make_status: Any, body: str
) -> None:
    obj = make(name=f"full-{uuid.uuid4().hex[:6]}", namespace=namespace)
    sent = copy.deepcopy(obj)
    created = await create(api_client, obj)
    assert created[body] == sent[body]
    status = make_status()
    patched = await set_status(api_client, obj, status)
    assert patched["status"] == status
    stored = await get(api_client, obj)
    assert stored[body] == sent[body] and stored["status"] == status
    assert stored["metadata"].get("labels") == sent["metadata"].get("labels")


async def test_stack_is_served_as_legacy_v1alpha1_too(api_client: Any, namespace: str) -> None:
    obj = full_stack(name="legacy", namespace=namespace)
    await create(api_client, obj)
    await set_status(api_client, obj, full_stack_status())
    legacy = await get(api_client, obj, version="v1alpha1")
    assert legacy["apiVersion"] == "pulumi.com/v1alpha1"
    assert legacy["spec"] == obj["spec"] and legacy["status"] == full_stack_status()

    # and a v1alpha1 manifest can still be created
    old = {
        "apiVersion": "pulumi.com/v1alpha1",
        "kind": "Stack",
        "metadata": {"name": "old", "namespace": namespace},
        "spec": {"stack": "org/p/dev", "accessTokenSecret": "t", "projectRepo": "https://x", "commit": "abc"},
    }
    created = await create(api_client, old)
    assert created["spec"] == old["spec"]


async def test_workspace_profile_and_service_account_are_defaulted_by_the_apiserver(
    api_client: Any, namespace: str
) -> None:
    created = await create(
        api_client,
        {
            "apiVersion": "auto.pulumi.com/v1alpha1",
            "kind": "Workspace",
            "metadata": {"name": "bare", "namespace": namespace},
            "spec": {},
        },
    )
    assert created["spec"] == {"securityProfile": "restricted", "serviceAccountName": "default"}


async def test_empty_strings_survive_the_apiserver(api_client: Any, namespace: str) -> None:
    """Go writes conditions with empty messages (Workspace Ready/Succeeded); they must be accepted.

    (kube-apiserver 1.20 refused them: its OpenAPI validators read "" as null.)
    """
    obj = full_update(name="empty-message", namespace=namespace)
    obj["spec"]["message"] = ""
    created = await create(api_client, obj)
    assert created["spec"]["message"] == ""
    status = full_update_status()
    status["conditions"][0]["message"] = ""
    assert (await set_status(api_client, obj, status))["status"] == status


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda o: o["metadata"].update(name="a" * 43), "metadata.name"),
        (lambda o: o["spec"].update(resyncFrequencySeconds=-1), "spec.resyncFrequencySeconds"),
        (lambda o: o["spec"].update(workspaceReclaimPolicy="Keep"), "spec.workspaceReclaimPolicy"),
        (lambda o: o["spec"].pop("stack"), "spec.stack"),
        (lambda o: o.pop("spec"), "spec"),
        (
            lambda o: o["spec"]["prerequisites"][0]["requirement"].update(succeededWithinDuration="-1h"),
            "spec.prerequisites[0].requirement.succeededWithinDuration",
        ),
    ],
    ids=["long-name", "negative-resync", "reclaim-enum", "no-stack", "no-spec", "negative-duration"],
)
async def test_apiserver_enforces_schema_constraints(
    api_client: Any, namespace: str, change: Any, field: str
) -> None:
    obj = full_stack(name=f"bad-{uuid.uuid4().hex[:6]}", namespace=namespace)
    change(obj)
    with pytest.raises(ApiException) as raised:
        await create(api_client, obj)
    assert raised.value.status == 422
    assert field + ":" in json.loads(raised.value.body)["message"]


def _regrouped(mode: str, tmp_path: Path) -> tuple[Path, dict[str, str], list[str]]:
    """config/crd/bases with every group renamed (pulumi.com -> pulumi-com.<mode>.pko.test), so the
    CRDs install afresh beside the session's: (directory, old -> new group, CRD names)."""
    out = tmp_path / mode
    out.mkdir()
    groups: dict[str, str] = {}
    names: list[str] = []
    for path in sorted((REPO / "config" / "crd" / "bases").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group = crd["spec"]["group"]
        groups[group] = f"{group.replace('.', '-')}.{mode}.pko.test"
        crd["spec"]["group"] = groups[group]
        crd["metadata"]["name"] = f"{crd['spec']['names']['plural']}.{groups[group]}"
        names.append(crd["metadata"]["name"])
        (out / path.name).write_text(yaml.safe_dump(crd))
    return out, groups, names


def _wait_until_listable(cluster: Any, names: list[str], *cache: str) -> None:
    """Until each new resource lists: deleting a CRD whose storage is still initializing leaves it
    Terminating ("could not list instances: storage is (re)initializing") for minutes."""
    for name in names:
        for _ in range(120):
            if (
                kubectl(
                    cluster, *cache, "get", name, "--all-namespaces", "-o", "name", check=False
                ).returncode
                == 0
            ):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"{name}: its objects never listed")


@pytest.mark.parametrize(
    "apply", [["apply"], ["apply", "--server-side"]], ids=["client-side-apply", "server-side-apply"]
)
def test_kubectl_installs_our_crds_with_either_kind_of_apply(
    cluster: Any, namespace: str, tmp_path: Path, apply: list[str]
) -> None:
    """`kubectl apply -f config/crd/bases`, as users install them, both ways, on a cluster without them.

    Client-side apply keeps the whole CRD in its last-applied annotation (the 256 KiB limit: the
    reason embedded schemas carry no descriptions); server-side apply has no such limit.
    """
    mode = "ssa" if "--server-side" in apply else "csa"
    bases, groups, names = _regrouped(mode, tmp_path)
    # A discovery cache of its own: the shared one (~/.kube/cache) would remember `stacks` in the
    # renamed group, which sorts before pulumi.com, and later tests' `kubectl get stacks` would ask
    # the deleted group for them.
    cache = f"--cache-dir={tmp_path / 'kube-cache'}"
    try:
        kubectl(cluster, cache, *apply, "-f", str(bases))
        kubectl(
            cluster,
            cache,
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            *[f"crd/{n}" for n in names],
        )
        _wait_until_listable(cluster, names, cache)
        stack = full_stack(name="installed", namespace=namespace)
        stack["apiVersion"] = stack["apiVersion"].replace("pulumi.com/", groups["pulumi.com"] + "/")
        manifest = tmp_path / "stack.yaml"
        manifest.write_text(yaml.safe_dump(stack))
        kubectl(cluster, cache, *apply, "--validate=strict", "-f", str(manifest))
        if mode == "csa":  # a second apply is a patch computed from the annotation
            kubectl(cluster, cache, *apply, "-f", str(bases))
    finally:
        kubectl(cluster, cache, "delete", "--ignore-not-found", "--wait=true", *[f"crd/{n}" for n in names])


def test_kubectl_strict_validation_accepts_a_full_stack_and_refuses_an_unknown_field(
    cluster: Any, crds: list[str], namespace: str, tmp_path: Path
) -> None:
    manifest = tmp_path / "stack.yaml"
    manifest.write_text(yaml.safe_dump(full_stack(name="kubectl", namespace=namespace)))
    result = kubectl(
        cluster, "apply", "--validate=strict", "--dry-run=server", "-f", str(manifest), check=False
    )
    assert result.returncode == 0, result.stderr
    # Strict validation does reject a field the schema lacks.
    bad = full_stack(name="kubectl-bad", namespace=namespace)
    bad["spec"]["notAField"] = True
    manifest.write_text(yaml.safe_dump(bad))
    result = kubectl(
        cluster, "apply", "--validate=strict", "--dry-run=server", "-f", str(manifest), check=False
    )
    assert result.returncode != 0 and "notAField" in result.stderr
