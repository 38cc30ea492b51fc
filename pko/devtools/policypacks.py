"""Policy packs for tests on the real engine (issue 43): the pinned ``@pulumi/policy`` npm package,
fetched once into the pko cache, and JavaScript packs made from it (no compile).

What the engine needs to run such a pack, offline: pulumi v3.274 runs a pack directory through its
language host (``pulumi-language-nodejs``, built by hack/build-sources.sh, starts
``@pulumi/pulumi/cmd/run-policy-pack``: no ``pulumi-analyzer-policy`` plugin), so the pack needs
``@pulumi/policy`` (here in its own ``node_modules``, as ``npm install`` leaves it) and ``@pulumi/pulumi``
with its dependencies, which the image's SDK set has (hack/build-runtimes.sh's ``node_modules``: the
image's /node_modules, on NODE_PATH outside an image). :func:`engine_env` says what to add to the
engine's environment for that.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import tarfile
from pathlib import Path

__all__ = [
    "POLICY_SDK",
    "POLICY_SDK_INTEGRITY",
    "built",
    "engine_dirs",
    "engine_env",
    "policy_sdk",
    "write_pack",
]

REPO = Path(__file__).resolve().parents[2]
POLICY_SDK = ("@pulumi/policy", "1.21.0")
POLICY_SDK_INTEGRITY = (
    "sha512-tLczMS7S2UUpc1qO9xvGY54GumUShTNxm/BY/T1fb0Hp/ILScxXzrmLpkbt4KUGZAcX/EdGLVuMGHyhreqbfvg=="
)


def built(script: str) -> Path:
    """The output directory a hack/build-*.sh script prints last (it builds only what its cache lacks)."""
    done = subprocess.run(["bash", str(REPO / "hack" / script)], check=True, capture_output=True, text=True)
    return Path(done.stdout.strip().splitlines()[-1])


def policy_sdk(runtimes: Path) -> Path:
    """The pinned @pulumi/policy tarball, fetched once with npm into the pko cache (beside the runtimes
    of hack/build-runtimes.sh, ``runtimes``) and refused unless its sha512 is the pin."""
    name, version = POLICY_SDK
    cache = runtimes.parents[1] / "npm-packs"
    tarball = cache / f"pulumi-policy-{version}.tgz"
    if not tarball.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "pack", f"{name}@{version}", "--pack-destination", str(cache)],
            check=True,
            capture_output=True,
            timeout=120,
        )
    digest = base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    if f"sha512-{digest}" != POLICY_SDK_INTEGRITY:
        raise RuntimeError(f"{tarball}: not the pinned {name}@{version} (sha512-{digest})")
    return tarball


def write_pack(directory: Path, sdk: Path, source: str, name: str = "pko-pack") -> None:
    """A JavaScript pack in ``directory``: ``source`` as its index.js, @pulumi/policy from the tarball
    ``sdk`` in its own node_modules."""
    target = directory / "node_modules" / "@pulumi" / "policy"
    target.mkdir(parents=True)
    with tarfile.open(sdk) as archive:
        for member in archive.getmembers():
            member.name = member.name.partition("/")[2]  # package/... -> ...
            if member.name:
                archive.extract(member, target, filter="data")
    (directory / "PulumiPolicy.yaml").write_text("runtime: nodejs\ndescription: a pko test pack\n")
    manifest = {"name": name, "version": "0.1.0", "main": "index.js"}
    (directory / "package.json").write_text(
        json.dumps(manifest | {"dependencies": {POLICY_SDK[0]: POLICY_SDK[1]}})
    )
    (directory / "index.js").write_text(source)


def engine_dirs(runtimes: Path) -> list[Path]:
    """Where the Node.js language host (hack/build-sources.sh) and Node.js (``runtimes``, of
    hack/build-runtimes.sh) are: first on the engine's PATH outside an image, which has the host beside
    ``pulumi`` (so the engine's ambient plugin lookup stays on: :func:`engine_env`)."""
    return [built("build-sources.sh") / "bin", runtimes / "nodejs" / "bin"]


def engine_env(path: str, runtimes: Path) -> dict[str, str]:
    """What the real engine's environment needs, beyond the workspace image's, to run a JavaScript pack
    outside the image: :func:`engine_dirs` before ``path``, the image's SDK set on NODE_PATH."""
    return {
        "PATH": os.pathsep.join([*map(str, engine_dirs(runtimes)), path]),
        "NODE_PATH": str(runtimes / "node_modules"),
        "PULUMI_IGNORE_AMBIENT_PLUGINS": "false",
    }
