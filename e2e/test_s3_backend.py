"""config/samples/s3 and examples/s3-backend on a real node (issue 28): a Stack whose Pulumi state is in
an S3-compatible object store served in the cluster, SeaweedFS (localhost/pko-seaweedfs:dev,
hack/build-seaweedfs.sh), through the CLI's ``s3://`` backend with the keys from a Secret (envRefs).

Applied as docs/concepts.md (State backends) says, in one ``kubectl apply -k``: the SeaweedFS server
creates its bucket at start and the workspace pod waits for it (the sample's init container). Then,
from the SeaweedFS side (the filer's HTTP listing on loopback, ``kubectl exec`` into its pod): the
bucket exists and holds the stack's
checkpoint with every resource; the workspace pod has no volume for the state at all. The workspace pod
deleted, the next update (asked for by annotation) runs in a new pod that finds every resource in the
bucket: nothing created or replaced (the ConfigMap keeps its uid), a preview there expects no changes.
Deleting the Stack (``destroyOnFinalize``) removes what Pulumi created and leaves the checkpoint with no
resource. Everything is removed afterwards, the Stack first (its destroy needs the store and the keys).

examples/s3-backend runs beside it in the same bucket, applied from its folder as its header says (its
Secret ``pulumi-s3`` created from the store's keys), with examples/components/local-node, which points its
``backend`` at this SeaweedFS: Ready with its pet name, its checkpoint in the bucket, no state volume on
its pod, and deleted (destroyOnFinalize) it leaves the checkpoint with no resource.

Independent of the other e2e modules: only the session's ``kube`` fixture, names of its own (``hello-s3``,
``s3-backend``, ``seaweedfs``) in the ``default`` namespace the sample's backend URL names.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pko.devtools.examples import local_example

from .conftest import Kube
from .stacks import gone, ready

pytestmark = [pytest.mark.timeout(1800), pytest.mark.usefixtures("seaweedfs_image")]

SAMPLE = Path(__file__).resolve().parents[1] / "config" / "samples" / "s3"
EXAMPLE = "s3-backend"  # examples/s3-backend: its Stack, Program (project) and Secret `pulumi-s3`'s user
NAME = "hello-s3"  # the Stack, its Program (the Pulumi project's name) and the ConfigMap it creates
POD = f"{NAME}-workspace-0"
BUCKET = "pulumi-state"
# The filer on loopback in the SeaweedFS pod (the NetworkPolicy admits only the S3 port from outside); a
# bucket is the filer directory /buckets/<name>, and the diy backend keeps a stack's checkpoint at
# .pulumi/stacks/<project>/<stack>.json in it.
FILER = "http://127.0.0.1:8888"


def stacks_dir(project: str) -> str:
    return f"/buckets/{BUCKET}/.pulumi/stacks/{project}/"


STACKS_DIR = stacks_dir(NAME)


def in_seaweedfs(k: Kube, *command: str) -> str:
    """``command`` in the SeaweedFS container (busybox: ``wget``, ``ls``...)."""
    return k.run("exec", "deployment/seaweedfs", "-c", "seaweedfs", "--", *command)


def filer_entries(k: Kube, directory: str) -> list[str]:
    """The names in a filer directory (its JSON listing)."""
    out = in_seaweedfs(k, "wget", "-q", "-O", "-", "--header", "Accept: application/json", FILER + directory)
    return sorted(e["FullPath"].rsplit("/", 1)[-1] for e in json.loads(out).get("Entries") or [])


def checkpoint_urns(k: Kube, project: str = NAME) -> list[str]:
    """The resources of the project's `dev` checkpoint, read from the bucket through the filer."""
    state = json.loads(in_seaweedfs(k, "wget", "-q", "-O", "-", FILER + stacks_dir(project) + "dev.json"))
    latest = state["checkpoint"].get("latest") or {}
    return sorted(r["urn"] for r in latest.get("resources") or [])


def in_workspace(k: Kube, command: str) -> str:
    # --stack on every command: a recreated pod may not have the stack selected yet.
    return k.run("exec", POD, "-c", "pulumi", "--", "sh", "-c", f"cd /share/workspace && {command}")


def delete_stack(k: Kube, name: str = NAME) -> None:
    if k.get("stack", name) is not None:
        k.run("delete", "stack", name, "--wait=false")
        gone(k, "stack", name, 600)


def state_volumes(k: Kube, pod_name: str) -> list[str]:
    """The volumes of a workspace pod that could hold state (a claim, a host path)."""
    pod = k.get("pod", pod_name)
    assert pod is not None, pod_name
    return [v["name"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v or "hostPath" in v]


def create_example_secret(k: Kube) -> None:
    """examples/s3-backend's Secret, made as its header says: the store's keys (config/samples/s3's
    Secret) and a passphrase of the user's."""
    keys = (k.get("secret", "seaweedfs-s3") or {})["data"]
    literal = [
        f"--from-literal={key}={base64.b64decode(keys[key]).decode()}"
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    ]
    passphrase = "--from-literal=PULUMI_CONFIG_PASSPHRASE=e2e-example-passphrase"
    k.apply(
        k.run(
            "create", "secret", "generic", "pulumi-s3", *literal, passphrase, "--dry-run=client", "-o", "yaml"
        )
    )


def test_a_stack_keeps_its_state_in_seaweedfs_through_the_s3_backend(kube: Kube, tmp_path: Path) -> None:
    k = kube
    manifest = k.run("kustomize", str(SAMPLE))
    example = k.run("kustomize", str(local_example(EXAMPLE, tmp_path / EXAMPLE)))
    try:
        k.apply(manifest)
        # The server runs under the namespace's `restricted` profile, Ready once its bucket exists.
        k.run("rollout", "status", "deployment/seaweedfs", "--timeout=300s", timeout=320)
        assert BUCKET in filer_entries(k, "/buckets/")
        create_example_secret(k)
        k.apply(example)

        s = ready(k, NAME)
        assert s["status"]["outputs"] == {"configMap": NAME, "greeting": "[secret]"}, s["status"]
        assert k.condition(s, "EphemeralBackend") == {}  # an object store: no warning
        page = k.get("configmap", NAME)
        assert page is not None and page["data"] == {"greeting": "Hello from Pulumi, with its state in S3"}

        # The state is in the bucket, as SeaweedFS itself stores it: the stack's checkpoint, with the
        # stack, the ConfigMap (and the kubernetes provider) in it.
        assert "dev.json" in filer_entries(k, STACKS_DIR)
        before = checkpoint_urns(k)
        assert {u.rsplit("::", 1)[-1] for u in before} >= {f"{NAME}-dev", "page"}, before
        # ...and the CLI in the workspace pod sees the same through the S3 API.
        (listed,) = json.loads(in_workspace(k, "pulumi stack ls --json"))
        assert (listed["name"].rstrip("*"), listed["resourceCount"]) == ("dev", len(before)), listed
        # Nothing of it is on the workspace pod: no volume but the operator's own (and the token's).
        old_pod = k.get("pod", POD)
        assert old_pod is not None
        assert state_volumes(k, POD) == [], old_pod["spec"]["volumes"]

        # The workspace pod goes; the next update runs in a new one and finds every resource.
        last = s["status"]["lastUpdate"]["name"]
        k.run("delete", "pod", POD)

        def new_pod_ready() -> bool:
            pod = k.get("pod", POD)
            return bool(
                pod
                and pod["metadata"]["uid"] != old_pod["metadata"]["uid"]
                and all(c.get("ready") for c in pod["status"].get("containerStatuses") or [{}])
            )

        k.until("a new workspace pod", new_pod_ready, 300)
        request = "pulumi.com/reconciliation-request=after-pod-deletion"
        k.run("annotate", "stack", NAME, request, "--overwrite")

        def next_update() -> dict[str, Any] | None:
            st = k.get("stack", NAME) or {}
            lu = (st.get("status") or {}).get("lastUpdate") or {}
            done = lu.get("name") not in (None, last) and k.condition(st, "Ready").get("status") == "True"
            return st if done else None

        s = k.until("the next update", next_update, 600)
        lu = s["status"]["lastUpdate"]
        assert (lu["state"], lu["type"]) == ("succeeded", "up"), lu
        update = k.get("update", lu["name"])
        changes = ((update or {}).get("status") or {}).get("resourceChanges")  # pko's extension, if any
        if changes is not None:
            assert not {"create", "replace", "create-replacement", "delete"} & set(changes), changes
        after = k.get("configmap", NAME)
        assert after is not None and after["metadata"]["uid"] == page["metadata"]["uid"], "recreated"
        assert checkpoint_urns(k) == before
        in_workspace(k, "pulumi preview --stack dev --expect-no-changes --non-interactive")

        # examples/s3-backend, meanwhile: deployed, its state in the same bucket and none on its pod.
        ex = ready(k, EXAMPLE)
        assert re.fullmatch(r"[a-z]+-[a-z]+", ex["status"]["outputs"]["petName"]), ex["status"]
        assert k.condition(ex, "EphemeralBackend") == {}
        assert "dev.json" in filer_entries(k, stacks_dir(EXAMPLE))
        urns = checkpoint_urns(k, EXAMPLE)
        assert {u.rsplit("::", 1)[-1] for u in urns} >= {f"{EXAMPLE}-dev", "pet"}, urns
        assert state_volumes(k, f"{EXAMPLE}-workspace-0") == []
        k.run("delete", "stack", EXAMPLE, "--wait=false")  # destroyed while the sample's Stack is

        # destroyOnFinalize: deleting the Stack destroys what Pulumi created; the checkpoint stays in the
        # bucket (the stack is not removed), holding no resource.
        delete_stack(k)
        gone(k, "configmap", NAME)
        gone(k, "workspace", NAME)
        assert checkpoint_urns(k) == []
        gone(k, "stack", EXAMPLE, 600)
        assert checkpoint_urns(k, EXAMPLE) == []
    finally:
        # The Stacks first, while the store and the keys they destroy with still exist.
        delete_stack(k)
        delete_stack(k, EXAMPLE)
        k.run("delete", "--ignore-not-found", "--wait=true", "-f", "-", input=example, timeout=300)
        k.run("delete", "secret", "pulumi-s3", "--ignore-not-found")
        k.run("delete", "--ignore-not-found", "--wait=true", "-f", "-", input=manifest, timeout=300)
