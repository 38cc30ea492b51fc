"""The engine's versions are pinned once (hack/versions.env); what else names them must agree."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

from pko.devtools.versions import VERSIONS_ENV, versions

REPO = Path(__file__).resolve().parent.parent


def _bash(script: str, *args: str) -> list[str]:
    """Lines a clean bash prints for ``script`` (``$1``... = args)."""
    cmd = ["env", "-i", "bash", "--noprofile", "--norc", "-c", script, "bash", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()


def test_the_python_reader_sees_what_bash_sources() -> None:
    # The build scripts `. hack/versions.env`; pko/devtools/versions.py must read the same names and values.
    env = str(VERSIONS_ENV)
    names = set(_bash('. "$1"; compgen -v', env)) - set(_bash(". /dev/null; compgen -v"))
    script = '. "$1"; shift; for name; do printf "%s=%s\\n" "$name" "${!name}"; done'
    sourced = dict(line.split("=", 1) for line in _bash(script, env, *sorted(names)))
    assert sourced == versions()


def test_the_agents_pulumi_sdk_is_the_one_the_workspace_image_installs() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = [d for d in deps if re.match(r"pulumi\b", d) and not d.startswith("pulumi-")]
    assert pinned == [f"pulumi=={versions()['PULUMI_SDK_VERSION']}"], pinned


def test_the_workspace_image_is_built_from_the_pinned_versions_only() -> None:
    dockerfile = (REPO / "images/workspace/Dockerfile").read_text()
    scripts = "hack/gomod.sh hack/build-pulumi.sh hack/build-sources.sh hack/build-runtimes.sh"
    assert f"COPY hack/versions.env {scripts} hack/" in dockerfile
    # The Python SDK of PULUMI_SDK_VERSION, from its hash-pinned lock (test/test_lock.py checks the pin).
    assert "COPY requirements-workspace.lock /opt/pulumi/requirements.lock" in dockerfile
    ignore = (REPO / "images/workspace/Dockerfile.dockerignore").read_text().split()
    assert [line for line in ignore if line.startswith("!")] == [
        "!hack/versions.env",
        "!requirements-workspace.lock",
        "!requirements-policy.lock",
        "!hack/gomod.sh",
        "!hack/build-pulumi.sh",
        "!hack/build-sources.sh",
        "!hack/build-runtimes.sh",
        "!images/workspace/nodejs/package.json",
        "!images/workspace/nodejs/package-lock.json",
    ]
    # No version (nor commit, checksum or repository) is written anywhere but versions.env: the build
    # scripts read every one from there.
    build_scripts = (
        "build-pulumi.sh",
        "build-sources.sh",
        "build-runtimes.sh",
        "build-peer.sh",
        "build-seaweedfs.sh",
        "build-helm.sh",
    )
    for name in build_scripts:
        script = (REPO / "hack" / name).read_text()
        for key, value in versions().items():
            assert value not in script.replace(f"${{{key}}}", ""), f"{key}={value} is written in {name}"


def test_the_nodejs_sdk_packages_are_those_of_the_installed_host_and_providers() -> None:
    """A program importing @pulumi/<provider> asks the engine for the plugin version that package names,
    and the engine never downloads one: each package must be at the version of the provider the image
    installs, and @pulumi/pulumi at the Node.js language host's tag (whose dynamic-provider shim it
    matches). The lockfile pins each exactly as package.json asks."""
    v = versions()
    manifest = json.loads((REPO / "images/workspace/nodejs/package.json").read_text())
    lock = json.loads((REPO / "images/workspace/nodejs/package-lock.json").read_text())
    expected = {
        "@pulumi/pulumi": v["PULUMI_LANGUAGE_HOSTS_VERSION"],
        "@pulumi/kubernetes": v["PULUMI_KUBERNETES_VERSION"],
        "@pulumi/random": v["PULUMI_RANDOM_VERSION"],
        "@pulumi/command": v["PULUMI_COMMAND_VERSION"],
    }
    deps = manifest["dependencies"]
    assert {name: deps[name] for name in expected} == expected
    assert lock["packages"][""]["dependencies"] == deps
    for name, version in deps.items():
        assert lock["packages"][f"node_modules/{name}"]["version"] == version, name
