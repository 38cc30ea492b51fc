"""The agent image, built offline by hack/build-agent-image.sh, is a valid OCI archive that works.

Checked without any container runtime: the archive's index, manifest, config and layer verify
against their digests; the one layer holds exactly the files agent/Dockerfile puts in the image
(same paths, modes, entrypoint, env, user); and, unpacked into an empty directory and run with an
empty environment, tini starts the agent and the busybox `cp` performs the workspace pod's
`bootstrap` step (`cp -r /agent /agent-lib /tini /share/`). Slow: it needs the PyInstaller build,
which it shares with test_selfcontained.py (or takes from $PKO_AGENT_BINARY).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pko.controllers.workspace.workloads import BOOTSTRAP_COPY
from pko.devtools.builds import built

REPO = Path(__file__).resolve().parents[2]
IMAGE = "docker.io/library/pko-agent:dev"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_TYPES = ("application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.oci.image.layer.v1.tar")
GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Entry:
    """One layer member, as the image's root filesystem sees it."""

    kind: str  # "file", "dir" or "symlink"
    mode: int
    data: bytes = b""
    target: str = ""


@dataclass(frozen=True)
class Image:
    index: dict[str, Any]
    manifest: dict[str, Any]
    config: dict[str, Any]
    layer: dict[str, Entry]  # path without a leading "./" or "/"


def _blob(files: dict[str, bytes], descriptor: dict[str, Any]) -> bytes:
    algorithm, _, digest = str(descriptor["digest"]).partition(":")
    assert algorithm == "sha256", descriptor
    data = files[f"blobs/sha256/{digest}"]
    assert len(data) == descriptor["size"], f"size mismatch for {descriptor}"
    assert hashlib.sha256(data).hexdigest() == digest, f"digest mismatch for {descriptor}"
    return data


def _layer_entries(tar_bytes: bytes) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        for member in tar.getmembers():
            name = member.name.lstrip("./").rstrip("/")
            assert (member.uid, member.gid) == (0, 0), f"{name} is not owned by root"
            if member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                entries[name] = Entry("file", stat.S_IMODE(member.mode), extracted.read())
            elif member.isdir():
                entries[name] = Entry("dir", stat.S_IMODE(member.mode))
            elif member.issym():
                entries[name] = Entry("symlink", stat.S_IMODE(member.mode), target=member.linkname)
            else:
                raise AssertionError(f"unexpected layer member type for {name}")
    return entries


def read_image(archive: Path) -> Image:
    """Walk index -> manifest -> config -> layer, verifying every blob against its descriptor."""
    with tarfile.open(archive) as tar:
        files = {}
        for member in tar.getmembers():
            if member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                files[member.name.lstrip("./")] = extracted.read()
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    assert index["schemaVersion"] == 2 and len(index["manifests"]) == 1
    descriptor = index["manifests"][0]
    assert descriptor["mediaType"] == MANIFEST
    manifest = json.loads(_blob(files, descriptor))
    assert manifest["schemaVersion"] == 2 and manifest["config"]["mediaType"] == CONFIG
    config = json.loads(_blob(files, manifest["config"]))
    assert len(manifest["layers"]) == 1, "the image is one layer FROM scratch"
    layer_descriptor = manifest["layers"][0]
    assert layer_descriptor["mediaType"] in LAYER_TYPES
    layer = _blob(files, layer_descriptor)
    if layer_descriptor["mediaType"].endswith("+gzip"):
        layer = gzip.decompress(layer)
    assert config["rootfs"] == {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}
    return Image(index=index, manifest=manifest, config=config, layer=_layer_entries(layer))


@dataclass(frozen=True)
class DockerfileImage:
    """What agent/Dockerfile's final stage declares, and the root filesystem its build stage lays out."""

    entries: dict[str, tuple[str, str]]  # path -> ("file", source) or ("symlink", target)
    trees: dict[str, str]  # path -> the folder copied there whole (`cp -r`)
    entrypoint: list[str]
    cmd: list[str]
    env: list[str]
    user: str


def read_dockerfile() -> DockerfileImage:
    text = (REPO / "agent" / "Dockerfile").read_text().replace("\\\n", " ")
    final = text[text.rindex("\nFROM ") + 1 :]
    assert final.splitlines()[0].strip() == "FROM scratch"
    entries: dict[str, tuple[str, str]] = {}
    trees: dict[str, str] = {}
    for command in re.split(r"&&|\n", text):
        words = shlex.split(command.strip(), comments=True)
        if (
            len(words) == 6
            and words[:4] == ["install", "-D", "-m", "0755"]
            and words[5].startswith("/rootfs/")
        ):
            entries[words[5].removeprefix("/rootfs/")] = ("file", words[4])
        elif len(words) == 4 and words[:2] == ["ln", "-s"] and words[3].startswith("/rootfs/"):
            entries[words[3].removeprefix("/rootfs/")] = ("symlink", words[2])
        elif len(words) == 4 and words[:2] == ["cp", "-r"] and words[3].startswith("/rootfs/"):
            trees[words[3].removeprefix("/rootfs/")] = words[2]
    directives = {}
    for line in final.splitlines():
        keyword, _, rest = line.strip().partition(" ")
        if keyword in ("ENV", "USER", "ENTRYPOINT", "CMD"):
            directives[keyword] = rest.strip()
    return DockerfileImage(
        entries=entries,
        trees=trees,
        entrypoint=json.loads(directives["ENTRYPOINT"]),
        cmd=json.loads(directives["CMD"]),
        env=[directives["ENV"]],
        user=directives["USER"],
    )


def unpack(image: Image, root: Path) -> None:
    """Lay the layer out under ``root`` (regular files keep their modes, symlinks stay relative)."""
    for name, entry in sorted(image.layer.items()):
        path = root / name
        if entry.kind == "dir":
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(entry.mode)
        elif entry.kind == "symlink":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(entry.target)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(entry.data)
            path.chmod(entry.mode)


@pytest.fixture(scope="module")
def archive(agent_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("images")
    path = built(
        "build-agent-image.sh",
        str(out),
        env={"PKO_AGENT_BINARY": str(agent_binary), "PYTHON": sys.executable},
        timeout=900,
    )
    assert path.parent == out and path.is_file()
    assert sorted(p.name for p in out.iterdir()) == [path.name], "only the archive is left behind"
    return path


def test_archive_is_a_valid_oci_image_matching_the_dockerfile(archive: Path, agent_binary: Path) -> None:
    image = read_image(archive)
    assert image.index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == IMAGE
    assert image.config["os"] == "linux"
    assert image.config["architecture"] == GOARCH.get(platform.machine(), platform.machine())

    dockerfile = read_dockerfile()
    settings = image.config["config"]
    assert settings["Entrypoint"] == dockerfile.entrypoint == ["/tini", "--"]
    assert settings["Cmd"] == dockerfile.cmd
    assert settings["User"] == dockerfile.user == "65532:65532"
    assert settings["Env"] == dockerfile.env == ["PATH=/bin"]

    # The agent's folder (`agent-lib/`, beside the executable) is copied whole, as built.
    assert dockerfile.trees == {"agent-lib": "/out/agent/agent-lib"}
    built = agent_binary.parent / "agent-lib"
    files = {str(p.relative_to(agent_binary.parent)): p for p in built.rglob("*") if not p.is_dir()}
    in_tree = {n: e for n, e in image.layer.items() if n.startswith("agent-lib/") and e.kind != "dir"}
    assert set(in_tree) == set(files), set(in_tree) ^ set(files)
    for name, entry in in_tree.items():
        assert entry.mode & 0o444 == 0o444, f"{name} is not readable by the pod's user"
        if entry.kind == "file":
            assert entry.data == files[name].read_bytes(), f"{name} differs from the build"

    others = {n for n, e in image.layer.items() if e.kind != "dir" and not n.startswith("agent-lib/")}
    assert others == set(dockerfile.entries)
    assert image.layer["tmp"].kind == "dir" and image.layer["tmp"].mode == 0o1777
    for name, (kind, source) in dockerfile.entries.items():
        entry = image.layer[name]
        assert entry.kind == kind, name
        if kind == "symlink":
            assert entry.target == source, name
        else:
            assert entry.mode == 0o755, f"{name} has mode {entry.mode:o}"
            expected = agent_binary if name == "agent" else Path(source)
            assert entry.data == expected.read_bytes(), f"{name} is not {expected}"


def test_unpacked_image_runs_the_agent_and_the_bootstrap_copy(archive: Path, tmp_path: Path) -> None:
    image = read_image(archive)
    root = tmp_path / "rootfs"
    root.mkdir()
    unpack(image, root)

    # Under tini, with no environment at all: nothing from this machine's Python is needed.
    shown = subprocess.run(
        ["env", "-i", str(root / "tini"), "-s", "--", str(root / "agent"), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr
    assert "serve" in shown.stdout and "init" in shown.stdout

    # Inside the image alone (the `fetch` init container runs the agent there): as root, chroot into
    # the unpacked layer, as an unprivileged user, with nothing of this machine's libraries.
    if os.geteuid() == 0:
        inside = subprocess.run(
            [
                shutil.which("chroot") or "/usr/sbin/chroot",
                "--userspec=65532:65532",
                str(root),
                "/tini",
                "-s",
                "--",
                "/agent",
                "--help",
            ],
            env={"PATH": "/bin"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert inside.returncode == 0, inside.stderr
        assert "serve" in inside.stdout

    # The `bootstrap` init container: the image's entrypoint and PATH with its args (`cp -r /agent
    # /agent-lib /tini /share/`), re-rooted under `root` (no chroot: the test must not need privileges).
    share = tmp_path / "share"
    share.mkdir()
    entrypoint = [
        str(root / arg.lstrip("/")) if arg.startswith("/") else arg
        for arg in image.config["config"]["Entrypoint"]
    ]
    path_dirs = [
        str(root / d.lstrip("/")) for d in image.config["config"]["Env"][0].removeprefix("PATH=").split(":")
    ]
    copied = subprocess.run(
        [
            "env",
            "-i",
            "PATH=" + ":".join(path_dirs),
            *entrypoint,
            *[str(root / a.lstrip("/")) if a.startswith("/") else a for a in BOOTSTRAP_COPY[:-1]],
            f"{share}/",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert copied.returncode == 0, copied.stderr
    assert (share / "agent").read_bytes() == image.layer["agent"].data
    assert (share / "tini").read_bytes() == image.layer["tini"].data
    assert (share / "agent-lib" / "base_library.zip").read_bytes() == image.layer[
        "agent-lib/base_library.zip"
    ].data

    # The main container's command shape: `/share/tini /share/agent -- serve ...`.
    main = subprocess.run(
        ["env", "-i", str(share / "tini"), "-s", str(share / "agent"), "--", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert main.returncode == 0, main.stderr
    assert "--workspace" in main.stdout
