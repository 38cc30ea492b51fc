"""The engine's versions are pinned once (hack/versions.env); what else names them must agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from realpulumi import versions

REPO = Path(__file__).resolve().parent.parent


def test_the_agents_pulumi_sdk_is_the_one_the_workspace_image_installs() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = [d for d in deps if re.match(r"pulumi\b", d) and not d.startswith("pulumi-")]
    assert pinned == [f"pulumi=={versions()['PULUMI_SDK_VERSION']}"], pinned


def test_the_workspace_image_is_built_from_the_pinned_versions_only() -> None:
    dockerfile = (REPO / "images/workspace/Dockerfile").read_text()
    assert "COPY hack/versions.env hack/gomod.sh hack/build-pulumi.sh hack/" in dockerfile
    assert 'pip install "pulumi==${PULUMI_SDK_VERSION}"' in dockerfile
    ignore = (REPO / "images/workspace/Dockerfile.dockerignore").read_text().split()
    assert [line for line in ignore if line.startswith("!")] == [
        "!hack/versions.env",
        "!hack/gomod.sh",
        "!hack/build-pulumi.sh",
    ]
    # No version is written anywhere but versions.env: the build script reads every one from there.
    script = (REPO / "hack/build-pulumi.sh").read_text()
    for key, value in versions().items():
        assert value not in script.replace(f"${{{key}}}", ""), f"{key}={value} is written in build-pulumi.sh"
