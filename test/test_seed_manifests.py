"""Every Stack and Program manifest from the product's seed docs is accepted as written.

test/data/seeds/ holds each Stack/Program/Workspace/Update manifest of the seed docs, one per file,
with a header comment naming the doc it came from. Each is created on the real kube-apiserver
(with the CRDs from config/crd) unchanged except for `metadata.namespace`, then read back: the
spec (`program` for a Program), labels and annotations must be exactly what was sent.

A header line `# pruned: <path>` declares a field the API deliberately does not have (e.g.
`spec.initOnCreate`, removed from the Stack API before 1.0): the apiserver must drop exactly
those fields and keep everything else.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

DATA = Path(__file__).resolve().parent / "data" / "seeds"
PLURALS = {"Stack": "stacks", "Program": "programs", "Workspace": "workspaces", "Update": "updates"}
SEED = re.compile(r"^#\s*seed:\s*(?P<doc>\d{3}_[0-9a-f]{16}\.txt)\b")
PRUNED = re.compile(r"^#\s*pruned:\s*(?P<path>[\w.]+)\s*$")
# The parts of an object a user writes and expects to read back unchanged.
USER_FIELDS = ("spec", "program")

FILES = sorted(DATA.glob("*.yaml"))


def load(path: Path) -> tuple[dict[str, Any], list[str]]:
    text = path.read_text()
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    assert len(docs) == 1, f"{path.name}: one manifest per file"
    pruned = [m["path"] for line in text.splitlines() if (m := PRUNED.match(line))]
    return docs[0], pruned


def without(obj: dict[str, Any], dotted: str) -> dict[str, Any]:
    """A deep copy of `obj` with the field at `dotted` removed; the field must exist."""
    out = copy.deepcopy(obj)
    *parents, leaf = dotted.split(".")
    node = out
    for key in parents:
        node = node[key]
    del node[leaf]
    return out


def has(obj: dict[str, Any], dotted: str) -> bool:
    node: Any = obj
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def test_every_seed_file_names_its_seed_doc_and_kind() -> None:
    assert len(FILES) >= 10
    for path in FILES:
        head = path.read_text().splitlines()[0]
        assert SEED.match(head), f"{path.name}: first line must be `# seed: <doc>.txt ...`"
        manifest, pruned = load(path)
        assert manifest["kind"] in PLURALS, path.name
        for dotted in pruned:
            assert has(manifest, dotted), f"{path.name}: declares {dotted} pruned but does not set it"


@pytest.mark.cluster
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
async def test_seed_manifest_applies_unchanged_and_reads_back(
    api_client: Any, namespace: str, path: Path
) -> None:
    from kubernetes_asyncio import client

    manifest, pruned = load(path)
    body = copy.deepcopy(manifest)
    body["metadata"]["namespace"] = namespace
    group, _, version = body["apiVersion"].partition("/")
    plural = PLURALS[body["kind"]]
    name = body["metadata"]["name"]
    api = client.CustomObjectsApi(api_client)

    await api.create_namespaced_custom_object(group, version, namespace, plural, body)
    try:
        stored = await api.get_namespaced_custom_object(group, version, namespace, plural, name)
    finally:
        # Several seeds share a name (e.g. `nginx-k8s-stack-production`); no operator runs here,
        # so nothing holds a finalizer and the delete is immediate.
        await api.delete_namespaced_custom_object(group, version, namespace, plural, name)

    expected = manifest
    for dotted in pruned:
        assert not has(stored, dotted), f"{path.name}: {dotted} was expected to be pruned"
        expected = without(expected, dotted)
    for field in USER_FIELDS:
        assert stored.get(field) == expected.get(field), f"{path.name}: {field} changed on the way in"
    for meta in ("labels", "annotations"):
        assert stored["metadata"].get(meta) == expected["metadata"].get(meta), f"{path.name}: metadata.{meta}"
