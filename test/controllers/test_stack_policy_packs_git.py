"""Policy packs from git of their own (pure, issue 43): the API refuses a pack located two ways or
outside its repository; the Stack's Workspace fetches each pack at its resolved commit in an init
container of its own (credentials as Secret references, there only); the Update runs the pack at
that commit, marked fetched for the agent; a new commit of a pack is a reason to run again."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pko.agent.policypacks import pack_args, pack_path
from pko.api.generated.pko.agent import v1 as pb
from pko.api.stack import Stack
from pko.api.stackpolicypacks import PolicyPack
from pko.api.validation import validate_stack
from pydantic import ValidationError

from pko.controllers.options import ControllerOptions
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.ensure import plan_update
from pko.controllers.stack.insecuretransport import pack_refusal
from pko.controllers.stack.kinds import spec_kind
from pko.controllers.stack.policypacks import enforced_packs, git_packs, packs_digest
from pko.controllers.stack.status import plan_sync, record_succeeded
from pko.controllers.stack.updateobject import Run, build_update
from pko.controllers.stack.workspaceobject import PackRevision, build_workspace
from pko.controllers.update.status import operation_request
from pko.controllers.workspace.workloads import desired_statefulset, parse_spec

from .builders import workspace

NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
URL = "https://git.example/platform/policies.git"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = {"name": "policies-pat", "key": "token"}
SHARED: dict[str, Any] = {
    "name": "shared",
    "path": "packs/shared",
    "git": {"url": URL, "branch": "main", "auth": {"token": TOKEN}},
}


OPTIONS = ControllerOptions(agent_image="example/agent:v1", agent_image_pull_policy="Always")


def pod_spec(ws: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = desired_statefulset(ws, parse_spec(ws), OPTIONS)["spec"]["template"]["spec"]
    return spec


def by_name(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (item,) = [i for i in items if i["name"] == name]
    return item


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def stack(**spec: Any) -> Stack:
    return Stack.model_validate(
        {
            "metadata": {"name": "web", "namespace": "apps", "uid": "stack-uid", "generation": 3},
            "spec": {"stack": "dev", "programRef": {"name": "p"}, **spec},
        }
    )


def revision(pack: PolicyPack, commit: str = COMMIT) -> PackRevision:
    assert pack.git is not None
    return PackRevision(pack.name, pack.git.url, commit, pack.path, pack.git.auth)


def test_a_pack_is_located_by_a_path_or_by_git_with_its_path_inside_the_repository() -> None:
    assert (
        validate_stack(stack(policyPacks=[SHARED, {"name": "root", "git": {"url": URL, "commit": "abc"}}]))
        == []
    )
    with pytest.raises(ValidationError, match="one of path, git or fluxSource is required"):
        PolicyPack.model_validate({"name": "nowhere"})
    refused = [
        ({**SHARED, "path": "/opt/policy"}, "spec.policyPacks[0].path"),
        ({**SHARED, "path": "packs/../../etc"}, "spec.policyPacks[0].path"),
        ({**SHARED, "git": {"url": URL, "branch": "main", "commit": "abc"}}, "spec.policyPacks[0].git"),
        ({**SHARED, "git": {"url": URL}}, "spec.policyPacks[0].git"),
        ({**SHARED, "git": {"url": "not a url", "branch": "main"}}, "spec.policyPacks[0].git.url"),
        ({**SHARED, "git": {"url": URL, "branch": "main", "auth": {}}}, "spec.policyPacks[0].git.auth"),
        (
            {**SHARED, "git": {"url": URL, "branch": "main", "auth": {"username": TOKEN}}},
            "spec.policyPacks[0].git.auth.password",
        ),
    ]
    for pack, path in refused:
        assert path in [e.path for e in validate_stack(stack(policyPacks=[pack]))], pack
    with pytest.raises(
        ValueError, match=r'WorkspaceTemplate "pko-system/platform" spec.policyPacks\[0\].path'
    ):
        enforced_packs("pko-system/platform", {"policyPacks": [{**SHARED, "path": "/abs"}]})


def test_the_workspace_fetches_each_pack_in_an_init_container_of_its_own() -> None:
    s = stack(policyPacks=[SHARED, {"name": "image", "path": "/opt/policy/image"}])
    packs = git_packs((), s)
    assert [p.name for p in packs] == ["shared"]
    ws = build_workspace(s, None, packs=[revision(packs[0])])
    assert ws["spec"]["policyPackSources"] == [
        {
            "name": "shared",
            "git": {
                "url": URL,
                "ref": COMMIT,
                "shallow": True,
                "dir": "packs/shared",
                "auth": {"token": {"name": "policies-pat", "key": "token"}},
            },
        }
    ]
    spec = pod_spec(workspace(ws["spec"]))
    assert [c["name"] for c in spec["initContainers"]] == ["bootstrap", "fetch-policy-0"]
    fetch = by_name(spec["initContainers"], "fetch-policy-0")
    assert fetch["args"] == ["/share/agent", "init", "-t", "/share/policy/shared"]
    env = env_of(fetch)
    assert {
        k: env[k].get("value") for k in ("GIT_URL", "GIT_REVISION", "GIT_DIR", "GIT_SHALLOW", "SOURCE_NAME")
    } == {
        "GIT_URL": URL,
        "GIT_REVISION": COMMIT,
        "GIT_DIR": "packs/shared",
        "GIT_SHALLOW": "true",
        "SOURCE_NAME": "policy pack 'shared'",
    }
    assert env["GIT_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "policies-pat", "key": "token"}}
    assert fetch["securityContext"]["allowPrivilegeEscalation"] is False  # restricted, as every container
    pulumi = by_name(spec["containers"], "pulumi")
    assert "GIT_TOKEN" not in env_of(pulumi), "the program must not see the pack repository's credentials"
    assert "policyPackSources" not in build_workspace(s, None)["spec"]


def test_the_update_runs_the_pack_at_the_fetched_commit_marked_fetched_for_the_agent() -> None:
    s = stack(policyPacks=[SHARED])
    ws = build_workspace(s, None, packs=[revision(git_packs((), s)[0])])
    ws["metadata"]["uid"] = "ws-uid"
    update = build_update(s, ws, "up", "m", now=NOW)
    (pack,) = update["spec"]["policyPacks"]
    assert pack["git"] == {"url": URL, "commit": COMMIT, "auth": {"token": TOKEN}}
    update["metadata"]["uid"] = "u-1"
    request = operation_request(update).up
    assert request is not None
    assert [(p.name, p.path, p.fetched) for p in request.policy_pack] == [("shared", "packs/shared", True)]


def test_the_agent_finds_a_fetched_pack_beside_the_program_and_refuses_one_that_leaves_it(
    tmp_path: Path,
) -> None:
    program = tmp_path / "workspace"
    fetched = pb.PolicyPack(name="shared", path="packs/shared", fetched=True)
    assert pack_path(fetched, program) == tmp_path / "policy" / "shared" / "packs" / "shared"
    share = tmp_path / "share"  # a pod: the program's directory is /share/source/<dir>, resolved
    assert (
        pack_path(fetched, program / "app", share / "policy")
        == share / "policy" / "shared" / "packs" / "shared"
    )
    assert pack_path(pb.PolicyPack(name="local", path="packs/local"), program) == program / "packs" / "local"
    escaping = pb.PolicyPack(name="shared", path="../../etc", fetched=True)
    with pytest.raises(ValueError, match="must stay inside its repository"):
        pack_args([escaping], program, tmp_path / "config", "op-1")


def test_a_new_commit_of_a_pack_runs_the_stack_again() -> None:
    assert packs_digest((), {}) == "", "a Stack without packs from git keeps its digest"
    s = stack(policyPacks=[SHARED])
    ws = build_workspace(s, None, packs=[revision(git_packs((), s)[0])])
    ws["metadata"]["uid"] = "ws-uid"
    ws["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    obj = s.wire()
    status: dict[str, Any] = {}
    run = Run(spec_kind(preview=False, deleting=False), "m")
    plan_update(obj, s, status, ws, run=run, commit="abc", now=NOW, created=NOW, deleting=False)
    recorded = status["currentUpdate"]["policyPacksDigest"]
    assert recorded == packs_digest((), {"shared": COMMIT})
    update = {"metadata": {"name": "web-1"}, "spec": {"type": "up"}}
    record_succeeded(status, status["currentUpdate"], update, None, NOW)
    settings = RetrySettings()
    assert plan_sync(obj, s.spec, status, "abc", NOW, settings, packs_digest=recorded).synced
    moved = packs_digest((), {"shared": "f" * 40})
    decision = plan_sync(obj, s.spec, status, "abc", NOW, settings, packs_digest=moved)
    assert not decision.synced and "a pack's git commit" in decision.message


def test_a_packs_credentials_over_plain_http_are_refused_unless_the_operator_allows_them() -> None:
    plain = "http://git.internal/policies.git"
    with_token = PolicyPack.model_validate({**SHARED, "git": {**SHARED["git"], "url": plain}})
    refused = pack_refusal(with_token, allowed=False)
    assert refused is not None and refused.reason == "CredentialsOverPlainHTTPRefused"
    assert refused.message.startswith(f"policy pack 'shared': {plain} is plain HTTP and git.auth.token")
    assert pack_refusal(with_token, allowed=True) is None
    anonymous = PolicyPack.model_validate({**SHARED, "git": {"url": plain, "branch": "main"}})
    assert pack_refusal(anonymous, allowed=False) is None, "an in-cluster mirror without credentials"
    assert pack_refusal(PolicyPack.model_validate(SHARED), allowed=False) is None  # https


def test_a_pack_from_git_the_update_template_names_is_fetched_and_pinned_too() -> None:
    s = stack(
        policyPacks=[{"name": "image", "path": "/opt/policy/image"}],
        updateTemplate={"spec": {"policyPacks": [SHARED]}},
    )
    (pack,) = git_packs((), s)
    assert pack.name == "shared"
    ws = build_workspace(s, None, packs=[revision(pack)])
    ws["metadata"]["uid"] = "ws-uid"
    (ran,) = build_update(s, ws, "up", "m", now=NOW)["spec"]["policyPacks"]
    assert ran["git"]["commit"] == COMMIT
