"""hack/release.py stops before it pushes anything, and says why, on each kind of bad input: a wrong
version, a dirty tree, an existing dist directory, a tag that exists, a registry that refuses the push.

Against a real registry (hack/registry.py: Distribution with TLS and htpasswd, on loopback), from a clean
worktree of HEAD; what it checks first is also what these tests prove it left untouched (the registry's
catalog). The whole release, built, pushed and installed, is e2e/test_release.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pko.devtools import registry
from pko.devtools.ociclient import Registry, digest_of
from pko.version import VERSION

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tree() -> Iterator[Path]:
    """A clean worktree of HEAD (this checkout may hold uncommitted work)."""
    path = Path(tempfile.mkdtemp(prefix="pko-release-test-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(path), "HEAD"], cwd=REPO, check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, check=False)


def _release(
    tree: Path, reg: registry.Registry, *args: str, password: str | None = None, dist: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PKO_REGISTRY_USERNAME": reg.username,
        "PKO_REGISTRY_PASSWORD": reg.password if password is None else password,
    }
    cmd = [
        sys.executable, str(tree / "hack" / "release.py"), *args, "--registry", f"{reg.address}/team",
        "--ca-file", str(reg.ca), "--source-url", "https://pko.invalid/pko",
        "--dist", str(dist or tree / "dist"),
    ]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def _catalog(reg: registry.Registry) -> list[str]:
    client = Registry(reg.address, reg.username, reg.password, reg.ca)
    status, _, body = client._request("GET", "/v2/_catalog", "")
    assert status == 200, body
    repositories: list[str] = json.loads(body)["repositories"]
    return repositories


def _refused(
    proc: subprocess.CompletedProcess[str], reason: str, reg: registry.Registry, before: list[str]
) -> None:
    assert proc.returncode == 1, proc.stderr
    assert reason in proc.stderr, proc.stderr
    assert "pushing" not in proc.stderr and "building" not in proc.stderr, proc.stderr
    assert _catalog(reg) == before, "something was pushed"


@pytest.mark.parametrize(
    ("version", "reason"),
    [("v1.0.0", "SemVer 0.N.M"), ("0.1", "SemVer 0.N.M"), ("v0.999.0", "not 0.999.0")],
)
def test_a_wrong_version_is_refused(tree: Path, reg: registry.Registry, version: str, reason: str) -> None:
    before = _catalog(reg)
    _refused(_release(tree, reg, version), reason, reg, before)


def test_a_dirty_tree_is_refused_naming_the_files(tree: Path, reg: registry.Registry) -> None:
    before = _catalog(reg)
    stray = tree / "pko" / "stray.py"
    stray.write_text("")
    try:
        _refused(_release(tree, reg, f"v{VERSION}"), "pko/stray.py", reg, before)
    finally:
        stray.unlink()


def test_an_existing_dist_directory_is_refused(tree: Path, reg: registry.Registry, tmp_path: Path) -> None:
    before = _catalog(reg)
    (tmp_path / VERSION).mkdir()
    _refused(
        _release(tree, reg, f"v{VERSION}", dist=tmp_path), "exists: a release is written once", reg, before
    )


def test_a_registry_that_refuses_the_push_is_named(tree: Path, reg: registry.Registry) -> None:
    before = _catalog(reg)
    proc = _release(tree, reg, f"v{VERSION}", password="wrong")
    _refused(proc, f"the registry {reg.address} refuses pushes to team/pko", reg, before)


def test_a_tag_that_exists_is_refused_and_nothing_else_is_pushed(tree: Path, reg: registry.Registry) -> None:
    client = Registry(reg.address, reg.username, reg.password, reg.ca)
    config = b"{}"
    blob = Path(tempfile.mkstemp()[1])
    blob.write_bytes(config)
    client.push_blob("team/pko-agent", digest_of(config), blob)
    oci = "application/vnd.oci.image"
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": f"{oci}.manifest.v1+json",
        "config": {"mediaType": f"{oci}.config.v1+json", "digest": digest_of(config), "size": 2},
        "layers": [],
    }).encode()  # fmt: skip
    existing = client.push_manifest(
        "team/pko-agent", VERSION, manifest, "application/vnd.oci.image.manifest.v1+json"
    )
    before = _catalog(reg)
    proc = _release(tree, reg, f"v{VERSION}")
    _refused(proc, f"{reg.address}/team/pko-agent:{VERSION} exists ({existing})", reg, before)
    assert client.manifest_digest("team/pko", VERSION) is None


def _oci_archive(path: Path, layer: bytes) -> None:
    """A one-image OCI archive as hack/build-images.sh writes them (oci-layout, index.json, blobs)."""
    import io
    import tarfile

    oci = "application/vnd.oci.image"
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Labels": {"built": "here"}},
                         "rootfs": {"type": "layers", "diff_ids": [digest_of(layer)]}}).encode()  # fmt: skip
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": f"{oci}.manifest.v1+json",
        "config": {"mediaType": f"{oci}.config.v1+json", "digest": digest_of(config), "size": len(config)},
        "layers": [{"mediaType": f"{oci}.layer.v1.tar", "digest": digest_of(layer), "size": len(layer)}],
    }).encode()  # fmt: skip
    entry = {"mediaType": f"{oci}.manifest.v1+json", "digest": digest_of(manifest), "size": len(manifest)}
    index = json.dumps({"schemaVersion": 2, "manifests": [entry]}).encode()
    files = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
    for blob in (layer, config, manifest):
        files[f"blobs/sha256/{digest_of(blob).removeprefix('sha256:')}"] = blob
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_an_image_is_pushed_by_digest_with_the_release_labels(reg: registry.Registry, tmp_path: Path) -> None:
    from pko.devtools.ocilayout import push_archive

    layer = b"a layer's bytes" * 1000
    archive = tmp_path / "image.oci.tar"
    _oci_archive(archive, layer)
    client = Registry(reg.address, reg.username, reg.password, reg.ca)
    labels = {"org.opencontainers.image.version": VERSION}
    pushed = push_archive(archive, client, "labelled/pko", VERSION, labels)
    assert pushed.pinned == f"{reg.address}/labelled/pko:{VERSION}@{pushed.digest}"
    assert client.manifest_digest("labelled/pko", VERSION) == pushed.digest
    manifest = client.get_manifest("labelled/pko", pushed.digest)
    config = json.loads(client.get_blob("labelled/pko", manifest["config"]["digest"]))
    assert config["config"]["Labels"] == {"built": "here", **labels}
    assert client.get_blob("labelled/pko", manifest["layers"][0]["digest"]) == layer
    # The same archive again (a retried release): the layer is not uploaded twice, the digest is the same.
    assert push_archive(archive, client, "labelled/pko", VERSION, labels).digest == pushed.digest
