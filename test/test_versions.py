"""The engine's versions are pinned once (hack/versions.env); what else names them must agree."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from versions import VERSIONS_ENV, versions  # hack/versions.py (hack/ is on sys.path: test/conftest.py)

REPO = Path(__file__).resolve().parent.parent


def _bash(script: str, *args: str) -> list[str]:
    """Lines a clean bash prints for ``script`` (``$1``... = args)."""
    cmd = ["env", "-i", "bash", "--noprofile", "--norc", "-c", script, "bash", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()


def test_the_python_reader_sees_what_bash_sources() -> None:
    # The build scripts `. hack/versions.env`; hack/versions.py must read the same names and values.
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
    assert (
        "COPY hack/versions.env hack/gomod.sh hack/build-pulumi.sh hack/build-sources.sh hack/" in dockerfile
    )
    assert 'pip install "pulumi==${PULUMI_SDK_VERSION}"' in dockerfile
    ignore = (REPO / "images/workspace/Dockerfile.dockerignore").read_text().split()
    assert [line for line in ignore if line.startswith("!")] == [
        "!hack/versions.env",
        "!hack/gomod.sh",
        "!hack/build-pulumi.sh",
        "!hack/build-sources.sh",
    ]
    # No version (nor commit, checksum or repository) is written anywhere but versions.env: the build
    # scripts read every one from there.
    for name in ("build-pulumi.sh", "build-sources.sh"):
        script = (REPO / "hack" / name).read_text()
        for key, value in versions().items():
            assert value not in script.replace(f"${{{key}}}", ""), f"{key}={value} is written in {name}"
