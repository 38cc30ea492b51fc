"""The CEL rules of a policy pack from git or a Flux source (issue 43) on a real kube-apiserver, and
their Python twins, as test_cel_rules.py checks the Stack's own: each mistake refused by both at the
same field, each good neighbour accepted by both."""

from __future__ import annotations

from typing import Any

import pytest

from .test_cel_rules import GIT, create, name, python_errors, refused, stack

pytestmark = pytest.mark.cluster

URL = "https://git.example.com/platform/policies.git"
PACK: dict[str, Any] = {"name": "platform", "path": "packs/platform", "git": {"url": URL, "branch": "main"}}
FLUX: dict[str, Any] = {
    "sourceRef": {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "packs"},
    "dir": "packs/platform",
}

REFUSED: dict[str, tuple[dict[str, Any], str, str]] = {
    "branch-and-commit": (
        {**PACK, "git": {"url": URL, "branch": "main", "commit": "abc"}},
        "spec.policyPacks[0].git",
        "exactly one of branch or commit is required",
    ),
    "neither-branch-nor-commit": (
        {**PACK, "git": {"url": URL}},
        "spec.policyPacks[0].git",
        "exactly one of branch or commit is required",
    ),
    "absolute-path-in-the-repository": (
        {**PACK, "path": "/opt/policy"},
        "spec.policyPacks[0].path",
        "with git, path is a directory inside the repository",
    ),
    "flux-and-git": (
        {"name": "platform", "git": PACK["git"], "fluxSource": FLUX},
        "spec.policyPacks[0]",
        "with fluxSource, neither git nor path",
    ),
    "flux-and-path": (
        {"name": "platform", "path": "packs/platform", "fluxSource": FLUX},
        "spec.policyPacks[0]",
        "with fluxSource, neither git nor path",
    ),
}
ACCEPTED: dict[str, dict[str, Any]] = {
    "branch-and-token": {**PACK, "git": {**PACK["git"], "auth": {"token": {"name": "pat", "key": "t"}}}},
    "commit-at-the-root": {"name": "root", "git": {"url": URL, "commit": "abc"}},
    "absolute-path-without-git": {"name": "image", "path": "/opt/policy/image"},
    "flux-source": {"name": "flux", "fluxSource": FLUX},
    "flux-source-at-the-root": {"name": "flux", "fluxSource": {"sourceRef": FLUX["sourceRef"]}},
}


@pytest.mark.parametrize(("pack", "field", "message"), REFUSED.values(), ids=REFUSED.keys())
async def test_a_pack_rule_refuses_at_its_field_as_the_operator_does(
    api_client: Any, crds: list[str], namespace: str, pack: dict[str, Any], field: str, message: str
) -> None:
    obj = stack(name(), namespace, **GIT, policyPacks=[pack])
    status = await refused(api_client, obj)
    causes = [(c["field"], c["message"]) for c in status["details"]["causes"]]
    assert any(f == field and message in m for f, m in causes), causes
    errors = python_errors(obj)
    assert any(e.startswith(field) for e in errors), errors


@pytest.mark.parametrize("pack", ACCEPTED.values(), ids=ACCEPTED.keys())
async def test_a_good_pack_is_accepted_by_both(
    api_client: Any, crds: list[str], namespace: str, pack: dict[str, Any]
) -> None:
    obj = stack(name(), namespace, **GIT, policyPacks=[pack])
    assert python_errors(obj) == []
    await create(api_client, obj)
