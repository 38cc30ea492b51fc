"""The pulumi container's ephemeral-storage request and limit (issue 28; pure: no cluster): the
defaults, and how spec.resources, the pod template and a Stack's workspaceTemplate override them."""

from __future__ import annotations

from typing import Any

import pytest
from pko.api.stack import Stack

from pko.controllers.stack.workspaceobject import ArtifactRevision, build_workspace
from pko.controllers.workspace.workloads import ANNOTATION_REVISION_HASH, revision_hash

from .builders import Obj, build, by_name, pod_spec, seed_workspace, workspace


def storage_of(ws: Obj) -> tuple[Any, Any]:
    """The pulumi container's ephemeral-storage (request, limit)."""
    resources = by_name(pod_spec(ws)["containers"], "pulumi")["resources"]
    return resources["requests"].get("ephemeral-storage"), resources["limits"].get("ephemeral-storage")


def test_the_pulumi_container_requests_and_is_limited_in_ephemeral_storage_by_default() -> None:
    spec = pod_spec(workspace({}))
    assert storage_of(workspace({})) == ("1Gi", "4Gi")
    # Only the container that runs the engine: the init containers copy and fetch, then exit.
    for container in spec["initContainers"]:
        assert "resources" not in container, container["name"]
    # The shared emptyDir has no sizeLimit of its own: the pod's limit counts it already.
    assert by_name(spec["volumes"], "share") == {"name": "share", "emptyDir": {}}


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        # Either, or both, from spec.resources replaces the default; the other keeps its default.
        ({"requests": {"ephemeral-storage": "2Gi"}}, ("2Gi", "4Gi")),
        ({"limits": {"ephemeral-storage": "10Gi"}}, ("1Gi", "10Gi")),
        ({"requests": {"ephemeral-storage": "3G"}, "limits": {"ephemeral-storage": "20G"}}, ("3G", "20G")),
        # A default never crosses the user's figure (Kubernetes refuses a request above the limit).
        ({"limits": {"ephemeral-storage": "512Mi"}}, ("512Mi", "512Mi")),
        ({"requests": {"ephemeral-storage": "8Gi"}}, ("8Gi", "8Gi")),
        ({"requests": {"ephemeral-storage": "4Gi"}}, ("4Gi", "4Gi")),
        ({"limits": {"ephemeral-storage": "1Gi"}}, ("1Gi", "1Gi")),
        ({"limits": {"ephemeral-storage": "1073741824"}}, ("1Gi", "1073741824")),
        # Zero is "the default", as for the cpu and memory requests.
        ({"requests": {"ephemeral-storage": "0"}, "limits": {"ephemeral-storage": "0Gi"}}, ("1Gi", "4Gi")),
        # Not a quantity: left as written for the API server to refuse, and no default beside it.
        ({"limits": {"ephemeral-storage": "lots"}}, ("lots", "lots")),
        # Other resources do not count.
        ({"limits": {"memory": "100Mi"}}, ("1Gi", "4Gi")),
    ],
)
def test_spec_resources_override_the_ephemeral_storage_defaults(
    resources: Obj, expected: tuple[str, str]
) -> None:
    assert storage_of(workspace({"resources": resources})) == expected


def test_the_pod_template_overrides_the_ephemeral_storage_defaults() -> None:
    def template(resources: Obj) -> Obj:
        return {"podTemplate": {"spec": {"containers": [{"name": "pulumi", "resources": resources}]}}}

    assert storage_of(workspace(template({"limits": {"ephemeral-storage": "16Gi"}}))) == ("1Gi", "16Gi")
    # A request the template raises above the default limit carries the limit with it: the default
    # is applied to the merged container, never before the template could make it invalid.
    assert storage_of(workspace(template({"requests": {"ephemeral-storage": "6Gi"}}))) == ("6Gi", "6Gi")
    # spec.resources and the template together: the template's field wins, as for cpu and memory.
    both = workspace(
        {
            "resources": {"requests": {"ephemeral-storage": "2Gi"}, "limits": {"ephemeral-storage": "8Gi"}},
            **template({"limits": {"ephemeral-storage": "12Gi"}}),
        }
    )
    assert storage_of(both) == ("2Gi", "12Gi")
    # A sidecar the template adds gets no default: it is the user's container.
    sidecar = workspace({"podTemplate": {"spec": {"containers": [{"name": "sidecar", "image": "s:1"}]}}})
    assert "resources" not in by_name(pod_spec(sidecar)["containers"], "sidecar")


def test_the_stack_workspace_template_overrides_the_ephemeral_storage_defaults() -> None:
    def stack_workspace(template: Obj) -> Obj:
        stack = Stack.model_validate(
            {
                "apiVersion": "pulumi.com/v1",
                "kind": "Stack",
                "metadata": {"name": "s", "namespace": "ns", "uid": "u-1", "generation": 1},
                "spec": {"stack": "dev", "programRef": {"name": "p"}, "workspaceTemplate": template},
            }
        )
        ws: Obj = build_workspace(stack, ArtifactRevision("http://a/p/1", "sha256:x", "1"))
        ws["metadata"]["uid"] = "ws-uid"
        return ws

    assert storage_of(stack_workspace({})) == ("1Gi", "4Gi")
    resources = {"spec": {"resources": {"requests": {"ephemeral-storage": "3Gi"}}}}
    assert storage_of(stack_workspace(resources)) == ("3Gi", "4Gi")
    pod = {"containers": [{"name": "pulumi", "resources": {"limits": {"ephemeral-storage": "9Gi"}}}]}
    assert storage_of(stack_workspace({"spec": {"podTemplate": {"spec": pod}}})) == ("1Gi", "9Gi")


def test_the_defaults_are_in_the_pod_template_not_the_workspace_spec() -> None:
    """Upgrading to an operator with these defaults rolls every workspace pod once (the StatefulSet's
    template, hence its controller-revision-hash, changes); the Workspace's revision hash does not
    (it hashes the Workspace spec, which the defaults do not touch)."""
    ws = seed_workspace()
    pod = build(ws)["spec"]["template"]
    assert pod["metadata"]["annotations"][ANNOTATION_REVISION_HASH] == revision_hash(ws["spec"])
    assert "ephemeral-storage" not in str(ws["spec"])
