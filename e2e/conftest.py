"""The end-to-end suite: a real node on this machine (hack/localnode.py), the images built offline
(hack/build-images.sh), pko installed with ``kubectl apply --server-side -k config/local`` and running
in the cluster as its Deployment. Tests drive it with kubectl, as users do: the kubectl built with the
node's Kubernetes (hack/build-kubernetes.sh), never the machine's, which may be outside the version skew.
The workspaces' namespace (``default``) enforces the ``restricted`` Pod Security Standard, as
hack/up.sh labels it (this suite labels it before it installs pko).

A machine that cannot run a node (not root, no cgroups, no kube binaries buildable) skips the whole
suite and says why; ``PKO_E2E_REQUIRE=1`` (set by ``.ci/run``) turns that skip into a failure.

The conformance lane (issue 26): ``PKO_E2E_OPERATOR=go`` installs the Go operator (v2.9.0, built by
hack/build-peer.sh, from its own ``config/quickstart``) instead of pko, and the same tests run against
it; what they find differs is written up in docs/differences.md. One thing changes for it, at one
edge (``Kube.apply``): every Stack this suite applies gets the local workspace image
(``pko-workspace:dev``, pulled ``IfNotPresent``) unless it names one, since the Go operator's default
(``pulumi/pulumi:latest-nonroot``) is pulled from Docker Hub, which the node cannot reach. Tests marked
``pko_only`` (pko features the Go operator does not have) are skipped there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pko.devtools import kubectl
from pko.devtools.builds import built
from pko.devtools.gitserver import ServerTLS, server_tls
from pko.devtools.gitssh import fixed_host_key, known_hosts_line
from pko.devtools.localcluster import ensure_binaries
from pko.devtools.localnode.images import wait_late_import
from pko.devtools.waiting import NotReached, until

REPO = Path(__file__).resolve().parents[1]
OPERATOR_NS = "pulumi-kubernetes-operator"
WORKSPACE_NS = "default"
# "pko" (default) or "go": which operator the suite installs (the conformance lane; see above).
OPERATOR = os.environ.get("PKO_E2E_OPERATOR", "pko")
NODE_IP = "10.87.0.1"  # hack/localnode.py: the node's own veth address, where tests serve what pods reach
# The git server over SSH that test_languages.py runs on NODE_IP (port 22) for examples/git-ssh: its host
# key is the same in every run, so the operator trusts it from install (pko: GIT_SSH_KNOWN_HOSTS; the Go
# operator: a known_hosts file, with_git_ssh_known_hosts_file) and examples/components/local-node writes
# it in the example's known_hosts, as data.
GIT_SSH_HOST_KEY = fixed_host_key("e2e git-ssh")
LOCAL_WORKSPACE_IMAGE = "pko-workspace:dev"  # the real engine, built by hack/build-images.sh
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


def _cannot_run_a_node() -> str | None:
    if os.geteuid() != 0:
        return "the e2e suite runs a kubelet and containerd, which need root"
    if not Path("/sys/fs/cgroup/memory").exists() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "no cgroup hierarchy: a kubelet cannot run here"
    return None


class Kube:
    """kubectl against the node, plus waiting helpers."""

    def __init__(self, kubeconfig: Path, bin_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.kubectl = str(bin_dir / "kubectl")
        path = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PATH": path}

    def run(self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120) -> str:
        """The node's kubectl (KUBECONFIG and PATH from :attr:`env`, for ``kubectl pko``): its output."""
        return kubectl.run(
            *args, binary=self.kubectl, env=self.env, input=input, check=check, timeout=timeout
        ).stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json"))

    def get(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        out = subprocess.run(
            [self.kubectl, "get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found"],
            capture_output=True, text=True, env=self.env, timeout=60,
        )  # fmt: skip
        return json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else None

    def apply(self, manifest: str, namespace: str = "default") -> None:
        if OPERATOR == "go":
            manifest = with_local_workspace_image(manifest)
        self.run("apply", "--server-side", "-n", namespace, "-f", "-", input=manifest)

    def until(self, what: str, probe: Callable[[], Any], within: float = 300, interval: float = 2) -> Any:
        """:func:`pko.devtools.waiting.until`, with what the cluster shows when it fails."""
        try:
            return until(what, probe, within=within, interval=interval)
        except NotReached as e:
            raise NotReached(f"{e}\n{self.diagnose()}") from None

    def established(self, crd: str, within: float = 60) -> None:
        """Wait until CustomResourceDefinition ``crd`` is Established (its kind is served)."""
        self.until(
            f"CRD {crd} established",
            lambda: self.condition(self.get("crd", crd, ""), "Established").get("status") == "True",
            within,
            1,
        )

    def delete_stack_watching(self, name: str, within: float = 600) -> tuple[set[str], set[int]]:
        """``kubectl delete stack`` and wait until it is gone, noting every uid its workspace pod had
        and every generation its Workspace had meanwhile (a destroy that replaced the pod shows two)."""
        pods: set[str] = set()
        generations: set[int] = set()
        self.run("delete", "stack", name, "--wait=false")

        def gone() -> bool:
            pod = self.get("pod", f"{name}-workspace-0")
            ws = self.get("workspace", name)
            if pod is not None and not pod["metadata"].get("deletionTimestamp"):
                pods.add(pod["metadata"]["uid"])
            if ws is not None and not ws["metadata"].get("deletionTimestamp"):
                generations.add(int(ws["metadata"]["generation"]))
            return self.get("stack", name) is None

        self.until(f"stack {name} deleted", gone, within, 1)
        return pods, generations

    def condition(self, obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
        for c in ((obj or {}).get("status") or {}).get("conditions") or []:
            if c.get("type") == type_:
                return dict(c)
        return {}

    def diagnose(self) -> str:
        parts = [
            self.run("get", "stacks,workspaces,updates,pods", "-A", "-o", "wide", check=False),
            self.run("-n", OPERATOR_NS, "logs", "deployment/controller-manager", "--tail=40", check=False),
        ]
        return "\n".join(parts)


def with_local_workspace_image(manifest: str) -> str:
    """Each Stack in ``manifest`` with ``workspaceTemplate.spec.image`` set to the local workspace image
    where it names none (the conformance lane's one change to what tests apply)."""
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    for doc in docs:
        if doc.get("kind") == "Stack":
            template = doc["spec"].setdefault("workspaceTemplate", {}).setdefault("spec", {})
            if not template.get("image"):
                template["image"] = LOCAL_WORKSPACE_IMAGE
                template["imagePullPolicy"] = "IfNotPresent"
    return yaml.safe_dump_all(docs)


def with_git_ssh_known_hosts(manifest: str) -> str:
    """``manifest`` (pko's install) with the operator trusting the suite's git server over SSH, as
    docs/stacks.md tells users to give the operator its known_hosts: the contents in GIT_SSH_KNOWN_HOSTS."""
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    for doc in docs:
        if doc.get("kind") == "Deployment" and doc["metadata"]["name"] == "controller-manager":
            (manager,) = [c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "manager"]
            line = known_hosts_line(NODE_IP, 22, GIT_SSH_HOST_KEY)
            manager.setdefault("env", []).append({"name": "GIT_SSH_KNOWN_HOSTS", "value": line})
    return yaml.safe_dump_all(docs)


# The suite's git servers over HTTPS on NODE_IP (git_tls) present a certificate of a CA of the suite's own,
# which both operators trust as docs/stacks.md ("A git server with a private CA") tells users to: the
# CA in a ConfigMap that SSL_CERT_FILE names (Go's crypto/x509 and OpenSSL both read it), in the
# operator's pod (with_git_ca: the install) and in each workspace pod (trusting_git_ca: the Stack's pod
# template, the `fetch` and `pulumi` containers, which merge by name into either operator's).
GIT_CA_CONFIGMAP = "git-ca"
GIT_CA_DIR = "/etc/git-ca"
# The Go operator's manager trusts the suite's git server over SSH as go-git finds known_hosts (v2.9.0's
# branch lookup, go-git v5, and its agent's fetch, go-git v6, alike): a file named by SSH_KNOWN_HOSTS,
# else ~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts; no contents from the environment. So the line
# is a ConfigMap mounted into its pod (with_git_ssh_known_hosts_file), as its users give it one.
GIT_SSH_CONFIGMAP = "git-ssh-known-hosts"
GIT_SSH_DIR = "/etc/git-ssh"


def _configmap(namespace: str, name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": data,
    }


def _git_ca_configmap(namespace: str, ca_pem: str) -> dict[str, Any]:
    return _configmap(namespace, GIT_CA_CONFIGMAP, {"ca.crt": ca_pem})


def _mount(container: dict[str, Any], configmap: str, directory: str, env: str, value: str) -> None:
    """``container`` with ConfigMap volume ``configmap`` at ``directory`` and ``env`` set to ``value``."""
    container.setdefault("env", []).append({"name": env, "value": value})
    mount = {"name": configmap, "mountPath": directory, "readOnly": True}
    container.setdefault("volumeMounts", []).append(mount)


def _trusting(container: dict[str, Any]) -> None:
    _mount(container, GIT_CA_CONFIGMAP, GIT_CA_DIR, "SSL_CERT_FILE", f"{GIT_CA_DIR}/ca.crt")


def _named(containers: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [c for c in containers if c.get("name") == name]
    if not found:
        containers.append({"name": name})
        return containers[-1]
    return found[0]


def _with_manager_file(manifest: str, configmap: str, directory: str, env: str, file: str, text: str) -> str:
    """An operator's install (pko's or the Go operator's: both a Deployment ``controller-manager`` with a
    container ``manager``) with ``text`` as ``file`` of ConfigMap ``configmap`` (made in the operator's
    namespace), mounted at ``directory`` in the manager, whose ``env`` names that file."""
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    for doc in docs:
        if doc.get("kind") == "Deployment" and doc["metadata"]["name"] == "controller-manager":
            pod = doc["spec"]["template"]["spec"]
            _mount(_named(pod["containers"], "manager"), configmap, directory, env, f"{directory}/{file}")
            pod.setdefault("volumes", []).append({"name": configmap, "configMap": {"name": configmap}})
    docs.append(_configmap(OPERATOR_NS, configmap, {file: text}))
    return yaml.safe_dump_all(docs)


def with_git_ssh_known_hosts_file(manifest: str) -> str:
    """``manifest`` (the Go operator's install) with the manager trusting the suite's git server over
    SSH: its known_hosts line in a file SSH_KNOWN_HOSTS names (go-git's way; docs/differences.md)."""
    line = known_hosts_line(NODE_IP, 22, GIT_SSH_HOST_KEY)
    env = "SSH_KNOWN_HOSTS"
    return _with_manager_file(manifest, GIT_SSH_CONFIGMAP, GIT_SSH_DIR, env, "known_hosts", line)


def with_git_ca(manifest: str, ca_pem: str) -> str:
    """An operator's install (pko's or the Go operator's) with the manager trusting ``ca_pem`` for its
    branch lookups."""
    return _with_manager_file(manifest, GIT_CA_CONFIGMAP, GIT_CA_DIR, "SSL_CERT_FILE", "ca.crt", ca_pem)


def trusting_git_ca(manifest: str) -> str:
    """Each Stack in ``manifest`` with its workspace pods trusting the suite's git CA (the ConfigMap the
    ``kube`` fixture makes in the workspaces' namespace): its fetch and its program."""
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    for doc in docs:
        if doc.get("kind") == "Stack":
            template = doc["spec"].setdefault("workspaceTemplate", {}).setdefault("spec", {})
            pod = template.setdefault("podTemplate", {}).setdefault("spec", {})
            _trusting(_named(pod.setdefault("initContainers", []), "fetch"))
            _trusting(_named(pod.setdefault("containers", []), "pulumi"))
            pod.setdefault("volumes", []).append(
                {"name": GIT_CA_CONFIGMAP, "configMap": {"name": GIT_CA_CONFIGMAP}}
            )
    return yaml.safe_dump_all(docs)


@pytest.fixture(scope="session")
def git_tls(tmp_path_factory: pytest.TempPathFactory) -> ServerTLS:
    """The certificate the suite's HTTPS git servers on NODE_IP present (``serve_git(..., tls=)``),
    and its CA, which the operator trusts from its install on and workspace pods by trusting_git_ca."""
    return server_tls(tmp_path_factory.mktemp("git-tls"), NODE_IP)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pko_only(why): a pko feature the Go operator lacks (skipped there)")


# hack/test.sh boots the node with the images every module needs and builds SeaweedFS (the S3 modules'
# store, about 10 minutes cold) beside the first modules, importing it when built: it names here the
# file its build writes its exit status to (pko.devtools.localnode.images.wait_late_import).
LATE_IMAGES = os.environ.get("PKO_E2E_LATE_IMAGES", "")
LATE_IMAGES_WITHIN = 1200.0  # s: the S3 modules run last, so they wait for it only on a cold cache
LATE_FIXTURE = "seaweedfs_image"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The modules that need SeaweedFS (those using the seaweedfs_image fixture) run after the others, so
    # its build beside the first modules is off their path; test_release.py swaps the dev install for
    # released images and puts it back at its end: it runs last, so a failure to put it back costs no
    # other module. Files keep their order otherwise (pytest's: by name).
    late = {item.path for item in items if LATE_FIXTURE in getattr(item, "fixturenames", ())}
    items.sort(key=lambda item: (item.path.name == "test_release.py", item.path in late))
    if OPERATOR != "go":
        return
    for item in items:
        marker = item.get_closest_marker("pko_only")
        if marker is not None:
            item.add_marker(pytest.mark.skip(reason=f"pko only: {marker.args[0] if marker.args else ''}"))


def go_operator_quickstart() -> Path:
    """The Go operator's own quickstart kustomization (hack/build-peer.sh), its image imported into the
    node: ``kubectl apply --server-side --force-conflicts -k`` it to install the Go operator."""
    dist = built("build-peer.sh", show_stderr=True)
    from pko.devtools.localnode.images import import_images

    import_images([dist / "pulumi-kubernetes-operator.oci.tar"])
    return dist / "config" / "quickstart"


def pko_install(k: Kube, git_ca: str) -> str:
    """pko's install as the suite applies it (``config/local``), its manager trusting the suite's git
    servers: their CA (HTTPS) and host key (SSH)."""
    return with_git_ca(with_git_ssh_known_hosts(k.run("kustomize", str(REPO / "config" / "local"))), git_ca)


def go_install(k: Kube, git_ca: str) -> str:
    """The Go operator's install from its own quickstart manifests (its image imported into the node),
    as its users install it, its manager trusting the suite's git servers: their CA (HTTPS) and host
    key (SSH, as a known_hosts file: with_git_ssh_known_hosts_file)."""
    quickstart = k.run("kustomize", str(go_operator_quickstart()))
    return with_git_ca(with_git_ssh_known_hosts_file(quickstart), git_ca)


def _install_go_operator(k: Kube, git_ca: str) -> None:
    """The Go operator in place of pko (the two serve the same CRD groups)."""
    quickstart = go_install(k, git_ca)
    k.run("delete", "--ignore-not-found", "-k", str(REPO / "config" / "local"), timeout=600)
    k.run("apply", "--server-side", "--force-conflicts", "-f", "-", input=quickstart, timeout=300)


@pytest.fixture(scope="session")
def seaweedfs_image() -> None:
    """SeaweedFS's image (localhost/pko-seaweedfs:dev) on the node, for the modules that run it: once
    hack/test.sh's build of it beside the first modules has imported it (an error naming its log if
    that failed). A node this suite boots itself (the ``kube`` fixture) has it from its boot."""
    if LATE_IMAGES:
        wait_late_import(Path(LATE_IMAGES), LATE_IMAGES_WITHIN)


@pytest.fixture(scope="session")
def kube(git_tls: ServerTLS) -> Iterator[Kube]:
    reason = _cannot_run_a_node()
    if reason:
        if os.environ.get("PKO_E2E_REQUIRE") == "1":
            pytest.fail(f"e2e required but cannot run: {reason}")
        pytest.skip(f"e2e skipped: {reason}")
    python = sys.executable
    env = {**os.environ, "PYTHON": python}
    bin_dir = ensure_binaries()  # what `hack/localcluster.py build` prints
    if os.environ.get("PKO_E2E_NODE_BOOTED") != "1":  # hack/test.sh boots it while the unit suite runs
        subprocess.run(
            ["bash", str(REPO / "hack" / "build-images.sh")], check=True, env=env, stdout=subprocess.DEVNULL
        )
        subprocess.run(
            [sys.executable, str(REPO / "hack" / "localnode.py"), "up"], check=True, stdout=subprocess.DEVNULL
        )
    k = Kube(REPO / ".node" / "kubeconfig", bin_dir)
    try:
        # Before any workspace pod: the PodSecurity admission refuses what `restricted` refuses there.
        k.run(
            "label",
            "--overwrite",
            "namespace",
            WORKSPACE_NS,
            *(f"{key}={value}" for key, value in RESTRICTED.items()),
        )
        git_ca = git_tls.ca.read_text()
        if OPERATOR == "go":
            _install_go_operator(k, git_ca)
        else:
            k.run("apply", "--server-side", "-f", "-", input=pko_install(k, git_ca))
        k.apply(yaml.safe_dump(_git_ca_configmap(WORKSPACE_NS, git_ca)), WORKSPACE_NS)
        for crd in (
            "stacks.pulumi.com",
            "programs.pulumi.com",
            "workspaces.auto.pulumi.com",
            "updates.auto.pulumi.com",
        ):
            k.established(crd)
        k.run(
            "-n",
            OPERATOR_NS,
            "rollout",
            "status",
            "deployment/controller-manager",
            "--timeout=300s",
            timeout=320,
        )
        # Programs deploy Kubernetes objects with the workspaces' ServiceAccount (default/pulumi).
        k.run("apply", "--server-side", "-n", "default", "-f", str(REPO / "config" / "samples" / "rbac.yaml"))
        yield k
    finally:
        if os.environ.get("PKO_E2E_KEEP") != "1":
            subprocess.run([sys.executable, str(REPO / "hack" / "localnode.py"), "down"], check=False)
