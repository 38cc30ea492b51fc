"""Policy packs a WorkspaceTemplate enforces (pure, issue 43): merged with the Stack's own by name,
the template's first and winning a clash; a Stack (nor its updateTemplate) cannot remove one; a
change of the enforced packs makes the Stack run again; a template whose pack is not valid makes the
Stack wait with a message naming it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pko.api.stack import Stack
from pko.api.stackpolicypacks import PolicyPack
from pko.api.stackterms import ENFORCED_POLICY_PACKS_ANNOTATION, POLICY_PACK_OVERRIDDEN

from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.ensure import plan_update
from pko.controllers.stack.kinds import spec_kind
from pko.controllers.stack.policypacks import Enforced, enforced_packs, merge_policy_packs
from pko.controllers.stack.status import plan_sync, record_succeeded
from pko.controllers.stack.steps import CreateUpdate, Emit
from pko.controllers.stack.templates import resolve_templates
from pko.controllers.stack.updateobject import Run, build_update

NOW = datetime(2026, 12, 7, 1, 30, tzinfo=UTC)
WS = {
    "metadata": {"name": "web", "uid": "ws-uid"},
    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
}
PLATFORM = {"name": "platform", "path": "/opt/policy/platform", "config": {"no-public-lb": "mandatory"}}
TEAM_TEMPLATE = {"name": "team", "path": "/opt/policy/team"}


def stack(**spec: Any) -> Stack:
    return Stack.model_validate(
        {
            "metadata": {"name": "web", "namespace": "apps", "uid": "stack-uid", "generation": 3},
            "spec": {"stack": "dev", "programRef": {"name": "p"}, **spec},
        }
    )


def pack(**fields: Any) -> PolicyPack:
    return PolicyPack.model_validate(fields)


def enforced(*packs: dict[str, Any], source: str = "pko-system/platform") -> tuple[Enforced, ...]:
    return enforced_packs(source, {"policyPacks": list(packs)})


def test_a_stack_that_names_no_pack_runs_the_templates_packs() -> None:
    merged = merge_policy_packs(enforced(PLATFORM), None)
    assert [p.wire() for p in merged.packs] == [PLATFORM]
    assert merged.sources == {"platform": "pko-system/platform"} and merged.overridden == ()
    update = build_update(stack(), WS, "up", "m", now=NOW, enforced=enforced(PLATFORM))
    assert update["spec"]["policyPacks"] == [PLATFORM]
    sources = json.loads(update["metadata"]["annotations"][ENFORCED_POLICY_PACKS_ANNOTATION])
    assert sources == {"platform": "pko-system/platform"}
    preview = build_update(stack(preview=True), WS, "preview", "m", now=NOW, enforced=enforced(PLATFORM))
    assert preview["spec"]["policyPacks"] == [PLATFORM]
    destroy = build_update(stack(), WS, "destroy", "m", now=NOW, enforced=enforced(PLATFORM))
    assert "policyPacks" not in destroy["spec"]
    own = build_update(stack(policyPacks=[TEAM_TEMPLATE]), WS, "up", "m", now=NOW)
    assert own["spec"]["policyPacks"] == [TEAM_TEMPLATE]
    assert ENFORCED_POLICY_PACKS_ANNOTATION not in (own["metadata"].get("annotations") or {})


def test_enforced_packs_come_first_then_the_stacks_own() -> None:
    own = [pack(name="commands", path="policies/commands")]
    merged = merge_policy_packs((*enforced(PLATFORM), *enforced(TEAM_TEMPLATE, source="apps/team")), own)
    assert [p.name for p in merged.packs] == ["platform", "team", "commands"]
    assert merged.sources == {"platform": "pko-system/platform", "team": "apps/team"}


def test_a_stack_cannot_weaken_an_enforced_pack_of_the_same_name() -> None:
    weakened = {"name": "platform", "path": "/opt/policy/platform", "config": {"no-public-lb": "disabled"}}
    merged = merge_policy_packs(enforced(PLATFORM), [pack(**weakened)])
    assert [p.wire() for p in merged.packs] == [PLATFORM]
    assert merged.overridden == ("platform",)


def test_the_default_templates_pack_wins_over_a_referenced_templates_of_the_same_name() -> None:
    namespace_copy = {"name": "platform", "path": "/tmp/lenient"}
    merged = merge_policy_packs((*enforced(PLATFORM), *enforced(namespace_copy, source="apps/team")), None)
    assert [p.wire() for p in merged.packs] == [PLATFORM]
    assert merged.sources == {"platform": "pko-system/platform"}


def test_an_update_template_cannot_remove_an_enforced_pack() -> None:
    s = stack(updateTemplate={"spec": {"policyPacks": [TEAM_TEMPLATE]}})
    update = build_update(s, WS, "up", "m", now=NOW, enforced=enforced(PLATFORM))
    assert update["spec"]["policyPacks"] == [PLATFORM, TEAM_TEMPLATE]
    emptied = stack(updateTemplate={"spec": {"policyPacks": []}})
    update = build_update(emptied, WS, "up", "m", now=NOW, enforced=enforced(PLATFORM))
    assert update["spec"]["policyPacks"] == [PLATFORM]


def test_the_digest_covers_the_enforced_packs_and_their_config_only() -> None:
    base = merge_policy_packs(enforced(PLATFORM), None).digest
    assert base.startswith("sha256:")
    assert merge_policy_packs(enforced(PLATFORM), [pack(name="own", path="x")]).digest == base
    relaxed = {**PLATFORM, "config": {"no-public-lb": "advisory"}}
    assert merge_policy_packs(enforced(relaxed), None).digest != base
    assert merge_policy_packs((), [pack(name="own", path="x")]).digest == ""


def test_the_templates_packs_are_read_with_the_default_templates_first() -> None:
    templates = {
        "pko-system/platform": {"spec": {"policyPacks": [PLATFORM], "spec": {"image": "i"}}},
        "apps/team": {"spec": {"policyPacks": [TEAM_TEMPLATE]}},
    }
    got = resolve_templates(
        stack(workspaceTemplateRef={"name": "team"}), "pko-system/platform", templates.get, served=True
    )
    assert [(e.pack.name, e.source) for e in got.enforced] == [
        ("platform", "pko-system/platform"),
        ("team", "apps/team"),
    ]
    assert got.layers == ({"spec": {"image": "i"}}, {})  # the packs are not part of the Workspace


def test_a_template_with_an_invalid_pack_makes_the_stack_wait_naming_it() -> None:
    bad = {"pko-system/platform": {"spec": {"policyPacks": [{"name": "platform"}]}}}
    got = resolve_templates(stack(), "pko-system/platform", bad.get, served=True)
    assert got.missing is not None
    assert 'WorkspaceTemplate "pko-system/platform" spec.policyPacks[0]' in got.missing
    assert "path" in got.missing


def test_starting_an_update_records_the_digest_and_warns_of_an_overridden_pack() -> None:
    s = stack(policyPacks=[{"name": "platform", "path": "/tmp/lenient"}])
    obj = s.wire()
    status: dict[str, Any] = {}
    run = Run(spec_kind(preview=False, deleting=False), "m")
    plan = plan_update(
        obj,
        s,
        status,
        WS,
        run=run,
        commit="abc",
        now=NOW,
        created=NOW,
        deleting=False,
        enforced=enforced(PLATFORM),
    )
    (create,) = [w for w in plan.writes if isinstance(w, CreateUpdate)]
    assert create.body["spec"]["policyPacks"] == [PLATFORM]
    digest = merge_policy_packs(enforced(PLATFORM), None).digest
    assert status["currentUpdate"]["policyPacksDigest"] == digest
    (warning,) = [w for w in plan.writes if isinstance(w, Emit) and w.reason == POLICY_PACK_OVERRIDDEN]
    assert warning.type == "Warning" and "platform (pko-system/platform)" in warning.message


def test_a_change_of_the_enforced_packs_runs_the_stack_again() -> None:
    s = stack()
    obj = s.wire()
    old = merge_policy_packs(enforced(PLATFORM), None).digest
    status: dict[str, Any] = {}
    current = {"generation": 3, "name": "web-1", "commit": "abc", "policyPacksDigest": old}
    record_succeeded(status, current, {"metadata": {"name": "web-1"}, "spec": {"type": "up"}}, None, NOW)
    assert status["lastUpdate"]["policyPacksDigest"] == old
    settings = RetrySettings()
    assert plan_sync(obj, s.spec, status, "abc", NOW, settings, packs_digest=old).synced
    relaxed = merge_policy_packs(enforced({**PLATFORM, "config": {"no-public-lb": "advisory"}}), None).digest
    decision = plan_sync(obj, s.spec, status, "abc", NOW, settings, packs_digest=relaxed)
    assert not decision.synced and "policy packs changed" in decision.message
    removed = plan_sync(obj, s.spec, status, "abc", NOW, settings, packs_digest="")
    assert not removed.synced


def test_a_stack_without_enforced_packs_stays_in_sync_as_before() -> None:
    s = stack(policyPacks=[{"name": "own", "path": "x"}])
    status: dict[str, Any] = {}
    record_succeeded(
        status, {"generation": 3, "name": "web-1", "commit": "abc"}, {"spec": {"type": "up"}}, None, NOW
    )
    assert "policyPacksDigest" not in status["lastUpdate"]
    assert plan_sync(s.wire(), s.spec, status, "abc", NOW, RetrySettings()).synced
