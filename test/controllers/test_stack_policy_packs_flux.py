"""Policy packs from a Flux source (pure, issue 43): the API takes exactly one source per pack and a
``fluxSource`` shaped as the Stack's own; the Stack's Workspace fetches the pack's artifact at its
digest in an init container of its own (the agent's ``init``, digest checked, size bounded as for the
program's artifact); the Update runs the pack from that directory, marked fetched for the agent; a new
artifact digest is a reason to run again; the Flux source's events wake the Stacks whose packs read it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pko.api.stack import Stack
from pko.api.stackpolicypacks import PolicyPack
from pko.api.validation import validate_stack
from pko.api.workspace import PolicyPackSource
from pydantic import ValidationError

from pko.controllers.options import ControllerOptions
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.ensure import plan_update
from pko.controllers.stack.kinds import spec_kind
from pko.controllers.stack.policypacks import enforced_packs, git_packs, packs_digest
from pko.controllers.stack.status import plan_sync, record_succeeded
from pko.controllers.stack.templates import index_workspace_template
from pko.controllers.stack.updateobject import Run, build_update
from pko.controllers.stack.watches import (
    INDEX_FLUX,
    INDEX_TEMPLATE_FLUX,
    INDEX_WORKSPACE_TEMPLATE,
    flux_key,
    flux_source_stacks,
    index_flux,
    index_template_flux,
)
from pko.controllers.stack.workspaceobject import PackRevision, build_workspace, pack_commits
from pko.controllers.update.status import operation_request
from pko.controllers.workspace.workloads import desired_statefulset, parse_spec
from pko.machinery.store import Indexer

from .builders import workspace

NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
REF = {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "packs"}
FLUXED: dict[str, Any] = {"name": "platform", "fluxSource": {"sourceRef": REF, "dir": "packs/platform"}}
URL = "http://source-controller.flux-system.svc/gitrepository/apps/packs/aaaa.tar.gz"
DIGEST = "sha256:" + "a" * 64
GIT_PACK: dict[str, Any] = {"name": "shared", "git": {"url": "https://git.example/p.git", "branch": "main"}}


def stack(**spec: Any) -> Stack:
    return Stack.model_validate(
        {
            "metadata": {"name": "web", "namespace": "apps", "uid": "stack-uid", "generation": 3},
            "spec": {"stack": "dev", "programRef": {"name": "p"}, **spec},
        }
    )


def revision(pack: PolicyPack, digest: str = DIGEST) -> PackRevision:
    assert pack.flux_source is not None
    return PackRevision(pack.name, URL, digest, pack.flux_source.dir, artifact=True)


def pod_spec(ws: dict[str, Any], options: ControllerOptions) -> dict[str, Any]:
    spec: dict[str, Any] = desired_statefulset(ws, parse_spec(ws), options)["spec"]["template"]["spec"]
    return spec


def test_a_pack_has_exactly_one_source_and_a_flux_source_shaped_as_the_stacks_own() -> None:
    assert validate_stack(stack(policyPacks=[FLUXED, GIT_PACK])) == []
    with pytest.raises(ValidationError, match="one of path, git or fluxSource is required"):
        PolicyPack.model_validate({"name": "nowhere"})
    flux = FLUXED["fluxSource"]
    refused = [
        ({**FLUXED, "git": GIT_PACK["git"]}, "spec.policyPacks[0]", "neither git nor path"),
        ({**FLUXED, "path": "packs/platform"}, "spec.policyPacks[0]", "neither git nor path"),
        (
            {**FLUXED, "fluxSource": {**flux, "sourceRef": {**REF, "apiVersion": "v1"}}},
            "spec.policyPacks[0].fluxSource.sourceRef.apiVersion",
            "must be <group>/<version>",
        ),
        ({**FLUXED, "fluxSource": {**flux, "dir": "../etc"}}, "spec.policyPacks[0].fluxSource.dir", "inside"),
        ({**FLUXED, "fluxSource": {**flux, "dir": "/etc"}}, "spec.policyPacks[0].fluxSource.dir", "inside"),
    ]
    for pack, path, message in refused:
        errors = validate_stack(stack(policyPacks=[pack]))
        assert [(e.path, message in e.message) for e in errors] == [(path, True)], (pack, errors)
    with pytest.raises(
        ValueError, match=r'WorkspaceTemplate "pko-system/platform" spec.policyPacks\[0\]: with'
    ):
        enforced_packs("pko-system/platform", {"policyPacks": [{**FLUXED, "path": "x"}]})
    with pytest.raises(ValidationError, match="exactly one of git or flux is required"):
        PolicyPackSource.model_validate({"name": "platform"})
    with pytest.raises(ValidationError, match="exactly one of git or flux is required"):
        PolicyPackSource.model_validate(
            {"name": "platform", "git": {"url": "https://g/p.git"}, "flux": {"url": URL, "digest": DIGEST}}
        )


def test_the_workspace_fetches_the_packs_artifact_at_its_digest_in_an_init_container_of_its_own() -> None:
    s = stack(policyPacks=[{"name": "image", "path": "/opt/policy/image"}, FLUXED])
    (pack,) = git_packs((), s)
    assert pack.name == "platform", "a pack from a Flux source is fetched, as one from git"
    ws = build_workspace(s, None, packs=[revision(pack)])
    assert ws["spec"]["policyPackSources"] == [
        {"name": "platform", "flux": {"url": URL, "digest": DIGEST, "dir": "packs/platform"}}
    ]
    assert pack_commits(ws) == {"platform": DIGEST}
    options = ControllerOptions(agent_image="example/agent:v1", flux_max_untar_size_bytes=1 << 20)
    spec = pod_spec(workspace(ws["spec"]), options)
    assert [c["name"] for c in spec["initContainers"]] == ["bootstrap", "fetch-policy-0"]
    (fetch,) = [c for c in spec["initContainers"] if c["name"] == "fetch-policy-0"]
    assert fetch["args"] == ["/share/agent", "init", "-t", "/share/policy/platform"]
    assert fetch["env"] == [
        {"name": "FLUX_URL", "value": URL},
        {"name": "FLUX_DIGEST", "value": DIGEST},
        {"name": "FLUX_DIR", "value": "packs/platform"},
        {"name": "FLUX_MAX_UNTAR_SIZE_BYTES", "value": str(1 << 20)},
        {"name": "SOURCE_NAME", "value": "policy pack 'platform'"},
        {"name": "PULUMI_ENV", "value": "/share/.env"},  # every container's
    ]
    unbounded = pod_spec(workspace(ws["spec"]), ControllerOptions(agent_image="example/agent:v1"))
    (fetch,) = [c for c in unbounded["initContainers"] if c["name"] == "fetch-policy-0"]
    assert "FLUX_MAX_UNTAR_SIZE_BYTES" not in [e["name"] for e in fetch["env"]]


def test_the_update_runs_the_pack_from_its_directory_in_the_artifact_marked_fetched() -> None:
    s = stack(policyPacks=[FLUXED, {"name": "image", "path": "/opt/policy/image"}])
    ws = build_workspace(s, None, packs=[revision(git_packs((), s)[0])])
    ws["metadata"]["uid"] = "ws-uid"
    update = build_update(s, ws, "up", "m", now=NOW)
    assert update["spec"]["policyPacks"][0] == FLUXED
    update["metadata"]["uid"] = "u-1"
    request = operation_request(update).up
    assert request is not None
    assert [(p.name, p.path, p.fetched) for p in request.policy_pack] == [
        ("platform", "packs/platform", True),
        ("image", "/opt/policy/image", False),
    ]


def test_a_new_artifact_digest_of_a_pack_is_a_new_digest_the_stack_records() -> None:
    s = stack(policyPacks=[FLUXED])
    ws = build_workspace(s, None, packs=[revision(git_packs((), s)[0])])
    ws["metadata"]["uid"] = "ws-uid"
    ws["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    status: dict[str, Any] = {}
    run = Run(spec_kind(preview=False, deleting=False), "m")
    plan_update(s.wire(), s, status, ws, run=run, commit="abc", now=NOW, created=NOW, deleting=False)
    recorded = status["currentUpdate"]["policyPacksDigest"]
    assert recorded == packs_digest((), {"platform": DIGEST})
    moved = packs_digest((), {"platform": "sha256:" + "b" * 64})
    assert moved != recorded
    record_succeeded(
        status, status["currentUpdate"], {"metadata": {"name": "web-1"}, "spec": {"type": "up"}}, None, NOW
    )
    obj, settings = s.wire(), RetrySettings()
    assert plan_sync(obj, s.spec, status, "abc", NOW, settings, packs_digest=recorded).synced
    decision = plan_sync(obj, s.spec, status, "abc", NOW, settings, packs_digest=moved)
    assert not decision.synced and "a pack's Flux artifact digest" in decision.message


def test_a_flux_sources_event_wakes_the_stacks_whose_packs_read_it() -> None:
    obj = stack(
        fluxSource={"sourceRef": {**REF, "name": "app"}},
        programRef=None,
        policyPacks=[FLUXED, GIT_PACK],
        updateTemplate={
            "spec": {"policyPacks": [{**FLUXED, "fluxSource": {"sourceRef": {**REF, "name": "x"}}}]}
        },
    ).wire()
    assert index_flux(obj) == [
        flux_key("apps", REF["apiVersion"], "GitRepository", "app"),
        flux_key("apps", REF["apiVersion"], "GitRepository", "packs"),
        flux_key("apps", REF["apiVersion"], "GitRepository", "x"),
    ]
    twice = stack(policyPacks=[FLUXED, {**FLUXED, "name": "again"}]).wire()
    assert index_flux(twice) == [flux_key("apps", REF["apiVersion"], "GitRepository", "packs")]


def named(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name}, "spec": spec}


def test_a_flux_sources_event_wakes_the_stacks_a_template_enforces_a_pack_from_it_on() -> None:
    template_spec = {"policyPacks": [FLUXED, GIT_PACK, {**FLUXED, "name": "again"}]}
    assert index_template_flux(named("apps", "platform", template_spec)) == [
        flux_key(None, REF["apiVersion"], "GitRepository", "packs")
    ]
    templates = Indexer(indexers={INDEX_TEMPLATE_FLUX: index_template_flux})
    templates.add(named("apps", "platform", template_spec))  # referenced by Stacks of apps
    templates.add(named("pko", "default", {"policyPacks": [FLUXED]}))  # the operator's default
    templates.add(named("apps", "plain", {"policyPacks": [GIT_PACK]}))
    stacks = Indexer(indexers={INDEX_FLUX: index_flux, INDEX_WORKSPACE_TEMPLATE: index_workspace_template})
    ref = {"workspaceTemplateRef": {"name": "platform"}}
    stacks.add(named("apps", "web", ref))
    stacks.add(named("apps", "plain", {"workspaceTemplateRef": {"name": "plain"}}))
    stacks.add(named("apps", "own", {"policyPacks": [FLUXED]}))
    stacks.add(named("other", "web", {}))
    source = flux_key("apps", REF["apiVersion"], "GitRepository", "packs")
    # the Stack that names it, then those built with a template enforcing a pack from it
    assert flux_source_stacks(source, stacks, templates, None) == ["apps/own", "apps/web"]
    # the default template's: every Stack of the source's namespace, none of another
    assert sorted(flux_source_stacks(source, stacks, templates, "pko/default")) == [
        "apps/own",
        "apps/plain",
        "apps/web",
    ]
    elsewhere = flux_key("other", REF["apiVersion"], "GitRepository", "packs")
    assert flux_source_stacks(elsewhere, stacks, templates, "pko/default") == ["other/web"]
    assert flux_source_stacks(elsewhere, stacks, templates, None) == []
    unrelated = flux_key("apps", REF["apiVersion"], "GitRepository", "app")
    assert flux_source_stacks(unrelated, stacks, templates, "pko/default") == []
    assert flux_source_stacks(source, stacks, None, "pko/default") == ["apps/own"]  # kind not served
