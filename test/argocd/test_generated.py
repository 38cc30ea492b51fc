"""config/argocd/argocd-cm.yaml is what hack/gen_argocd.py makes of the .lua sources, holds them byte
for byte where Argo CD reads them, and docs/gitops.md's patch command applies it to an argocd-cm."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from pko.devtools import gen_argocd
from pko.devtools.argocd import ACTIONS_KEY, CONFIGMAP, HEALTH_KEY, Scripts
from pko.devtools.kubectl import kubectl

SOURCES = gen_argocd.SOURCES


def test_the_configmap_patch_is_up_to_date_with_the_lua_sources() -> None:
    assert CONFIGMAP.read_text() == gen_argocd.render(), "run hack/gen_argocd.py"
    assert gen_argocd.main(["--check"]) == 0


def test_check_fails_when_a_lua_source_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "argocd"
    shutil.copytree(SOURCES, copy)
    monkeypatch.setattr(gen_argocd, "SOURCES", copy)
    monkeypatch.setattr(gen_argocd, "OUTPUT", copy / "argocd-cm.yaml")
    monkeypatch.setattr(gen_argocd, "REPO_ROOT", tmp_path)
    assert gen_argocd.main(["--check"]) == 0
    retry = copy / "actions" / "retry" / "action.lua"
    retry.write_text(retry.read_text() + "-- changed\n")
    assert gen_argocd.main(["--check"]) == 1
    assert gen_argocd.main([]) == 0
    assert gen_argocd.main(["--check"]) == 0
    assert Scripts.from_configmap(copy / "argocd-cm.yaml").actions["retry"].endswith("-- changed\n")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("return {}\t\n", "a tab"),
        ("return {} \n", "trailing whitespace"),
        ("return {}", "exactly one newline"),
        ("return {}\n\n", "exactly one newline"),
        ("  return {}\n", "first line"),
    ],
)
def test_sources_a_literal_block_would_change_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, problem: str
) -> None:
    copy = tmp_path / "argocd"
    shutil.copytree(SOURCES, copy)
    monkeypatch.setattr(gen_argocd, "SOURCES", copy)
    monkeypatch.setattr(gen_argocd, "REPO_ROOT", tmp_path)
    (copy / "health.lua").write_text(text)
    with pytest.raises(gen_argocd.SourceError, match=problem):
        gen_argocd.render()


def test_the_patch_holds_every_script_byte_for_byte_under_argo_cds_keys() -> None:
    scripts = Scripts.from_configmap()
    assert scripts.health == (SOURCES / "health.lua").read_text()
    assert scripts.discovery == (SOURCES / "actions" / "discovery.lua").read_text()
    assert list(scripts.actions) == ["approve", "refresh", "retry"]
    for name, script in scripts.actions.items():
        assert script == (SOURCES / "actions" / name / "action.lua").read_text()
    doc = yaml.safe_load(CONFIGMAP.read_text())
    assert doc["kind"] == "ConfigMap" and doc["metadata"] == {"name": "argocd-cm"}
    assert sorted(doc["data"]) == [ACTIONS_KEY, HEALTH_KEY]


def test_the_readme_command_merges_the_patch_into_an_existing_argocd_cm(cluster: Any, tmp_path: Path) -> None:
    """``kubectl -n argocd patch configmap argocd-cm --patch-file config/argocd/argocd-cm.yaml``, the
    docs/gitops.md's command, on a real apiserver: the two keys are added, the settings already there stay."""
    ns = f"argocd-patch-{uuid.uuid4().hex[:8]}"
    kubectl(cluster, "create", "namespace", ns)
    try:
        kubectl(
            cluster, "-n", ns, "create", "configmap", "argocd-cm", "--from-literal=url=https://argo.example"
        )
        kubectl(cluster, "-n", ns, "patch", "configmap", "argocd-cm", "--patch-file", str(CONFIGMAP))
        live = yaml.safe_load(
            kubectl(cluster, "-n", ns, "get", "configmap", "argocd-cm", "-o", "yaml").stdout
        )
        expected = yaml.safe_load(CONFIGMAP.read_text())["data"]
        assert live["data"] == {"url": "https://argo.example", **expected}
    finally:
        kubectl(cluster, "delete", "namespace", ns, "--wait=false")
