"""Invalid Stack, Program, Workspace and Update manifests are refused by the apiserver itself.

Each file in test/data/invalid/ holds one manifest with one mistake a user could make (wrong type,
unknown enum value, negative number or duration, missing required field, malformed podTemplate,
...) and `# expect: <text>` header lines. The manifest is created on the real kube-apiserver with
the CRDs from config/crd installed; it must be refused with 422 Invalid, and the apiserver's
message must contain every expected text, the first of which names the offending field; every
cause the apiserver lists must be about that field (so a manifest cannot pass for another reason).

Field paths are compared without list indices (`containers[0].name` and `containers.name` are the
same field), so a `# expect:` line may spell them either way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

DATA = Path(__file__).resolve().parent / "data" / "invalid"
PLURALS = {"Stack": "stacks", "Program": "programs", "Workspace": "workspaces", "Update": "updates"}
EXPECT = re.compile(r"^#\s*expect:\s*(?P<text>.+?)\s*$")
LIST_INDEX = re.compile(r"\[\d+\]")
# Not a cause of its own: the apiserver skips the CEL rules of an object that fails its schema and
# says so in one more cause (field "<nil>").
RULES_NOT_CHECKED = "some validation rules were not checked because the object was invalid"


@dataclass(frozen=True)
class InvalidManifest:
    path: Path
    body: dict[str, Any]
    expects: tuple[str, ...]

    @property
    def group_version(self) -> tuple[str, str]:
        group, _, version = self.body["apiVersion"].partition("/")
        return group, version


def load(path: Path) -> InvalidManifest:
    text = path.read_text()
    expects = tuple(m["text"] for line in text.splitlines() if (m := EXPECT.match(line)))
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    assert len(docs) == 1, f"{path.name}: one manifest per file"
    return InvalidManifest(path, docs[0], expects)


FILES = sorted(DATA.glob("*.yaml"))


def test_the_invalid_set_is_broad() -> None:
    manifests = [load(p) for p in FILES]
    assert len(manifests) >= 30
    kinds = {m.body["kind"] for m in manifests}
    assert kinds == set(PLURALS), kinds
    for m in manifests:
        assert m.expects, f"{m.path.name}: no `# expect:` line"
        first = m.expects[0]
        top = first.split(".")[0]
        assert top in ("metadata", "spec", "program"), f"{m.path.name}: first expect must name the field"
        if top != "metadata":
            assert m.body["metadata"]["name"] == m.path.stem, f"{m.path.name}: name the object after the file"


@pytest.mark.cluster
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
async def test_apiserver_rejects_invalid_manifest(api_client: Any, namespace: str, path: Path) -> None:
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    manifest = load(path)
    group, version = manifest.group_version
    plural = PLURALS[manifest.body["kind"]]
    api = client.CustomObjectsApi(api_client)
    try:
        await api.create_namespaced_custom_object(group, version, namespace, plural, manifest.body)
    except ApiException as e:
        status = json.loads(e.body or "{}")
        assert e.status == 422, f"{path.name}: expected 422 Invalid, got {e.status}: {status.get('message')}"
        message = LIST_INDEX.sub("", status["message"])
        for expected in manifest.expects:
            assert LIST_INDEX.sub("", expected) in message, f"{path.name}: {expected!r} not in {message!r}"
        # One mistake per manifest: every cause the apiserver lists is about the named field.
        field = LIST_INDEX.sub("", manifest.expects[0])
        causes = [
            LIST_INDEX.sub("", c.get("field", ""))
            for c in status["details"].get("causes", [])
            if RULES_NOT_CHECKED not in c.get("message", "")
        ]
        assert causes, f"{path.name}: no causes in {status}"
        for cause in causes:
            assert cause == field or cause.startswith(field + "."), f"{path.name}: unexpected cause {cause!r}"
    else:
        await api.delete_namespaced_custom_object(
            group, version, namespace, plural, manifest.body["metadata"]["name"]
        )
        pytest.fail(f"{path.name}: the apiserver accepted it")
