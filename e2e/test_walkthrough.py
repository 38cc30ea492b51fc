"""Seed 000's walkthrough on a real node: pko in the cluster, real workspace pods (agent image + the
workspace image with the real Pulumi engine), Services resolved by the cluster DNS, kubectl as users run
it. Programs deploy Kubernetes objects through pulumi-kubernetes with the workspace's ServiceAccount
(config/samples/rbac.yaml lets `default/pulumi` manage ConfigMaps and Deployments), and every stack keeps
its state on a PersistentVolumeClaim of its own, as the sample does. Against either operator
(``PKO_E2E_OPERATOR``): where the Go operator differs, each test asserts what it does
(docs/differences.md), and the test of a pko feature it lacks is ``pko_only``."""

from __future__ import annotations

import base64
import json
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dulwich.repo import Repo

from pko.devtools.examples import local_example
from pko.devtools.gitserver import ServerTLS, serve_git

from .conftest import NODE_IP, OPERATOR, OPERATOR_NS, RESTRICTED, WORKSPACE_NS, Kube, trusting_git_ca
from .stacks import (
    PROGRAM,
    bare_repository,
    gone,
    metrics,
    program,
    ready,
    stack,
)

pytestmark = pytest.mark.timeout(1800)


def test_program_stack_walkthrough(kube: Kube) -> None:
    k = kube
    k.apply(program("walkthrough"))
    k.apply(stack("walkthrough", "programRef:\n    name: walkthrough"))
    s = ready(k, "walkthrough")

    # kubectl get workspace: IMAGE, READY, ADDRESS (the Service name that really connects)
    table = k.run("get", "workspace", "walkthrough")
    assert re.search(r"NAME\s+IMAGE\s+READY\s+ADDRESS", table), table
    # the Go operator's address leaves out .svc.cluster.local (docs/differences.md)
    suffix = ".svc.cluster.local" if OPERATOR == "pko" else ""
    assert f"walkthrough-workspace.default{suffix}:50051" in table, table
    assert " True " in table, table
    updates = k.run("get", "update", "-l", "pulumi.com/stack-name=walkthrough")
    # the seed's columns: NAME WORKSPACE PROGRESSING FAILED COMPLETE URL
    assert re.search(r"NAME\s+WORKSPACE\s+PROGRESSING\s+FAILED\s+COMPLETE\s+URL", updates), updates
    assert re.search(r"walkthrough\s+False\s+False\s+True", updates), updates

    # The Stack's status as the seed shows it
    status = s["status"]
    last = status["lastUpdate"]
    if OPERATOR == "pko":
        assert (last["state"], last["type"], last["failures"]) == ("succeeded", "up", 0), status
        assert last["lastSuccessfulCommit"].startswith("sha256:"), last
    else:  # the Program's generation, and no failures after a success (docs/differences.md)
        assert (last["state"], last["type"], last.get("failures")) == ("succeeded", "up", None), status
        assert last["lastSuccessfulCommit"] == "1", last
    assert status["outputs"] == {"uid": "[secret]", "greeting": "hello"}, status
    # what Pulumi created, through pulumi-kubernetes with the workspace's ServiceAccount
    created = k.get("configmap", "walkthrough-settings")
    assert created is not None and created["data"] == {"greeting": "hello"}, created

    # kubectl exec into the workspace pod and use the CLI there (the seed's `pulumi import` path)
    def in_workspace(command: str) -> str:
        shell = f"cd /share/workspace && {command}"  # the envRefs (the passphrase) are the pod's env
        return k.run("exec", "walkthrough-workspace-0", "-c", "pulumi", "--", "sh", "-c", shell)

    outputs = json.loads(in_workspace("pulumi stack output --json --show-secrets"))
    assert outputs == {"greeting": "hello", "uid": created["metadata"]["uid"]}, outputs

    # ...and `pulumi import` there, as the seed does by hand: an object made with kubectl comes under
    # the stack's management (and goes with its destroy)
    k.apply("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: walkthrough-imported\ndata:\n  a: b\n")
    in_workspace(
        "pulumi import kubernetes:core/v1:ConfigMap imported default/walkthrough-imported"
        " --yes --protect=false"
    )
    exported = json.loads(in_workspace("pulumi stack export"))
    imported = [r for r in exported["deployment"]["resources"] if r["urn"].endswith("::imported")]
    assert imported and imported[0]["id"] == "default/walkthrough-imported", exported
    logs = k.run("logs", "walkthrough-workspace-0", "-c", "pulumi")
    assert logs.strip(), "the workspace agent wrote no log"

    # metrics, as seed 002 shows them
    if OPERATOR == "pko":
        text = metrics(k)
        assert re.search(r"^stacks_active(\{\})? [1-9]", text, re.M), text
        assert 'stacks_failing{name="walkthrough",namespace="default"} 0.0' in text, text
    else:
        _go_metrics_refused(k)

    # A config change reaches the running agent: the same pod, and a key removed from the Stack is
    # gone from the stack's config too (the settings file is reset before the config is set again);
    # secrets still encrypt and decrypt with the passphrase after that reset.
    serving = k.get("pod", "walkthrough-workspace-0")
    assert serving is not None
    changes = (
        {"config": {"greeting": "hi", "extra": "1"}, "secrets": {"token": "first"}},
        {"config": {"greeting": "bye", "extra": None}, "secrets": {"token": "second"}},
    )
    for change in changes:
        patch = json.dumps({"spec": change})
        patched = k.json("patch", "stack", "walkthrough", "--type=merge", "-p", patch)
        generation = patched["metadata"]["generation"]

        def applied(g: int = generation) -> bool:
            st = k.get("stack", "walkthrough") or {}
            last = (st.get("status") or {}).get("lastUpdate") or {}
            return last.get("generation") == g and k.condition(st, "Ready").get("status") == "True"

        k.until(f"the update for {patch}", applied, 300)
    config = json.loads(in_workspace("pulumi config --json --show-secrets -s dev"))
    values = {key: entry.get("value") for key, entry in config.items()}
    assert values == {"walkthrough:greeting": "bye", "walkthrough:token": "second"}, config
    assert config["walkthrough:token"]["secret"] is True, config
    current = k.get("pod", "walkthrough-workspace-0")
    assert current is not None
    events = k.json("get", "events", "--field-selector", "involvedObject.name=walkthrough")["items"]
    if OPERATOR == "pko":
        assert current["metadata"]["uid"] == serving["metadata"]["uid"]
        assert any(e["reason"] == "Reinitialized" for e in events), [e["reason"] for e in events]
    else:  # the config is in the pod template's hash: a new pod (docs/differences.md)
        assert current["metadata"]["uid"] != serving["metadata"]["uid"]

    # kubectl delete stack: destroyOnFinalize destroys, then nothing is left behind
    update_names = [
        u["metadata"]["name"]
        for u in k.json("get", "updates", "-l", "pulumi.com/stack-name=walkthrough")["items"]
    ]
    k.run("delete", "stack", "walkthrough", "--wait=false")
    gone(k, "stack", "walkthrough")
    gone(k, "workspace", "walkthrough")
    for name in update_names:
        gone(k, "update", name)
    gone(k, "configmap", "walkthrough-settings")  # destroyed by Pulumi
    gone(k, "configmap", "walkthrough-imported")
    k.run("delete", "program", "walkthrough")


def _go_metrics_refused(k: Kube) -> None:
    """The Go operator's quickstart: HTTPS on :8443 behind authentication, but the TokenReview it needs
    is granted to ``system/controller-manager``, not to its ServiceAccount, so every scrape fails
    (controller-runtime's "Authentication failed", a 500); nothing listens on its Service's 8383."""
    pod = k.json("-n", OPERATOR_NS, "get", "pods", "-l", "control-plane=controller-manager")["items"][0]
    ip = pod["status"]["podIP"]
    token = k.run("-n", OPERATOR_NS, "create", "token", "controller-manager").strip()  # its own account
    request = urllib.request.Request(
        f"https://{ip}:8443/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # its self-signed certificate
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60, context=context)
    assert (refused.value.code, refused.value.read()) == (500, b"Authentication failed\n"), refused.value
    with pytest.raises(urllib.error.URLError) as nothing:
        urllib.request.urlopen(f"http://{ip}:8383/metrics", timeout=10)
    assert isinstance(nothing.value.reason, ConnectionRefusedError), nothing.value


@pytest.fixture
def git_server(tmp_path: Path, git_tls: ServerTLS) -> Iterator[tuple[str, Repo]]:
    """A git smart-HTTPS server on the node's own address, which workspace pods reach, its certificate
    from the suite's own CA (e2e/conftest.py's git_tls), at a path of two segments (the Go operator
    refuses one: docs/differences.md)."""
    repo = bare_repository(tmp_path)
    with serve_git(repo, "/e2e/repo.git", NODE_IP, git_tls) as url:
        yield url, repo


def test_git_stack_walkthrough(kube: Kube, git_server: tuple[str, Repo]) -> None:
    k = kube
    url, repo = git_server
    head = repo.refs[b"refs/heads/main"].decode()
    assert url.startswith("https://"), url
    k.apply(trusting_git_ca(stack("gitops", f"projectRepo: {url}\n  branch: main\n  repoDir: app")))
    s = ready(k, "gitops")
    assert s["status"]["lastUpdate"]["lastSuccessfulCommit"] == head
    assert s["status"]["outputs"] == {"greeting": "one"}
    k.run("delete", "stack", "gitops", "--wait=false")
    gone(k, "stack", "gitops")
    gone(k, "workspace", "gitops")


def _running_update(k: Kube, name: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        current = ((k.get("stack", name) or {}).get("status") or {}).get("currentUpdate") or {}
        if not current.get("name"):
            return None
        update = k.get("update", current["name"])
        return update if k.condition(update, "Progressing").get("status") == "True" else None

    result: dict[str, Any] = k.until(f"an update of {name} running", probe, 300, 1)
    return result


def test_workspace_pod_deleted_mid_update_never_sticks(kube: Kube) -> None:
    k = kube
    k.apply(program("podloss", hang=45))
    k.apply(stack("podloss", "programRef:\n    name: podloss"))
    update = _running_update(k, "podloss")
    time.sleep(3)
    k.run("delete", "pod", "podloss-workspace-0", "--wait=false")

    def ended() -> dict[str, Any] | None:
        u = k.get("update", update["metadata"]["name"])
        return u if k.condition(u, "Complete").get("status") == "True" else None

    u = k.until("the interrupted update ended", ended, 300)
    failed = k.condition(u, "Failed")
    assert failed.get("status") == "True" and failed.get("reason"), u["status"]
    # The Stack moves on: a retry on the new pod deploys it.
    ready(k, "podloss", within=900)
    k.run("delete", "stack", "podloss", "--wait=false")
    gone(k, "stack", "podloss")


@pytest.mark.pko_only(
    "re-attaching to the agent's operation: the Go operator aborts the Update and its stack stays locked"
)
def test_operator_pod_deleted_mid_update_reattaches_and_records_once(kube: Kube) -> None:
    k = kube
    k.apply(program("leader", hang=40))
    k.apply(stack("leader", "programRef:\n    name: leader"))
    update = _running_update(k, "leader")
    k.run("-n", OPERATOR_NS, "delete", "pod", "-l", "control-plane=controller-manager", "--wait=false")
    s = ready(k, "leader", within=900)
    assert s["status"]["lastUpdate"]["name"] == update["metadata"]["name"], s["status"]
    events = k.json("get", "events", "--field-selector", f"involvedObject.name={update['metadata']['name']}")[
        "items"
    ]
    succeeded = [e for e in events if e["reason"] == "UpdateSucceeded"]
    assert len(succeeded) == 1 and succeeded[0].get("count", 1) == 1, events
    k.run("delete", "stack", "leader", "--wait=false")
    gone(k, "stack", "leader")


def test_reclaim_policy_delete_removes_the_workspace_after_success(kube: Kube) -> None:
    k = kube
    k.apply(program("reclaimed"))
    manifest = stack("reclaimed", "programRef:\n    name: reclaimed").replace(
        "  destroyOnFinalize: true\n", "  destroyOnFinalize: true\n  workspaceReclaimPolicy: Delete\n"
    )
    k.apply(manifest)
    s = ready(k, "reclaimed")
    assert s["status"]["lastUpdate"]["state"] == "succeeded"
    gone(k, "workspace", "reclaimed")
    gone(k, "pod", "reclaimed-workspace-0")
    # The source goes first: the destroy runs in a new pod from the saved projectInfo and the state
    # on the claim, and the Stack says so.
    k.run("delete", "program", "reclaimed")
    k.run("delete", "stack", "reclaimed", "--wait=false")

    def from_project_info() -> dict[str, Any] | None:
        ws = k.get("workspace", "reclaimed")
        return ws if ws is not None and (ws["spec"].get("projectInfo") or {}).get("name") else None

    ws = k.until("a Workspace from the saved projectInfo", from_project_info, 120, 1)
    if OPERATOR == "pko":
        assert ws["spec"]["stacks"] == [{"name": "dev", "create": False}], ws["spec"]
        events = k.json("get", "events", "--field-selector", "involvedObject.name=reclaimed")["items"]
        said = [e["message"] for e in events if e["reason"] == "DestroyFromProjectInfo"]
        assert said and "runs in a new workspace pod" in said[0], events
    else:  # it would create a stack missing from the backend, and says nothing (docs/differences.md)
        assert ws["spec"]["stacks"] == [{"name": "dev", "create": True}], ws["spec"]
    gone(k, "stack", "reclaimed", within=600)
    gone(k, "configmap", "reclaimed-settings")  # destroyed from the state on the claim


def test_a_workspace_account_without_auth_delegation_reports_unauthenticated(kube: Kube) -> None:
    k = kube
    k.apply("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: no-delegation\n")
    k.apply(program("noauth"))
    manifest = stack("noauth", "programRef:\n    name: noauth")
    manifest = manifest.replace("serviceAccountName: pulumi", "serviceAccountName: no-delegation")
    k.apply(manifest.replace("  destroyOnFinalize: true\n", ""))  # nothing could run the destroy

    def unauthenticated() -> dict[str, Any] | None:
        ws = k.get("workspace", "noauth")
        return ws if k.condition(ws, "Ready").get("reason") == "Unauthenticated" else None

    ws = k.until("workspace noauth Unauthenticated", unauthenticated, 300)
    assert k.condition(ws, "Ready")["status"] == "False"
    assert k.get("pod", "noauth-workspace-0") is not None, "the pod is kept for diagnosis"
    k.run("delete", "stack", "noauth", "--wait=false")


SEEDS = Path(__file__).resolve().parents[1] / "test" / "data" / "seeds"
SAMPLES = Path(__file__).resolve().parents[1] / "config" / "samples"
WORKSPACE_IMAGE = "pko-workspace:dev"  # the real engine, built by hack/build-images.sh


def test_seed_customized_workspace_runs_as_written(kube: Kube) -> None:
    """Seed 000's customized workspace: extra init container, pod label, toleration, grace period and
    a projected service-account token with its own audience. Only what cannot exist here is changed:
    the images (no registry: the local workspace image for the seed's custom image and for busybox)
    and the source (a Program) with this suite's backend settings."""
    k = kube
    seed = yaml.safe_load((SEEDS / "000-my-stack-customized.yaml").read_text())
    spec = seed["spec"]
    template = spec["workspaceTemplate"]["spec"]
    assert template["image"] == "example/pulumi-with-dependencies:v3.334"
    template["image"] = WORKSPACE_IMAGE
    pod_spec = template["podTemplate"]["spec"]
    assert pod_spec["initContainers"][0]["image"] == "busybox"
    pod_spec["initContainers"][0]["image"] = WORKSPACE_IMAGE
    claim, suite_stack = yaml.safe_load_all(stack("my-stack", "programRef:\n    name: my-stack"))
    k.apply(yaml.safe_dump(claim))  # the suite's state volume
    base = suite_stack["spec"]
    base_pod = base["workspaceTemplate"]["spec"]["podTemplate"]["spec"]  # the suite's state volume
    pod_spec["containers"][0]["volumeMounts"] += base_pod["containers"][0]["volumeMounts"]
    pod_spec["volumes"] += base_pod["volumes"]
    for key in ("serviceAccountName", "programRef", "backend", "destroyOnFinalize", "envRefs"):
        spec[key] = base[key]
    k.apply(program("my-stack"))
    k.apply(yaml.safe_dump(seed))
    ready(k, "my-stack")

    pod = k.get("pod", "my-stack-workspace-0")
    assert pod is not None
    assert pod["metadata"]["labels"]["example.com/mylabel"] == "bar"
    toleration = {"key": "example.com/foo", "operator": "Exists", "effect": "NoSchedule"}
    assert toleration in pod["spec"]["tolerations"]
    assert pod["spec"]["terminationGracePeriodSeconds"] == 3600
    extra = next(s for s in pod["status"]["initContainerStatuses"] if s["name"] == "extra")
    assert extra["state"]["terminated"]["exitCode"] == 0, extra
    assert "Hello, extra init container!" in k.run("logs", "my-stack-workspace-0", "-c", "extra")
    token_file = "/var/run/secrets/pulumi/token"
    token = k.run("exec", "my-stack-workspace-0", "-c", "pulumi", "--", "cat", token_file)
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert claims["aud"] == ["urn:pulumi:org:ORG_NAME"], claims
    k.run("delete", "stack", "my-stack", "--wait=false")
    gone(k, "stack", "my-stack")
    k.run("delete", "program", "my-stack")


CUSTOM = "custom-workspace"  # examples/custom-workspace: its Stack, Program and claim


def _never_pulled(k: Kube) -> bool:
    """The custom workspace's pod waits on ErrImageNeverPull (its fetch or its pulumi container)."""
    status = (k.get("pod", f"{CUSTOM}-workspace-0") or {}).get("status") or {}
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    return any(
        (c.get("state") or {}).get("waiting", {}).get("reason") == "ErrImageNeverPull" for c in statuses
    )


def test_a_workspace_image_that_cannot_be_pulled_is_reported_and_recovers(kube: Kube, tmp_path: Path) -> None:
    """examples/custom-workspace, applied from its folder with the local-node component, first with an
    image no node has: reported, then recovered by the example as the component writes it (the image the
    node built), its pod with the example's resources and environment."""
    k = kube
    # imagePullPolicy Never: the kubelet reports the missing image without contacting any registry.
    missing = [
        {"op": "replace", "path": "/spec/workspaceTemplate/spec/image", "value": "pko-workspace:missing"},
        {"op": "replace", "path": "/spec/workspaceTemplate/spec/imagePullPolicy", "value": "Never"},
    ]
    k.apply(k.run("kustomize", str(local_example(CUSTOM, tmp_path / "missing", missing))))

    def pull_failed() -> dict[str, Any] | None:
        ws = k.get("workspace", CUSTOM)
        return ws if k.condition(ws, "Ready").get("reason") == "ImagePullFailed" else None

    if OPERATOR == "pko":
        ws = k.until(f"workspace {CUSTOM} ImagePullFailed", pull_failed, 300)
        message = k.condition(ws, "Ready")["message"]
        assert "pko-workspace:missing" in message and "ErrImageNeverPull" in message, message
    else:  # only the pod says why; the Workspace waits for its StatefulSet (docs/differences.md)
        k.until(f"pod {CUSTOM}-workspace-0 ErrImageNeverPull", lambda: _never_pulled(k), 300)
        waiting = k.condition(k.get("workspace", CUSTOM), "Ready")
        assert waiting.get("status") == "False", waiting
        said = f"{waiting.get('reason')}: {waiting.get('message')}"
        assert "pko-workspace:missing" not in said and "ErrImageNeverPull" not in said, said
    reconciling = k.condition(k.get("stack", CUSTOM), "Ready")
    assert reconciling.get("status") == "False", reconciling

    k.apply(k.run("kustomize", str(local_example(CUSTOM, tmp_path / "fixed"))))  # fixed
    s = ready(k, CUSTOM, within=600)
    assert s["status"]["lastUpdate"]["state"] == "succeeded"
    assert re.fullmatch(r"[a-z]+-[a-z]+", s["status"]["outputs"]["petName"]), s["status"]
    pod = k.get("pod", f"{CUSTOM}-workspace-0") or {}
    pulumi = next(c for c in pod["spec"]["containers"] if c["name"] == "pulumi")
    assert (pulumi["image"], pulumi["imagePullPolicy"]) == (WORKSPACE_IMAGE, "IfNotPresent"), pulumi
    requests, limits = pulumi["resources"]["requests"], pulumi["resources"]["limits"]
    assert (requests["cpu"], requests["memory"], limits["memory"]) == ("500m", "512Mi", "1Gi"), pulumi
    assert {"name": "PULUMI_SKIP_UPDATE_CHECK", "value": "true"} in pulumi["env"], pulumi["env"]
    k.run("delete", "stack", CUSTOM, "--wait=false")
    gone(k, "stack", CUSTOM)
    k.run("delete", "program", CUSTOM)
    k.run("delete", "pvc", f"{CUSTOM}-state", "--wait=false")


def _pod_breaking_restricted(name: str, container_context: dict[str, Any]) -> str:
    """A pod that would satisfy `restricted` but for ``container_context``, so PodSecurity's refusal
    names that one check."""
    context: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    context.update(container_context)
    if context.get("privileged"):  # API validation refuses privileged with allowPrivilegeEscalation false
        del context["allowPrivilegeEscalation"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "c",
                    "image": WORKSPACE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "1"],
                    "securityContext": context,
                }
            ],
        },
    }
    return json.dumps(pod)


def test_workspace_pods_run_under_the_enforced_restricted_profile(kube: Kube) -> None:
    """The workspaces' namespace enforces the `restricted` Pod Security Standard through the PodSecurity
    admission (its `pod-security.kubernetes.io/enforce` label), which refuses a privileged pod, a root
    pod and an escalating pod with its own message, and admits the workspace pods as pko makes them:
    PodSecurity fills in no default, so they pass as they are."""
    k = kube
    labels = (k.get("namespace", WORKSPACE_NS, "") or {})["metadata"]["labels"]
    assert {key: labels.get(key) for key in RESTRICTED} == RESTRICTED, labels
    for name, context, why in (
        (
            "privileged",
            {"privileged": True},
            'privileged (container "c" must not set securityContext.privileged=true)',
        ),
        ("as-root", {"runAsUser": 0}, 'runAsUser=0 (container "c" must not set runAsUser=0)'),
        (
            "escalating",
            {"allowPrivilegeEscalation": True},
            'allowPrivilegeEscalation != false (container "c" must set'
            " securityContext.allowPrivilegeEscalation=false)",
        ),
    ):
        with pytest.raises(AssertionError) as refused:
            k.apply(_pod_breaking_restricted(name, context))
        message = str(refused.value)
        assert f'pods "{name}" is forbidden: violates PodSecurity "restricted:latest": ' in message, message
        assert why in message, message
        assert k.get("pod", name) is None
    # The same pod without the offending setting is admitted (server-side dry run: nothing runs).
    k.run("apply", "--server-side", "--dry-run=server", "-f", "-", input=_pod_breaking_restricted("ok", {}))
    k.apply(program("restricted"))
    k.apply(stack("restricted", "programRef:\n    name: restricted"))
    ready(k, "restricted")
    pod = k.get("pod", "restricted-workspace-0")
    assert pod is not None
    assert pod["metadata"]["namespace"] == WORKSPACE_NS
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in [*spec["initContainers"], *spec["containers"]]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, container
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], container
    k.run("delete", "stack", "restricted", "--wait=false")
    gone(k, "stack", "restricted")
    k.run("delete", "program", "restricted")


SECRET_VALUE = "e2e-s3cret-value-4f1c"  # must never show in an object or a log line


def test_config_and_secrets_from_a_configmap_and_a_secret_reach_the_program_only(kube: Kube) -> None:
    """configRef and secretsRef are files the workspace pod mounts: the program sees the values, the
    Stack shows the secret as [secret], and the value is in no Stack, Workspace or Update and in no
    operator or agent log line."""
    k = kube
    k.apply(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-settings\n"
        'data:\n  greeting: hello from a ConfigMap\n  replicas: "3"\n'
    )
    k.apply(
        f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: app-creds\nstringData:\n  token: {SECRET_VALUE}\n"
    )
    k.apply(
        PROGRAM.format(name="configured", extra="").replace(
            "  outputs:\n",
            "  configuration:\n    greeting:\n      type: String\n    token:\n      type: String\n"
            "    replicas:\n      type: Number\n"
            "  outputs:\n    said: ${greeting}\n    token: ${token}\n    replicas: ${replicas}\n",
        )
    )
    manifest = stack("configured", "programRef:\n    name: configured").replace(
        "  destroyOnFinalize: true\n",
        "  destroyOnFinalize: true\n"
        "  configRef:\n"
        "    greeting: {name: app-settings, key: greeting}\n"
        "    replicas: {name: app-settings, key: replicas, json: true}\n"
        "  secretsRef:\n"
        "    token: {type: Secret, secret: {name: app-creds, key: token}}\n",
    )
    k.apply(manifest)
    s = ready(k, "configured")
    outputs = s["status"]["outputs"]
    assert outputs["said"] == "hello from a ConfigMap" and outputs["replicas"] == 3, outputs
    assert outputs["token"] == "[secret]", outputs
    shown = k.run("get", "stack,workspace,update", "-o", "yaml")
    assert SECRET_VALUE not in shown
    operator_log = k.run("-n", OPERATOR_NS, "logs", "deployment/controller-manager")
    assert SECRET_VALUE not in k.run("logs", "configured-workspace-0", "-c", "pulumi")
    if OPERATOR == "pko":
        assert SECRET_VALUE not in operator_log
    else:  # its "Update complete" line logs the outputs in clear text (docs/differences.md)
        assert SECRET_VALUE in operator_log
    k.run("delete", "stack", "configured", "--wait=false")
    gone(k, "stack", "configured")
    k.run("delete", "program", "configured")


def test_the_sample_deploys_kubernetes_objects_and_its_state_survives_pod_deletions(kube: Kube) -> None:
    """hack/up.sh's sample (config/samples, as it applies it; docs/development.md): the real engine creates a
    ConfigMap and a Deployment through pulumi-kubernetes, the secret output is masked, and the state on
    the PersistentVolumeClaim outlives the workspace pod and the operator pod: the recreated pod finds
    the stack with every resource, and the next update changes nothing."""
    k = kube
    k.apply(k.run("kustomize", str(SAMPLES)))
    s = ready(k, "hello")
    outputs = s["status"]["outputs"]
    assert outputs == {"configMap": "hello-page", "deployment": "hello", "greeting": "[secret]"}, outputs
    k.run("rollout", "status", "deployment/hello", "--timeout=300s", timeout=320)
    page = k.get("configmap", "hello-page")
    deploy = k.get("deployment", "hello")
    assert page is not None and deploy is not None

    def urns() -> list[str]:
        # --stack: a recreated pod has no stack selected until the operator (itself restarted here)
        # initializes it through the agent; this may run before that
        out = k.run("exec", "hello-workspace-0", "-c", "pulumi", "--", "sh", "-c",
                    "cd /share/workspace && pulumi stack export --stack dev")  # fmt: skip
        return sorted(r["urn"] for r in json.loads(out)["deployment"]["resources"])

    before = urns()
    assert any(u.endswith("::web") for u in before) and any(u.endswith("::page") for u in before), before
    old_pod = k.get("pod", "hello-workspace-0")
    assert old_pod is not None
    k.run("delete", "pod", "hello-workspace-0")
    k.run("-n", OPERATOR_NS, "delete", "pod", "-l", "control-plane=controller-manager")

    def new_pod_ready() -> bool:
        pod = k.get("pod", "hello-workspace-0")
        return bool(
            pod
            and pod["metadata"]["uid"] != old_pod["metadata"]["uid"]
            and all(c.get("ready") for c in pod["status"].get("containerStatuses") or [{}])
        )

    k.until("a new workspace pod", new_pod_ready, 300)
    assert urns() == before, "the recreated workspace pod lost resources"
    # The next update (asked for by annotation, as users do) finds nothing to change.
    last = s["status"]["lastUpdate"]["name"]
    k.run("annotate", "stack", "hello", "pulumi.com/reconciliation-request=after-pod-deletion", "--overwrite")

    def next_update() -> dict[str, Any] | None:
        st = k.get("stack", "hello") or {}
        lu = (st.get("status") or {}).get("lastUpdate") or {}
        done = lu.get("name") not in (None, last) and k.condition(st, "Ready").get("status") == "True"
        return st if done else None

    k.until("the next update", next_update, 600)
    assert k.get("configmap", "hello-page")["metadata"]["uid"] == page["metadata"]["uid"]  # type: ignore[index]
    assert k.get("deployment", "hello")["metadata"]["generation"] == deploy["metadata"]["generation"]  # type: ignore[index]
    k.run("exec", "hello-workspace-0", "-c", "pulumi", "--", "sh", "-c",
          "cd /share/workspace && pulumi preview -s dev --expect-no-changes --non-interactive")  # fmt: skip

    # State on a PersistentVolumeClaim: no warning that it dies with the pod.
    assert k.condition(k.get("stack", "hello"), "EphemeralBackend") == {}
    serving = k.get("pod", "hello-workspace-0")
    assert serving is not None
    pods, generations = k.delete_stack_watching("hello")
    if OPERATOR == "pko":
        # The destroy ran in the pod that held the stack: not replaced, its Workspace not respecified.
        assert pods == {serving["metadata"]["uid"]} and len(generations) == 1, (pods, generations)
    else:  # a Workspace from the saved projectInfo: a new pod for the destroy (docs/differences.md)
        assert pods - {serving["metadata"]["uid"]}, (pods, generations)
    gone(k, "deployment", "hello")  # destroyOnFinalize: Pulumi removed what it created
    gone(k, "configmap", "hello-page")
    k.run("delete", "program", "hello")
