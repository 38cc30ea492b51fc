"""The committed import of the Kubernetes definitions our CRDs embed (api/schemas/k8s-openapi-v*.json)
and its importer (hack/import_k8s_openapi.py): one file, exactly what the importer writes, from the
release the tests run."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pko.api.k8sschema import K8S_RELEASE, K8S_SOURCE

from pko.devtools import import_k8s_openapi as importer

from .conftest import CORE

REPO = Path(__file__).resolve().parents[2]


def test_exactly_one_import_is_committed_and_its_source_is_recorded() -> None:
    files = sorted((REPO / "api" / "schemas").glob("k8s-openapi-v*.json"))
    assert [f.name for f in files] == [f"k8s-openapi-v{K8S_RELEASE}.json"]
    assert re.fullmatch(r"1\.\d+\.\d+", K8S_RELEASE)
    assert K8S_RELEASE == importer.pinned_release(), "import the release the tests run (hack/versions.env)"
    assert K8S_SOURCE["repository"] == "https://github.com/kubernetes/kubernetes"
    assert K8S_SOURCE["path"] == "api/openapi-spec/swagger.json"
    assert re.fullmatch(r"h1:[A-Za-z0-9+/]{43}=", K8S_SOURCE["commit"])  # the Go module's go.sum hash


def test_committed_file_is_what_the_importer_writes() -> None:
    assert importer.check() == []


def test_drift_check_catches_stale_extra_and_hand_formatted_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [committed] = importer.committed_files()
    document = json.loads(committed.read_text())
    monkeypatch.setattr(importer, "SCHEMA_DIR", tmp_path)
    target = tmp_path / committed.name

    target.write_text(importer.render(document))
    assert importer.check() == []

    stray = copy.deepcopy(document)
    stray["definitions"][CORE + "Pod"] = {"type": "object"}
    target.write_text(importer.render(stray))
    assert any("not reachable from ROOTS" in p for p in importer.check())

    target.write_text(json.dumps(document, indent=2))
    assert any("canonical form" in p for p in importer.check())

    broken = copy.deepcopy(document)
    del broken["definitions"][CORE + "ContainerPort"]
    target.write_text(importer.render(broken))
    assert any("ContainerPort" in p for p in importer.check())

    target.write_text(importer.render(document))
    monkeypatch.setattr(importer, "ROOTS", (*importer.ROOTS, CORE + "ServicePort", CORE + "Capabilities"))
    assert importer.check() == []  # both already reachable: no change
    monkeypatch.setattr(importer, "ROOTS", (*importer.ROOTS, "io.k8s.api.apps.v1.StatefulSetSpec"))
    assert any("StatefulSetSpec" in p for p in importer.check())


def test_importer_takes_the_closure_records_the_release_and_replaces_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [committed] = importer.committed_files()
    document = json.loads(committed.read_text())
    swagger: dict[str, Any] = {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.99.1"},
        "definitions": {
            **document["definitions"],
            "io.k8s.api.apps.v1.Deployment": {"type": "object", "properties": {}},
        },
    }
    swagger_file = tmp_path / "swagger.json"
    swagger_file.write_text(json.dumps(swagger))
    out = tmp_path / "schemas"
    out.mkdir()
    (out / "k8s-openapi-v1.20.2.json").write_text("{}")
    monkeypatch.setattr(importer, "SCHEMA_DIR", out)
    monkeypatch.setattr(importer, "REPO_ROOT", tmp_path)

    assert importer.main(["--swagger", str(swagger_file), "--commit", "c0ffee"]) == 0

    assert sorted(p.name for p in out.iterdir()) == ["k8s-openapi-v1.99.1.json"]
    written = json.loads((out / "k8s-openapi-v1.99.1.json").read_text())
    assert written["definitions"] == document["definitions"]
    assert written["source"] == {
        "repository": "https://github.com/tomplus/kubernetes_asyncio",
        "commit": "c0ffee",
        "path": "kubernetes_asyncio/swagger.json.unprocessed",
        "kubernetesRelease": "1.99.1",
    }

    swagger["info"]["version"] = "unversioned"
    swagger_file.write_text(json.dumps(swagger))
    assert importer.main(["--swagger", str(swagger_file)]) == 2  # no release anywhere: refuse
    assert importer.main(["--swagger", str(swagger_file), "--release", "v1.99.2"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["k8s-openapi-v1.99.2.json"]


@pytest.mark.skipif(
    not (importer.GOMODCACHE / f"k8s.io/kubernetes@v{K8S_RELEASE}").is_dir(),
    reason="the k8s.io/kubernetes module is cached by hack/build-kubernetes.sh",
)
def test_committed_file_equals_a_fresh_import_from_the_go_module() -> None:
    assert importer.main(["--check", "--from-go-module"]) == 0
