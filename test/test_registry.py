"""hack/registry.py: the private registry (CNCF Distribution, built by hack/build-registry.sh) answers as a
private registry does: TLS verified against its own CA, htpasswd auth (401 without credentials, 200 with),
an image pushed with buildah by digest is served by that digest, a push with wrong credentials is refused,
and a manifest can be deleted. On the loopback, in a state directory of the test's own.

And the node's side of it (hack/localnode.py), against a containerd 1.6 of the test's own run with the
node's own config: the hosts.toml ``trust_registry`` writes makes containerd trust the registry's CA, read
at each pull without a restart, both by ``ctr --hosts-dir`` and by the CRI's PullImage (what the kubelet
calls, with a pull secret's credentials: 401 without them); ``remove_images`` deletes whole images (the
CRI's tag, digest and id names) with their content (the GC ran), which ``import_images`` puts back."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from pko.devtools import registry
from pko.devtools.localcluster import _apt_install
from pko.devtools.localnode import components
from pko.devtools.localnode.components import _containerd_config
from pko.devtools.localnode.images import (
    _images,
    images_to_remove,
    import_images,
    remove_images,
    snapshotter,
    trust_registry,
    untrust_registry,
)
from pko.devtools.localnode.node import HACK, Node
from pko.devtools.versions import versions

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"

# The first test builds the registry when the cache has none (about 3 min cold on 2 cores).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@functools.cache
def _buildah() -> str:
    if shutil.which("buildah") is None:
        if os.geteuid() != 0:
            pytest.skip("buildah is not installed (Debian package buildah; hack/build-images.sh installs it)")
        _apt_install("buildah")
    return "buildah"


class Buildah:
    """buildah with vfs storage of its own (hack/build-images.sh's ``bah``), trusting only ``certs``."""

    def __init__(self, root: Path, certs: Path) -> None:
        self.root, self.certs = root, certs
        (root / "tmp").mkdir(parents=True, exist_ok=True)

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        store = [
            "--storage-driver",
            "vfs",
            "--root",
            str(self.root / "root"),
            "--runroot",
            str(self.root / "run"),
        ]
        proc = subprocess.run(
            [_buildah(), *store, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "TMPDIR": str(self.root / "tmp")},
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"buildah {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def push(self, image: str, dest: str, creds: str, digestfile: Path) -> subprocess.CompletedProcess[str]:
        return self(
            "push",
            "--quiet",
            "--format",
            "oci",
            "--cert-dir",
            str(self.certs),
            "--creds",
            creds,
            "--digestfile",
            str(digestfile),
            image,
            f"docker://{dest}",
            check=False,
        )


@pytest.fixture(scope="module")
def bah(tmp_path_factory: pytest.TempPathFactory, reg: registry.Registry) -> Buildah:
    """A buildah store holding ``localhost/probe:1``: one small file, made here (nothing pulled)."""
    work = tmp_path_factory.mktemp("buildah")
    certs = work / "certs"
    certs.mkdir()
    shutil.copyfile(reg.ca, certs / "ca.crt")  # containers/image reads every *.crt of --cert-dir as a CA
    b = Buildah(work, certs)
    (work / "hello.txt").write_text(f"probe of {reg.address}\n")
    ctr = b("from", "--quiet", "scratch").stdout.strip()
    b("copy", "--quiet", ctr, str(work / "hello.txt"), "/hello.txt")
    b("config", "--cmd", '["/hello"]', ctr)
    b("commit", "--quiet", "--rm", ctr, "localhost/probe:1")
    return b


def _get(
    reg: registry.Registry, path: str, method: str = "GET", auth: bool = True
) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(f"https://{reg.address}{path}", method=method)
    request.add_header("Accept", OCI_MANIFEST)
    if auth:
        request.add_header("Authorization", reg.auth_header())
    context = ssl.create_default_context(cafile=str(reg.ca))
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return int(response.status), response.read(), dict(response.headers)
    except urllib.error.HTTPError as e:
        return int(e.code), e.read(), dict(e.headers)


def test_v2_needs_credentials_over_verified_tls(reg: registry.Registry) -> None:
    assert registry.get_v2(reg.address, reg.ca) == 401
    assert registry.get_v2(reg.address, reg.ca, reg.auth_header()) == 200
    wrong = registry.Registry(
        reg.address, reg.ca, reg.username, "not-" + reg.password, reg.state_dir, reg.pid
    )
    assert registry.get_v2(reg.address, reg.ca, wrong.auth_header()) == 401
    status, _, headers = _get(reg, "/v2/", auth=False)
    assert status == 401
    assert 'Basic realm="pko-registry"' in headers.get("Www-Authenticate", ""), headers
    # The cert is for the address, signed by the registry's CA and by no CA the system trusts.
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"https://{reg.address}/v2/", context=ssl.create_default_context(), timeout=10)
    entry = (reg.state_dir / "htpasswd").read_text().strip()
    assert entry.startswith(f"{reg.username}:$2y$"), "htpasswd holds a bcrypt entry"


def test_push_by_digest_and_fetch_the_manifest_by_it(
    reg: registry.Registry, bah: Buildah, tmp_path: Path
) -> None:
    digestfile = tmp_path / "digest"
    pushed = bah.push(
        "localhost/probe:1", f"{reg.address}/pko/probe:1", f"{reg.username}:{reg.password}", digestfile
    )
    assert pushed.returncode == 0, pushed.stderr
    digest = digestfile.read_text().strip()
    assert digest.startswith("sha256:"), digest

    status, body, headers = _get(reg, f"/v2/pko/probe/manifests/{digest}")
    assert status == 200, body
    assert "sha256:" + hashlib.sha256(body).hexdigest() == digest
    assert headers["Docker-Content-Digest"] == digest
    assert headers["Content-Type"] == OCI_MANIFEST
    manifest = json.loads(body)
    assert manifest["mediaType"] == OCI_MANIFEST
    # Its config and layer are there, under the same repository.
    for blob in (manifest["config"], *manifest["layers"]):
        assert _get(reg, f"/v2/pko/probe/blobs/{blob['digest']}", method="HEAD")[0] == 200
    # The tag names the same manifest; without credentials nothing is served.
    assert _get(reg, "/v2/pko/probe/manifests/1")[2]["Docker-Content-Digest"] == digest
    assert _get(reg, f"/v2/pko/probe/manifests/{digest}", auth=False)[0] == 401

    # Deletes are enabled: the manifest goes, by digest.
    assert _get(reg, f"/v2/pko/probe/manifests/{digest}", method="DELETE")[0] == 202
    assert _get(reg, f"/v2/pko/probe/manifests/{digest}")[0] == 404


def test_push_with_wrong_credentials_is_refused(reg: registry.Registry, bah: Buildah, tmp_path: Path) -> None:
    digestfile = tmp_path / "digest"
    pushed = bah.push(
        "localhost/probe:1", f"{reg.address}/pko/refused:1", f"{reg.username}:wrong", digestfile
    )
    assert pushed.returncode != 0
    assert "unauthorized" in pushed.stderr or "authentication required" in pushed.stderr, pushed.stderr
    assert not digestfile.exists() or not digestfile.read_text().strip()
    status, body, _ = _get(reg, "/v2/pko/refused/tags/list")
    assert status == 404, body  # nothing of it reached the storage


def test_restart_keeps_ca_credentials_and_storage(tmp_path: Path, bah: Buildah) -> None:
    first = registry.start(tmp_path, "127.0.0.1")
    try:
        shutil.copyfile(first.ca, bah.certs / "restart.crt")
        digestfile = tmp_path / "digest"
        pushed = bah.push(
            "localhost/probe:1", f"{first.address}/kept:1", f"{first.username}:{first.password}", digestfile
        )
        assert pushed.returncode == 0, pushed.stderr
        second = registry.start(tmp_path, "127.0.0.1")  # stops the first, then serves the same state
        assert not registry._alive(first.pid)
        assert (second.ca.read_bytes(), second.password) == (first.ca.read_bytes(), first.password)
        status, body, _ = _get(second, f"/v2/kept/manifests/{digestfile.read_text().strip()}")
        assert status == 200, body
    finally:
        registry.stop(tmp_path)
    assert not (tmp_path / "registry.pid").exists()


def test_cli_up_prints_json_and_down_stops_it(tmp_path: Path) -> None:
    hack = HACK
    up = subprocess.run(
        ["python3", str(hack / "registry.py"), "up", "--host", "127.0.0.1", "--state", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    info = json.loads(up.stdout)
    assert set(info) == {"address", "ca", "username", "password", "pid"}
    try:
        assert registry.get_v2(info["address"], Path(info["ca"])) == 401
        assert registry._alive(info["pid"]), "the server outlives `up`"
    finally:
        subprocess.run(
            ["python3", str(hack / "registry.py"), "down", "--state", str(tmp_path)], check=True, timeout=60
        )
    assert not registry._alive(info["pid"])


# --- the node's side (hack/localnode.py): trusting the registry, removing and importing images ----------


def test_images_to_remove_takes_whole_images_and_never_the_pause() -> None:
    dev, other, pause, pulled = (
        "sha256:" + "a" * 64,
        "sha256:" + "b" * 64,
        "sha256:" + "c" * 64,
        "sha256:" + "d" * 64,
    )
    images = {
        "docker.io/library/pko:dev": dev,
        "docker.io/library/pko-agent:dev": other,
        "docker.io/library/pko-pause:3.10": pause,
        "docker.io/library/pko-pause@" + pause: pause,
        # what the CRI names a pulled image: the tag, the repository by digest, the config's digest
        "10.87.0.1:5000/pko:dev": pulled,
        "10.87.0.1:5000/pko@" + pulled: pulled,
        "sha256:" + "e" * 64: pulled,
        "docker.io/library/busybox:1": "sha256:" + "f" * 64,
    }
    assert images_to_remove(images, ["docker.io/library/pko*"]) == {
        "docker.io/library/pko:dev",
        "docker.io/library/pko-agent:dev",
    }
    assert images_to_remove(images, ["10.87.0.1:5000/*"]) == {
        "10.87.0.1:5000/pko:dev",
        "10.87.0.1:5000/pko@" + pulled,
        "sha256:" + "e" * 64,
    }
    # A digest name stays while another tag still names its image.
    assert images_to_remove({**images, "example/kept:1": pulled}, ["10.87.0.1:5000/pko:dev"]) == {
        "10.87.0.1:5000/pko:dev"
    }
    assert images_to_remove(images, ["*pause*", "nothing:here"]) == set()


@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A containerd 1.6 of the test's own, run with the very config the node's runs with
    (``_containerd_config``: the CRI on, its registry ``config_path`` pointed at a hosts
    directory of the test's, ``certs.d`` beside its socket), on a socket in a fresh directory; stopped and
    removed after. No pods run on it: the CRI's image service is what the tests use."""
    if os.geteuid() != 0:
        pytest.skip("a containerd needs root")
    if shutil.which("containerd") is None:
        _apt_install("containerd")
    work = Path(tempfile.mkdtemp(prefix="pko-ctrd-"))  # short: a unix socket's path has 108 bytes at most
    node = Node("pko-test", "127.0.0.1", "10.99.0.0/24", "pkotest0", "pko-test", work)
    (work / "run").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(components, "CERTS_D", work / "certs.d")  # where _containerd_config reads it
        config = _containerd_config(node, "docker.io/library/pko-pause:test", snapshotter())
    assert f'config_path = "{work / "certs.d"}"' in config.read_text()
    with (work / "containerd.log").open("wb") as log:
        proc = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(
            ["ctr", "--address", str(node.socket), "version"], capture_output=True
        ).returncode:
            assert proc.poll() is None and time.monotonic() < deadline, (work / "containerd.log").read_text()
            time.sleep(0.2)
        yield node.socket
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        subprocess.run(["umount", "-R", str(work / "containerd")], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)


@functools.cache
def _cri_stubs(out: Path) -> tuple[Any, Any]:
    """The CRI's gRPC API (``runtime.v1``, what the kubelet calls) from the ``k8s.io/cri-api`` module of
    the pinned Kubernetes (its ``api.proto``, through hack/gomod.sh), compiled with grpcio-tools."""
    from grpc_tools import protoc

    minor_patch = versions()["KUBERNETES_VERSION"].split(".", 1)[1]
    found = subprocess.run(
        [
            "bash",
            str(HACK / "gomod.sh"),
            "download",
            "k8s.io/cri-api",
            f"v0.{minor_patch}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    proto_dir = Path(json.loads(found.stdout)["Dir"]) / "pkg" / "apis" / "runtime" / "v1"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(proto_dir / "api.proto", out / "cri_api.proto")
    assert (
        protoc.main(
            ["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}", "cri_api.proto"]
        )
        == 0
    )
    # Loaded from ``out`` by location; the grpc module imports its messages as ``cri_api_pb2``.
    modules = []
    for name in ("cri_api_pb2", "cri_api_pb2_grpc"):
        spec = importlib.util.spec_from_file_location(name, out / f"{name}.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules.append(module)
    return modules[0], modules[1]


def _own_image(bah: Buildah, name: str, work: Path) -> None:
    """``name`` in bah's store: an image of its own, no blob shared with what other tests pulled into the
    same containerd (whose GC keeps a blob while any image holds it)."""
    (work / "own.txt").write_text(f"{name} {time.time_ns()}\n")
    ctr = bah("from", "--quiet", "scratch").stdout.strip()
    bah("copy", "--quiet", ctr, str(work / "own.txt"), "/own.txt")
    bah("commit", "--quiet", "--rm", ctr, name)


def _ctr(sock: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ctr", "--address", str(sock), "--namespace", "k8s.io", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_trusted_registry_pulls_with_credentials(
    reg: registry.Registry, bah: Buildah, containerd: Path, tmp_path: Path
) -> None:
    """The files trust_registry writes are what containerd 1.6 resolves the registry with (the CRI reads
    them from its config_path, ctr from --hosts-dir): its CA verifies the registry, credentials still
    come from the pull."""
    creds = f"{reg.username}:{reg.password}"
    pushed = bah.push("localhost/probe:1", f"{reg.address}/pko/trusted:1", creds, tmp_path / "digest")
    assert pushed.returncode == 0, pushed.stderr
    image = f"{reg.address}/pko/trusted:1"

    untrusted = _ctr(
        containerd, "images", "pull", "--hosts-dir", str(tmp_path / "empty"), "--user", creds, image
    )
    assert untrusted.returncode != 0

    certs_d = tmp_path / "certs.d"
    hosts = trust_registry(reg.address, reg.ca, certs_d)
    assert hosts == certs_d / reg.address / "hosts.toml"
    assert "password" not in hosts.read_text() and reg.password not in hosts.read_text()
    wrong = _ctr(
        containerd, "images", "pull", "--hosts-dir", str(certs_d), "--user", f"{reg.username}:x", image
    )
    assert wrong.returncode != 0 and "401" in wrong.stderr, wrong.stderr
    pulled = _ctr(containerd, "images", "pull", "--hosts-dir", str(certs_d), "--user", creds, image)
    assert pulled.returncode == 0, pulled.stderr
    listed = _ctr(containerd, "images", "ls", "-q").stdout.split()
    assert image in listed
    assert _images(containerd)[image] == (tmp_path / "digest").read_text().strip()


def test_kubelets_pull_trusts_the_registry_and_takes_the_pull_secrets_credentials(
    reg: registry.Registry, bah: Buildah, containerd: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """What the kubelet does for a pod with an imagePullSecret: the CRI's PullImage with the secret's
    credentials. The node's containerd config reads the hosts.toml trust_registry writes at each pull
    (it is written after containerd started); the CRI names the image as a pull does (tag, digest, id),
    and remove_images takes all three, after which the CRI lists nothing of it."""
    pb, rpc = _cri_stubs(tmp_path_factory.mktemp("cri"))
    creds = f"{reg.username}:{reg.password}"
    work = tmp_path_factory.mktemp("cri-image")
    _own_image(bah, "localhost/cri:1", work)
    assert bah.push("localhost/cri:1", f"{reg.address}/pko/cri:1", creds, work / "digest").returncode == 0
    image, digest = f"{reg.address}/pko/cri:1", (work / "digest").read_text().strip()
    with grpc.insecure_channel(f"unix://{containerd}") as channel:
        images = rpc.ImageServiceStub(channel)

        def pull(username: str, password: str) -> str:
            auth = pb.AuthConfig(username=username, password=password)
            return str(
                images.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=image), auth=auth)).image_ref
            )

        certs_d = containerd.parent.parent / "certs.d"  # the config_path of the fixture's config
        assert not (certs_d / reg.address).exists()
        with pytest.raises(grpc.RpcError):  # the registry's CA is not trusted yet
            pull(reg.username, reg.password)
        trust_registry(reg.address, reg.ca, certs_d)
        with pytest.raises(grpc.RpcError, match="401 Unauthorized"):
            pull("", "")  # no pull secret: containerd has no credentials of its own
        with pytest.raises(grpc.RpcError, match="401 Unauthorized"):
            pull(reg.username, "wrong")
        image_id = pull(reg.username, reg.password)
        listed = {
            i.id: (list(i.repo_tags), list(i.repo_digests))
            for i in images.ListImages(pb.ListImagesRequest()).images
        }
        assert listed[image_id] == ([image], [f"{reg.address}/pko/cri@{digest}"])

        removed = remove_images([f"{reg.address}/pko/cri:*"], [containerd])
        assert sorted(removed) == sorted([image, f"{reg.address}/pko/cri@{digest}", image_id])
        assert image_id not in {i.id for i in images.ListImages(pb.ListImagesRequest()).images}

        untrust_registry(reg.address, certs_d)
        with pytest.raises(grpc.RpcError) as untrusted:  # the next pull verifies against no CA of its own
            pull(reg.username, reg.password)
        assert "401" not in str(untrusted.value)


def test_remove_images_drops_their_content_and_import_puts_them_back(
    bah: Buildah, containerd: Path, tmp_path: Path
) -> None:
    name = "docker.io/library/pkoprobe:dev"
    archive = tmp_path / "pkoprobe.oci.tar"
    _own_image(bah, name, tmp_path)
    bah("push", "--quiet", name, f"oci-archive:{archive}:{name}")
    import_images([archive], [containerd])
    images = _images(containerd)
    assert name in images
    content = set(_ctr(containerd, "content", "ls", "-q").stdout.split())
    manifest = json.loads(_ctr(containerd, "content", "get", images[name]).stdout)
    image_id = manifest["config"]["digest"]
    blobs = {images[name], image_id, *(layer["digest"] for layer in manifest["layers"])}
    assert blobs <= content
    # The CRI names an imported image by its id too, once it has seen it (as a node's long-imported ones).
    deadline = time.monotonic() + 30
    while image_id not in _images(containerd):
        assert time.monotonic() < deadline, f"the CRI never named {name} {image_id}"
        time.sleep(0.1)

    removed = remove_images(["docker.io/library/pko*:dev"], [containerd])
    assert removed == sorted([name, image_id])
    assert name not in _images(containerd)
    # containerd's GC ran (--sync): none of the image's blobs is left.
    assert not blobs & set(_ctr(containerd, "content", "ls", "-q").stdout.split())
    assert remove_images(["docker.io/library/pko*:dev"], [containerd]) == []

    import_images([archive], [containerd])
    assert _images(containerd)[name] == images[name]
    assert blobs <= set(_ctr(containerd, "content", "ls", "-q").stdout.split())
