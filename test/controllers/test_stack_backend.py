"""Which Stacks keep their Pulumi state in a place that dies with the workspace pod (no cluster)."""

from __future__ import annotations

from typing import Any

import pytest
from pko.api.stack import Stack
from pko.api.validation import parse_stack

from pko.controllers.stack.backend import EPHEMERAL_BACKEND_REASON, ephemeral_backend

UID = "0b7a3c3e-1111-2222-3333-444455556666"
ADVICE = "use a PersistentVolumeClaim or an object store (s3://, gs://, azblob://)"


def stack(backend: str | None, *, volumes: list[dict[str, Any]] | None = None, **ws_spec: Any) -> Stack:
    """A Stack as the reconciler parses it; ``volumes`` are (volume, mountPath) pairs for the
    ``pulumi`` container, given through ``workspaceTemplate`` as users do."""
    spec: dict[str, Any] = {"stack": "dev", "programRef": {"name": "prog"}}
    if backend is not None:
        spec["backend"] = backend
    pod: dict[str, Any] = {}
    if volumes:
        pod["volumes"] = [v["volume"] for v in volumes]
        mounts = [{"name": v["volume"]["name"], "mountPath": v["at"]} for v in volumes]
        pod["containers"] = [{"name": "pulumi", "volumeMounts": mounts}]
    template_spec = dict(ws_spec)
    if pod:
        template_spec["podTemplate"] = {"spec": pod}
    if template_spec:
        spec["workspaceTemplate"] = {"spec": template_spec}
    parsed, errors = parse_stack(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": "my-stack", "namespace": "ns", "uid": UID, "generation": 1},
            "spec": spec,
        }
    )
    assert parsed is not None and errors == []
    return parsed


def empty_dir(name: str, at: str) -> dict[str, Any]:
    return {"volume": {"name": name, "emptyDir": {}}, "at": at}


def pvc(name: str, at: str) -> dict[str, Any]:
    return {"volume": {"name": name, "persistentVolumeClaim": {"claimName": name}}, "at": at}


def lost(url: str, where: str) -> str:
    return f"state in {url} is lost when the workspace pod is replaced ({where}); {ADVICE}"


ON_CONTAINER_FS = "it is on the container's own filesystem"


def test_reason_is_a_condition_reason() -> None:
    assert EPHEMERAL_BACKEND_REASON == "EphemeralBackend"


def test_state_on_an_empty_dir_names_the_volume() -> None:
    message = ephemeral_backend(stack("file:///state", volumes=[empty_dir("state", "/state")]))
    assert message == lost("file:///state", 'it is on an emptyDir volume "state"')


def test_state_under_no_mount_is_on_the_container_filesystem() -> None:
    assert ephemeral_backend(stack("file:///state")) == lost("file:///state", ON_CONTAINER_FS)


def test_state_on_a_persistent_volume_claim_is_durable() -> None:
    assert ephemeral_backend(stack("file:///state", volumes=[pvc("state", "/state")])) is None


@pytest.mark.parametrize(
    "source",
    [
        {"hostPath": {"path": "/var/pulumi"}},
        {"nfs": {"server": "nfs.example.com", "path": "/exports/pulumi"}},
        {"csi": {"driver": "efs.csi.aws.com"}},
    ],
)
def test_other_volume_kinds_are_durable_enough(source: dict[str, Any]) -> None:
    volume = {"volume": {"name": "state", **source}, "at": "/state"}
    assert ephemeral_backend(stack("file:///state", volumes=[volume])) is None


def test_a_generic_ephemeral_volume_is_deleted_with_the_pod() -> None:
    claim = {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    volume = {"volume": {"name": "scratch", "ephemeral": {"volumeClaimTemplate": claim}}, "at": "/state"}
    message = ephemeral_backend(stack("file:///state", volumes=[volume]))
    assert message == lost("file:///state", 'it is on an ephemeral volume "scratch"')


@pytest.mark.parametrize(
    "backend",
    [
        "s3://bucket/prefix",
        "gs://bucket",
        "azblob://container",
        "https://app.pulumi.com",
        "https://api.pulumi.example.com/org",
        "",
    ],
)
def test_backends_that_are_not_files_are_not_judged(backend: str) -> None:
    assert ephemeral_backend(stack(backend)) is None


def test_unset_backend_is_not_judged() -> None:
    assert ephemeral_backend(stack(None)) is None


def test_the_longest_mount_decides_a_pvc_inside_an_empty_dir_keeps_the_state() -> None:
    volumes = [empty_dir("state", "/state"), pvc("durable", "/state/durable")]
    assert ephemeral_backend(stack("file:///state/durable/x", volumes=volumes)) is None
    message = ephemeral_backend(stack("file:///state/other", volumes=volumes))
    assert message == lost("file:///state/other", 'it is on an emptyDir volume "state"')


def test_an_empty_dir_inside_a_pvc_loses_the_state() -> None:
    volumes = [pvc("durable", "/data"), empty_dir("tmp", "/data/tmp")]
    assert ephemeral_backend(stack("file:///data/state", volumes=volumes)) is None
    message = ephemeral_backend(stack("file:///data/tmp/state", volumes=volumes))
    assert message == lost("file:///data/tmp/state", 'it is on an emptyDir volume "tmp"')


def test_a_pvc_on_the_bookkeeping_directory_alone_keeps_the_state() -> None:
    # Pulumi writes everything under <backend>/.pulumi.
    volumes = [empty_dir("state", "/state"), pvc("durable", "/state/.pulumi")]
    assert ephemeral_backend(stack("file:///state", volumes=volumes)) is None


def test_a_path_that_only_shares_a_prefix_is_not_under_the_mount() -> None:
    assert ephemeral_backend(stack("file:///statefoo", volumes=[pvc("state", "/state")])) == lost(
        "file:///statefoo", ON_CONTAINER_FS
    )
    message = ephemeral_backend(stack("file:///statefoo", volumes=[empty_dir("state", "/state")]))
    assert message == lost("file:///statefoo", ON_CONTAINER_FS)


def test_paths_are_cleaned_before_they_are_compared() -> None:
    assert ephemeral_backend(stack("file:///state/", volumes=[pvc("state", "/state/")])) is None
    assert ephemeral_backend(stack("file:///other/../state/./x", volumes=[pvc("state", "/state")])) is None
    assert ephemeral_backend(stack("file:////state", volumes=[pvc("state", "/state")])) is None


@pytest.mark.parametrize("query", ["?no_tmp_dir=true", "?no_tmp_dir=false", "?a=b&c=d"])
def test_a_query_string_is_not_part_of_the_path(query: str) -> None:
    assert ephemeral_backend(stack(f"file:///state{query}", volumes=[pvc("state", "/state")])) is None
    message = ephemeral_backend(stack(f"file:///state{query}", volumes=[empty_dir("state", "/state")]))
    assert message == lost(f"file:///state{query}", 'it is on an emptyDir volume "state"')


def test_home_of_the_default_restricted_pod_is_the_nonroot_users() -> None:
    # The restricted profile (the default) runs pulumi/pulumi:latest-nonroot as uid 1000.
    assert ephemeral_backend(stack("file://~")) == lost("file://~ (/home/pulumi)", ON_CONTAINER_FS)
    assert ephemeral_backend(stack("file://~/state")) == lost(
        "file://~/state (/home/pulumi/state)", ON_CONTAINER_FS
    )
    assert ephemeral_backend(stack("file://~", volumes=[pvc("home", "/home/pulumi")])) is None
    assert ephemeral_backend(stack("file://~/state", volumes=[pvc("home", "/home/pulumi")])) is None


def test_home_of_a_baseline_pod_is_roots() -> None:
    baseline = {"securityProfile": "baseline"}
    assert ephemeral_backend(stack("file://~", **baseline)) == lost("file://~ (/root)", ON_CONTAINER_FS)
    assert ephemeral_backend(stack("file://~", volumes=[pvc("home", "/root")], **baseline)) is None
    message = ephemeral_backend(stack("file://~", volumes=[empty_dir("home", "/root")], **baseline))
    assert message == lost("file://~ (/root)", 'it is on an emptyDir volume "home"')


def test_the_shared_workspace_volume_is_an_empty_dir_too() -> None:
    # Every workspace pod mounts the operator's "share" emptyDir at /share.
    message = ephemeral_backend(stack("file:///share/state"))
    assert message == lost("file:///share/state", 'it is on an emptyDir volume "share"')


def test_a_relative_path_is_relative_to_the_project_directory_on_the_shared_volume() -> None:
    message = ephemeral_backend(stack("file://state"))
    assert message == lost("file://state (/share/workspace/state)", 'it is on an emptyDir volume "share"')
    message = ephemeral_backend(stack("file://./einstein"))
    assert message == lost(
        "file://./einstein (/share/workspace/einstein)", 'it is on an emptyDir volume "share"'
    )


def test_a_relative_path_with_a_local_source_is_relative_to_its_directory() -> None:
    local = {"local": {"dir": "/opt/project"}}
    assert ephemeral_backend(stack("file://state", volumes=[pvc("project", "/opt/project")], **local)) is None
    message = ephemeral_backend(stack("file://state", **local))
    assert message == lost("file://state (/opt/project/state)", ON_CONTAINER_FS)


def test_a_pvc_mounted_inside_the_shared_volume_keeps_the_state() -> None:
    assert ephemeral_backend(stack("file:///share/state", volumes=[pvc("state", "/share/state")])) is None


def test_mounts_of_other_containers_do_not_count() -> None:
    s = stack(
        "file:///state",
        podTemplate={
            "spec": {
                "volumes": [{"name": "state", "persistentVolumeClaim": {"claimName": "state"}}],
                "containers": [
                    {"name": "sidecar", "volumeMounts": [{"name": "state", "mountPath": "/state"}]}
                ],
            }
        },
    )
    assert ephemeral_backend(s) == lost("file:///state", ON_CONTAINER_FS)


def test_a_stack_not_yet_read_from_the_api_is_judged_the_same() -> None:
    s = stack("file:///state", volumes=[empty_dir("state", "/state")])
    fresh = s.model_copy(update={"metadata": s.metadata.model_copy(update={"uid": None})})
    assert ephemeral_backend(fresh) == lost("file:///state", 'it is on an emptyDir volume "state"')
