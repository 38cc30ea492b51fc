"""A release installed as a user installs it (issue 39): from a private registry, on a node holding none of
pko's images, then upgraded to the next release with the Stack untouched.

The registry is the CNCF Distribution server (hack/registry.py) on the node's address, with TLS from a CA
of its own and htpasswd auth; the node's containerd trusts the CA (hack/localnode.py ``trust-registry``)
and every pod pulls with an imagePullSecret. Two releases are made with ``hack/release.py`` from clean
worktrees: A is HEAD, B is HEAD with the next patch version, a CHANGELOG entry and one more field in the
Stack CRD (so B's images differ from A's too: the version is in the operator and the agent).

In order (the module's tests share the cluster's state and run in file order):
1. the node's copies of pko's images are removed and the dev install's operator deleted; A's
   ``install.yaml`` + ``quickstart.yaml`` + a Program Stack -> Ready, every container's image ID the
   registry's digest; the downloaded ``kubectl-pko``, run by a Python without site-packages, prints the
   Stack's status and both versions;
2. B's ``install.yaml`` applied over A while a second Stack's update is in flight (its Program given a
   resource that takes a minute): the first Stack stays Ready, no Update runs, its workspace pod rolls
   once onto B's agent, B's CRD field is served, the state is intact; the update in flight ends once,
   succeeded, in the pod it started in (the Workspace says ``UpdateRunning`` meanwhile), and only then
   does that pod roll onto B's agent, with no second Update (issue 41);
3. the kubectl install removed (CRDs and Stacks kept), ``helm install oci://...`` of A, then ``helm
   upgrade`` to B: the same checks.
The module restores the dev install (config/local and the node's dev images) when it ends.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pko.devtools import ociclient, versions
from pko.devtools.builds import built
from pko.devtools.localnode.images import import_images, remove_images, trust_registry, untrust_registry
from pko.devtools.registry import start as start_registry

from .conftest import OPERATOR_NS, REPO, Kube
from .stacks import program, ready, stack

pytestmark = pytest.mark.pko_only("installs pko's own releases")

NODE_IP = "10.87.0.1"
PULL_SECRET = "pko-pull"
DEV_IMAGES = ["docker.io/library/pko:*", "docker.io/library/pko-agent:*", "docker.io/library/pko-workspace:*"]
STACK = "released"
BUSY = "released-busy"  # the Stack whose update is in flight when B is applied
BUSY_SECONDS = 75  # how long its update runs: past B's rollout, so B's operator finds it running
CRD_MARKER = "releaseUpgradeMarker"  # the field B's Stack CRD adds


@dataclass(frozen=True)
class Release:
    version: str
    dist: Path

    @property
    def pins(self) -> dict[str, str]:
        """name (pko, pko-agent, pko-workspace) -> ``HOST/PATH/NAME:V@sha256:...``"""
        lines = (self.dist / "images.txt").read_text().split()
        return {line.rsplit("/", 1)[1].split(":", 1)[0]: line for line in lines}

    def digest(self, name: str) -> str:
        return self.pins[name].split("@", 1)[1]


@dataclass(frozen=True)
class Registry:
    address: str
    ca: Path
    username: str
    password: str

    @property
    def ref(self) -> str:
        return f"{self.address}/pko"


def _git(tree: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=pko e2e", "-c", "user.email=e2e@pko.invalid", *args]
    return subprocess.run(cmd, cwd=tree, check=True, capture_output=True, text=True).stdout.strip()


def _next_patch(version: str) -> str:
    major, minor, patch = (int(x) for x in re.findall(r"\d+", version)[:3])
    return f"{major}.{minor}.{patch + 1}"


def _make_b(tree: Path, version: str) -> None:
    """Tree B: the next patch version, its CHANGELOG entry, and one more optional Stack spec field."""
    version_py = tree / "pko" / "version.py"
    text = version_py.read_text()
    version_py.write_text(re.sub(r'VERSION: Final = "[^"]+"', f'VERSION: Final = "{version}"', text))
    changelog = tree / "CHANGELOG.md"
    entry = f"## [{version}] - 2026-12-06\n\n### Added\n- `spec.{CRD_MARKER}` (the e2e upgrade's change).\n\n"
    changelog.write_text(
        changelog.read_text().replace("## [Unreleased]\n\n", f"## [Unreleased]\n\n{entry}", 1)
    )
    crds = [
        *(tree / "config" / "crd" / "bases").glob("*stacks*.yaml"),
        tree / "charts/pko/crds/stacks.pulumi.com.yaml",
    ]
    for crd in crds:
        doc = yaml.safe_load(crd.read_text())
        for served in doc["spec"]["versions"]:
            spec = served["schema"]["openAPIV3Schema"]["properties"]["spec"]
            spec["properties"][CRD_MARKER] = {"type": "string", "description": "e2e: B's new field"}
        crd.write_text(yaml.safe_dump(doc, sort_keys=False))
    _git(tree, "commit", "-q", "-am", f"e2e: release {version}")


def _release(tree: Path, version: str, registry: Registry, dist: Path, kube: Kube) -> Release:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PATH": kube.env["PATH"],
        "PKO_REGISTRY_USERNAME": registry.username,
        "PKO_REGISTRY_PASSWORD": registry.password,
    }
    cmd = [
        sys.executable, str(tree / "hack" / "release.py"), f"v{version}",
        "--registry", registry.ref, "--ca-file", str(registry.ca),
        "--source-url", "https://pko.invalid/pko", "--dist", str(dist), "--kubectl", kube.kubectl,
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, f"release {version} failed:\n{proc.stderr[-4000:]}"
    return Release(version, dist / version)


@pytest.fixture(scope="module")
def registry(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = start_registry(tmp_path_factory.mktemp("registry"), NODE_IP)
    trust_registry(reg.address, reg.ca)
    try:
        yield Registry(reg.address, reg.ca, reg.username, reg.password)
    finally:
        reg.stop()
        untrust_registry(reg.address)


@pytest.fixture(scope="module")
def releases(
    kube: Kube, registry: Registry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Release]]:
    """A (HEAD) and B (the next patch), each released from a worktree of its own."""
    from pko.version import VERSION

    work = tmp_path_factory.mktemp("releases")
    made: dict[str, Release] = {}
    trees = []
    try:
        for name in ("A", "B"):
            tree = Path(tempfile.mkdtemp(prefix=f"pko-e2e-{name}-"))
            _git(REPO, "worktree", "add", "--detach", str(tree), "HEAD")
            trees.append(tree)
            version = VERSION if name == "A" else _next_patch(VERSION)
            if name == "B":
                _make_b(tree, version)
            made[name] = _release(tree, version, registry, work / "dist", kube)
        yield made
    finally:
        for tree in trees:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)


@pytest.fixture(scope="module")
def bare_node(kube: Kube, registry: Registry) -> Iterator[None]:
    """The dev install's operator deleted and the node's copies of pko's images removed; put back after."""
    kube.run(
        "-n", OPERATOR_NS, "delete", "deployment", "controller-manager", "--ignore-not-found", "--wait=true"
    )
    kube.until(
        "the dev operator's pods gone",
        lambda: (
            not kube.json("-n", OPERATOR_NS, "get", "pods", "-l", "control-plane=controller-manager")["items"]
        ),
        120,
    )
    remove_images(DEV_IMAGES)
    assert remove_images(DEV_IMAGES) == [], "the node still holds pko images"
    for ns in (OPERATOR_NS, "default"):
        secret = kube.run(
            "-n", ns, "create", "secret", "docker-registry", PULL_SECRET,
            f"--docker-server={registry.address}", f"--docker-username={registry.username}",
            f"--docker-password={registry.password}",
            "--dry-run=client", "-o", "yaml",
        )  # fmt: skip
        kube.run("apply", "--server-side", "-f", "-", input=secret)
    _pull_with_secret(kube, OPERATOR_NS, "controller-manager")
    _pull_with_secret(kube, "default", "pulumi")
    try:
        yield
    finally:
        _restore_dev_install(kube)


def _pull_with_secret(kube: Kube, namespace: str, service_account: str) -> None:
    """The ServiceAccount's pods pull with the registry's secret (a user's way, before pods exist)."""
    kube.run("-n", namespace, "create", "serviceaccount", service_account, check=False)
    patch = json.dumps({"imagePullSecrets": [{"name": PULL_SECRET}]})
    kube.run("-n", namespace, "patch", "serviceaccount", service_account, "-p", patch)


def _restore_dev_install(kube: Kube) -> None:
    kube.run("delete", "stack", STACK, BUSY, "--ignore-not-found", "--wait=false", check=False)
    kube.until(
        "the release's Stacks destroyed",
        lambda: kube.get("stack", STACK) is None and kube.get("stack", BUSY) is None,
        600,
    )
    _helm(kube, "uninstall", "pko", "-n", OPERATOR_NS, "--wait", check=False)
    kube.run(
        "-n", OPERATOR_NS, "delete", "deployment", "controller-manager", "--ignore-not-found", check=False
    )
    cache = versions.cache_dir() / "images"
    import_images([cache / f"{name}.oci.tar" for name in ("pko", "pko-agent", "pko-workspace")])
    kube.run("apply", "--server-side", "--force-conflicts", "-k", str(REPO / "config" / "local"), timeout=300)
    kube.run(
        "-n", OPERATOR_NS, "rollout", "status", "deployment/controller-manager", "--timeout=300s", timeout=320
    )


# --- what the tests look at ---------------------------------------------------------------------------


def _image_ids(pod: dict[str, Any]) -> dict[str, str]:
    """container name -> the digest the kubelet pulled (``status.*containerStatuses[].imageID``)."""
    status = pod.get("status") or {}
    statuses = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
    return {s["name"]: s.get("imageID", "").rsplit("@", 1)[-1] for s in statuses}


def _operator_pod(kube: Kube) -> dict[str, Any]:
    pods = kube.json("-n", OPERATOR_NS, "get", "pods", "-l", "control-plane=controller-manager")["items"]
    running = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert len(running) == 1, [p["metadata"]["name"] for p in pods]
    return dict(running[0])


def _wait_operator(kube: Kube, release: Release) -> None:
    kube.run(
        "-n", OPERATOR_NS, "rollout", "status", "deployment/controller-manager", "--timeout=300s", timeout=320
    )
    kube.until(
        f"the operator runs {release.version}'s image",
        lambda: _image_ids(_operator_pod(kube)).get("manager") == release.digest("pko"),
        120,
    )


def _updates(kube: Kube, name: str = STACK) -> set[str]:
    items = kube.json("get", "updates", "-l", f"pulumi.com/stack-name={name}")["items"]
    return {u["metadata"]["name"] for u in items}


def _ready(kube: Kube) -> bool:
    stack = kube.get("stack", STACK)
    return kube.condition(stack, "Ready").get("status") == "True"


def _workspace_pod(kube: Kube, name: str = STACK) -> dict[str, Any] | None:
    return kube.get("pod", f"{name}-workspace-0")


def _on_agent(kube: Kube, release: Release, name: str = STACK) -> bool:
    pod = _workspace_pod(kube, name)
    if not pod or pod["metadata"].get("deletionTimestamp"):
        return False
    ids = _image_ids(pod)
    ready = kube.condition(pod, "Ready").get("status") == "True"
    return ready and ids.get("bootstrap") == release.digest("pko-agent")


def _settled_after_upgrade(kube: Kube, release: Release, before: dict[str, Any]) -> None:
    """The Stack untouched by an upgrade to ``release``: its pod rolls once onto the new agent, no Update
    runs, the outputs and the last update are what they were."""
    kube.until(f"the workspace pod on {release.version}'s agent", lambda: _on_agent(kube, release), 300)
    time.sleep(20)  # long enough for a Stack reconcile that would start an Update to have started it
    stack = kube.get("stack", STACK) or {}
    assert _ready(kube), kube.diagnose()
    assert _updates(kube) == before["updates"], "an Update ran because of the upgrade alone"
    assert stack["status"].get("outputs") == before["outputs"]
    assert stack["status"]["lastUpdate"] == before["lastUpdate"]
    pod = _workspace_pod(kube) or {}
    assert pod["metadata"]["uid"] not in before["pods"], "the workspace pod did not roll"


def _snapshot(kube: Kube) -> dict[str, Any]:
    stack = kube.get("stack", STACK) or {}
    pod = _workspace_pod(kube) or {"metadata": {"uid": ""}}
    return {
        "updates": _updates(kube),
        "outputs": stack["status"].get("outputs"),
        "lastUpdate": stack["status"]["lastUpdate"],
        "pods": {pod["metadata"]["uid"]},
    }


def _start_update(kube: Kube, name: str) -> dict[str, Any]:
    """Give ``name``'s Program a resource that takes BUSY_SECONDS; return once its Update runs."""
    before = _updates(kube, name)
    kube.apply(program(name, hang=BUSY_SECONDS))

    def running() -> dict[str, Any] | None:
        for u in kube.json("get", "updates", "-l", f"pulumi.com/stack-name={name}")["items"]:
            progressing = kube.condition(u, "Progressing")
            if u["metadata"]["name"] not in before and progressing.get("reason") == "Progressing":
                return dict(u)
        return None

    update = kube.until(f"{name}'s update running", running, 180, 0.5)
    # The pod it runs in, read once it runs: the Program's change itself rolled the pod first.
    pod = (_workspace_pod(kube, name) or {})["metadata"]["uid"]
    return {"name": update["metadata"]["name"], "pod": pod, "before": before}


def _ran_once_then_rolled(kube: Kube, release: Release, name: str, busy: dict[str, Any]) -> None:
    """The update in flight across the upgrade ended once, succeeded, in the pod it started in, while
    the Workspace held the roll; then the pod rolled onto ``release``'s agent and no Update followed."""
    reasons: set[str] = set()
    pods: set[str] = set()

    def ended() -> dict[str, Any] | None:
        ws = kube.get("workspace", name)
        reasons.add(str(kube.condition(ws, "Ready").get("reason")))
        pod = _workspace_pod(kube, name)
        if pod is not None:
            pods.add(pod["metadata"]["uid"])
        update = kube.get("update", busy["name"])
        return update if kube.condition(update, "Complete").get("status") == "True" else None

    update = kube.until(f"the update in flight ({busy['name']}) ended", ended, 300, 0.5)
    failed = kube.condition(update, "Failed")
    assert failed.get("status") == "False", (failed, update.get("status", {}).get("message"))
    assert "UpdateRunning" in reasons, f"the new operator never held the roll: {reasons}"
    assert pods == {busy["pod"]}, "the workspace pod was replaced while its update ran"
    kube.until(f"{name}'s pod on {release.version}'s agent", lambda: _on_agent(kube, release, name), 300)
    ready(kube, name)
    assert _updates(kube, name) - busy["before"] == {busy["name"]}, "the update ran again"


def _helm(kube: Kube, *args: str, check: bool = True, input: str | None = None) -> str:
    binary = str(built("build-helm.sh") / "bin" / "helm")
    proc = subprocess.run(
        [binary, *args], env=kube.env, capture_output=True, text=True, timeout=600, input=input
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args[:2])} failed: {proc.stderr}")
    return proc.stdout


# --- the tests ----------------------------------------------------------------------------------------


def test_install_yaml_from_the_registry_runs_a_stack_on_a_node_without_our_images(
    kube: Kube, releases: dict[str, Release], bare_node: None
) -> None:
    a = releases["A"]
    kube.run("apply", "--server-side", "-f", str(a.dist / "install.yaml"), timeout=300)
    _wait_operator(kube, a)
    kube.run("apply", "--server-side", "-f", str(a.dist / "quickstart.yaml"))
    for name in (STACK, BUSY):
        kube.apply(program(name) + "---\n" + stack(name, f"programRef:\n    name: {name}"))
    ready(kube, STACK)
    ready(kube, BUSY)
    ids = _image_ids(_workspace_pod(kube) or {})
    assert ids["bootstrap"] == a.digest("pko-agent") and ids["pulumi"] == a.digest("pko-workspace"), ids
    assert kube.get("configmap", f"{STACK}-settings") is not None


def test_the_downloaded_plugin_runs_on_a_bare_python(kube: Kube, releases: dict[str, Release]) -> None:
    a = releases["A"]
    plugin = a.dist / "kubectl-pko"
    env = {"KUBECONFIG": str(kube.kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    bare = [sys.executable, "-I", "-S", str(plugin)]
    status = subprocess.run(
        [*bare, "status", STACK, "-n", "default"], env=env, capture_output=True, text=True
    )
    assert status.returncode == 0, status.stderr
    assert STACK in status.stdout and "Ready" in status.stdout, status.stdout
    version = subprocess.run([*bare, "version"], env=env, capture_output=True, text=True)
    assert version.returncode == 0, version.stderr
    assert version.stdout.count(a.version) >= 2, version.stdout  # the plugin's and the operator's
    sums = subprocess.run(["sha256sum", "--check", "SHA256SUMS"], cwd=a.dist, capture_output=True, text=True)
    assert sums.returncode == 0, sums.stdout + sums.stderr


def test_the_released_images_carry_the_version_labels(
    releases: dict[str, Release], registry: Registry
) -> None:
    client = ociclient.Registry(registry.address, registry.username, registry.password, registry.ca)
    for name, pinned in releases["A"].pins.items():
        repository = pinned.split("/", 1)[1].split(":", 1)[0]
        manifest = client.get_manifest(repository, releases["A"].digest(name))
        config = json.loads(client.get_blob(repository, manifest["config"]["digest"]))
        labels = config["config"]["Labels"]
        assert labels["org.opencontainers.image.version"] == releases["A"].version, name
        assert re.fullmatch(r"[0-9a-f]{40}", labels["org.opencontainers.image.revision"]), name


@pytest.mark.timeout(600)  # the upgrade, then an update of BUSY_SECONDS and two pod rolls
def test_upgrading_with_install_yaml_leaves_the_stack_untouched(
    kube: Kube, releases: dict[str, Release]
) -> None:
    b = releases["B"]
    before = _snapshot(kube)
    busy = _start_update(kube, BUSY)
    kube.run("apply", "--server-side", "-f", str(b.dist / "install.yaml"), timeout=300)
    _wait_operator(kube, b)
    _ran_once_then_rolled(kube, b, BUSY, busy)
    crd = kube.get("crd", "stacks.pulumi.com", "") or {}
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert CRD_MARKER in spec, "B's CRD field is not served"
    _settled_after_upgrade(kube, b, before)


def test_helm_install_and_upgrade_from_the_oci_chart(
    kube: Kube, releases: dict[str, Release], registry: Registry, tmp_path: Path
) -> None:
    a, b = releases["A"], releases["B"]
    # Off with the kubectl install, but for the CRDs (and so every Stack) and the namespace.
    objs = [o for o in yaml.safe_load_all((b.dist / "install.yaml").read_text()) if o]
    kept = {"CustomResourceDefinition", "Namespace"}
    gone = yaml.safe_dump_all([o for o in objs if o["kind"] not in kept])
    kube.run("delete", "--ignore-not-found", "--wait=true", "-f", "-", input=gone, timeout=300)
    config = ["--registry-config", str(tmp_path / "registry.json")]
    _helm(kube, "registry", "login", registry.address, "--username", registry.username,
          "--password-stdin", "--ca-file", str(registry.ca), *config, input=registry.password)  # fmt: skip
    chart = f"oci://{registry.ref}/charts/pko"
    common = ["-n", OPERATOR_NS, "--ca-file", str(registry.ca), *config, "--wait", "--timeout", "5m",
              "--set", f"imagePullSecrets[0].name={PULL_SECRET}"]  # fmt: skip
    before = _snapshot(kube)
    _helm(kube, "install", "pko", chart, "--version", a.version, *common)
    _wait_operator(kube, a)
    _settled_after_upgrade(kube, a, before)
    before = _snapshot(kube)
    # The documented upgrade: the new CRDs first (Helm never upgrades a chart's crds/), then the chart.
    crds = _helm(kube, "show", "crds", chart, "--version", b.version, "--ca-file", str(registry.ca), *config)
    assert CRD_MARKER in crds
    kube.run("apply", "--server-side", "-f", "-", input=crds)
    _helm(kube, "upgrade", "pko", chart, "--version", b.version, *common)
    _wait_operator(kube, b)
    _settled_after_upgrade(kube, b, before)


def test_a_pinned_digest_the_registry_lacks_is_an_image_pull_error_naming_it(
    kube: Kube, releases: dict[str, Release], bare_node: None
) -> None:
    missing = "sha256:" + "0" * 64
    image = releases["A"].pins["pko"].split("@", 1)[0] + "@" + missing
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pinned-missing"},
        "spec": {
            "serviceAccountName": "pulumi",
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{
                "name": "manager", "image": image,
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }  # fmt: skip
    kube.apply(json.dumps(pod))
    try:

        def waiting() -> dict[str, Any] | None:
            statuses = ((kube.get("pod", "pinned-missing") or {}).get("status") or {}).get(
                "containerStatuses"
            )
            state = (statuses or [{}])[0].get("state", {}).get("waiting") or {}
            return state if state.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

        state = kube.until("the pod's image pull fails", waiting, 120)
        assert missing in state.get("message", ""), state
    finally:
        kube.run("delete", "pod", "pinned-missing", "--ignore-not-found", "--wait=false")
