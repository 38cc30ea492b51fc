"""The files of a release (pko/devtools/releasefiles.py), from what config/ and charts/ render and
made-up pins."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_kustomize import build  # the one `kubectl kustomize` of the suite

from pko.devtools.releasefiles import (
    VERSION_LABEL,
    Pins,
    install_objects,
    krew_manifest,
    pin_values,
    quickstart_objects,
    sha256sums,
    to_yaml,
    validate_version,
)
from pko.version import VERSION

REPO = Path(__file__).resolve().parent.parent
D = "sha256:" + "ab" * 32
PINS = Pins(
    operator=f"registry.test:5000/team/pko:{VERSION}@{D}",
    agent=f"registry.test:5000/team/pko-agent:{VERSION}@{D}",
    workspace=f"registry.test:5000/team/pko-workspace:{VERSION}@{D}",
)


def _render(directory: str) -> list[dict[str, Any]]:
    return build(REPO / directory)  # cached: install_objects copies what it changes


def _manager(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    (manager,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "manager"]
    return manager


def test_install_yaml_pins_every_image_and_labels_every_object() -> None:
    objs = install_objects(_render("config/default"), PINS, VERSION)
    manager = _manager(objs)
    env = {e["name"]: e.get("value") for e in manager["env"]}
    assert manager["image"] == PINS.operator
    assert (env["AGENT_IMAGE"], env["WORKSPACE_IMAGE"]) == (PINS.agent, PINS.workspace)
    assert all(o["metadata"]["labels"][VERSION_LABEL] == VERSION for o in objs)
    # Nothing but the images, the pull policy and the labels differs from config/default.
    text = yaml.safe_dump_all(objs)
    assert "pko:latest" not in text and "pko-agent:latest" not in text
    kinds = {o["kind"] for o in objs}
    assert {"CustomResourceDefinition", "ClusterRole", "Deployment", "ValidatingAdmissionPolicy"} <= kinds
    assert len(objs) == len(_render("config/default"))


def test_install_yaml_is_one_file_kubectl_reads_back() -> None:
    objs = install_objects(_render("config/default"), PINS, VERSION)
    text = to_yaml(objs, "pko test: kubectl apply --server-side -f install.yaml")
    assert text.startswith("# pko test")
    assert list(yaml.safe_load_all(text)) == objs


def test_quickstart_yaml_holds_only_what_config_quickstart_adds() -> None:
    objs = quickstart_objects(_render("config/quickstart"), _render("config/default"), VERSION)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objs) == [
        ("ClusterRoleBinding", "default:pulumi:system:auth-delegator"),
        ("NetworkPolicy", "allow-workspace-rpc"),
        ("ServiceAccount", "pulumi"),
    ]


def test_the_charts_values_get_the_pins_and_keep_their_comments() -> None:
    text = (REPO / "charts/pko/values.yaml").read_text()
    pinned = pin_values(text, PINS)
    values = yaml.safe_load(pinned)
    assert values["image"] == {**values["image"], "registry": "registry.test:5000",
                               "repository": "team/pko", "tag": VERSION, "digest": D}  # fmt: skip
    assert values["agent"]["image"]["repository"] == "team/pko-agent"
    assert values["workspace"]["image"]["repository"] == "team/pko-workspace"
    assert [line for line in pinned.splitlines() if line.lstrip().startswith("#")] == [
        line for line in text.splitlines() if line.lstrip().startswith("#")
    ]


def test_a_values_file_without_an_image_block_is_refused() -> None:
    with pytest.raises(ValueError, match=r"workspace\.image"):
        pin_values("image:\n  registry: ''\n  repository: pko\n  tag: ''\n  digest: ''\n", PINS)


@pytest.mark.parametrize(
    ("text", "reason"),
    [("1.0.0", "SemVer 0.N.M"), ("v0.1", "SemVer 0.N.M"), ("latest", "SemVer"), ("v0.1.00", "SemVer")],
)
def test_a_wrong_version_string_is_refused(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        validate_version(text, VERSION)


def test_a_version_that_is_not_the_trees_is_refused() -> None:
    with pytest.raises(ValueError, match=r"pko/version\.py"):
        validate_version("v0.99.0", VERSION)


def test_krew_manifest_names_the_archive_and_its_digest() -> None:
    uri = "https://example.test/kubectl-pko.tar.gz"
    manifest = yaml.safe_load(krew_manifest(VERSION, uri, "0" * 64, "h"))
    (platform,) = manifest["spec"]["platforms"]
    assert (manifest["kind"], manifest["metadata"]["name"], manifest["spec"]["version"]) == (
        "Plugin", "pko", f"v{VERSION}")  # fmt: skip
    assert (platform["uri"], platform["sha256"], platform["bin"]) == (
        "https://example.test/kubectl-pko.tar.gz", "0" * 64, "kubectl-pko")  # fmt: skip


def test_sha256sums_lists_every_file_as_sha256sum_checks_it(tmp_path: Path) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "install.yaml").write_text("a")
    (tmp_path / "plugins" / "pko.yaml").write_text("b")
    (tmp_path / "SHA256SUMS").write_text(sha256sums(tmp_path))
    assert f"{hashlib.sha256(b'a').hexdigest()}  install.yaml" in (tmp_path / "SHA256SUMS").read_text()
    check = ["sha256sum", "--check", "--strict", "SHA256SUMS"]
    subprocess.run(check, cwd=tmp_path, check=True, capture_output=True)
