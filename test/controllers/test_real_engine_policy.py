"""Policy packs (issue 43) on the real Pulumi engine: the real operator, apiserver and
kube-controller-manager, and the play-kubelet running real agents with the CLI, the YAML and Node.js
language hosts and pulumi-kubernetes (as test_real_engine.py), and a JavaScript and a Python pack
(pko.devtools.policypacks), each with a mandatory and an advisory policy over ConfigMaps.

What a user relies on: a Stack whose program breaks a mandatory policy creates nothing, is Stalled
``PolicyViolation`` naming the pack, the policy, the resource and the policy's message, with a Warning
Event; once the program is fixed it is Ready, the advisory violation on its Update and in an Event.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pko.devtools.builds import built
from pko.devtools.policypacks import (
    engine_dirs,
    policy_sdk,
    python_policy_env,
    write_pack,
    write_python_pack,
)
from pko.devtools.realpulumi import RealPulumi, make_real_pulumi
from pko.devtools.waiting import wait_until

from .conftest import operator_env
from .test_real_engine import _let_programs_manage_objects, config_map, configmap
from .test_stack import Env

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

Obj = dict[str, Any]
PACK = """\
const { PolicyPack } = require("@pulumi/policy");
const isConfigMap = (args) => args.type === "kubernetes:core/v1:ConfigMap";
new PolicyPack("pko-configmaps", {
  policies: [
    {
      name: "no-forbidden-tier",
      description: "No ConfigMap may say tier: forbidden.",
      enforcementLevel: "mandatory",
      validateResource: (args, reportViolation) => {
        if (isConfigMap(args) && (args.props.data || {}).tier === "forbidden") {
          reportViolation("this ConfigMap's tier is forbidden");
        }
      },
    },
    {
      name: "configmaps-name-a-team",
      description: "A ConfigMap should carry a team label.",
      enforcementLevel: "advisory",
      validateResource: (args, reportViolation) => {
        if (isConfigMap(args) && !((args.props.metadata || {}).labels || {}).team) {
          reportViolation("no team label");
        }
      },
    },
  ],
});
"""
PYTHON_PACK = """\
from pulumi_policy import EnforcementLevel, PolicyPack, ResourceValidationPolicy


def is_config_map(args):
    return args.resource_type == "kubernetes:core/v1:ConfigMap"


def no_forbidden_tier(args, report_violation):
    if is_config_map(args) and (args.props.get("data") or {}).get("tier") == "forbidden":
        report_violation("this ConfigMap's tier is forbidden")


def names_a_team(args, report_violation):
    if is_config_map(args) and not ((args.props.get("metadata") or {}).get("labels") or {}).get("team"):
        report_violation("no team label")


PolicyPack("pko-configmaps-py", policies=[
    ResourceValidationPolicy(
        name="no-forbidden-tier",
        description="No ConfigMap may say tier: forbidden.",
        enforcement_level=EnforcementLevel.MANDATORY,
        validate=no_forbidden_tier,
    ),
    ResourceValidationPolicy(
        name="configmaps-name-a-team",
        description="A ConfigMap should carry a team label.",
        enforcement_level=EnforcementLevel.ADVISORY,
        validate=names_a_team,
    ),
])
"""


@dataclass(frozen=True)
class PolicyEngine(RealPulumi):
    """The real engine, with what a JavaScript pack needs outside the image (the Node.js host and
    Node.js on PATH, the image's SDK set on NODE_PATH) and the packs themselves: ``pack`` (JavaScript),
    ``python_pack`` (its virtualenv the pinned pulumi-policy's)."""

    node_dirs: tuple[Path, ...] = ()
    node_path: str = ""
    pack: Path = Path()
    python_pack: Path = Path()

    @property
    def path_dirs(self) -> list[Path]:
        return [*self.node_dirs, *super().path_dirs]

    @property
    def env(self) -> dict[str, str]:
        return {**super().env, "NODE_PATH": self.node_path, "PULUMI_IGNORE_AMBIENT_PLUGINS": "false"}


def make_policy_engine(base: Path) -> PolicyEngine:
    real = make_real_pulumi(base)
    runtimes = built("build-runtimes.sh")
    pack = base / "packs" / "configmaps"
    write_pack(pack, policy_sdk(runtimes), PACK, "pko-configmaps")
    python_pack = base / "packs" / "configmaps-py"
    write_python_pack(python_pack, PYTHON_PACK, python_policy_env(), "pko-configmaps-py")
    fields = {f.name: getattr(real, f.name) for f in dataclasses.fields(real)}
    return PolicyEngine(
        **fields,
        node_dirs=tuple(engine_dirs(runtimes)),
        node_path=str(runtimes / "node_modules"),
        pack=pack,
        python_pack=python_pack,
    )


KUBELET_OPTIONS = {"engine": make_policy_engine}
env = operator_env(Env, prepare=_let_programs_manage_objects)


def program(env: Env, name: str, tier: str) -> Obj:
    return {"resources": {"settings": config_map(env, f"{name}-settings", {"tier": tier})}}


async def ended_update(env: Env, name: str, stack: Obj) -> Obj:
    update = await env.get(env.updates, stack["status"]["lastUpdate"]["name"])
    assert update is not None
    return update


async def warnings(env: Env, name: str, policy: str) -> list[str]:
    async def probe() -> list[str] | None:
        found = [
            e["message"]
            for e in await env.events_for(name)
            if e.get("reason") == "PolicyViolation" and f"policy {policy} " in e.get("message", "")
        ]
        return found or None

    found: list[str] = await wait_until(f"a PolicyViolation Event for {policy}", probe, within=30)
    return found


async def stalled_until_fixed(env: Env, name: str, pack: Path, pack_name: str) -> None:
    """A Stack whose program breaks ``pack``'s mandatory policy is Stalled and creates nothing; fixed,
    it is Ready, the advisory violation on its Update and in an Event."""
    urn = f"urn:pulumi:dev::{name}::kubernetes:core/v1:ConfigMap::settings"
    await env.create_program(name, program(env, name, "forbidden"))
    await env.create_stack(
        name,
        {"programRef": {"name": name}, "policyPacks": [{"name": "configmaps", "path": str(pack)}]},
    )
    stack = await env.condition(name, "Stalled", "PolicyViolation", within=300)
    stalled = next(c for c in stack["status"]["conditions"] if c["type"] == "Stalled")
    for said in (f"{pack_name}@0.1.0", "no-forbidden-tier", urn, "this ConfigMap's tier is forbidden"):
        assert said in stalled["message"], stalled
    assert stack["status"]["lastFailure"]["reason"] == "PolicyViolation", stack["status"]
    assert await configmap(env, f"{name}-settings") is None, "created although a mandatory policy refused it"
    update = await ended_update(env, name, stack)
    listed = [(v["policy"], v["enforcementLevel"], v["urn"]) for v in update["status"]["policyViolations"]]
    assert listed == [("no-forbidden-tier", "mandatory", urn), ("configmaps-name-a-team", "advisory", urn)]
    (refused,) = await warnings(env, name, "no-forbidden-tier")
    assert "mandatory, the update was refused" in refused and urn in refused

    await env.programs.patch(name, {"program": program(env, name, "allowed")})
    stack = await env.condition(name, "Ready", "ProcessingCompleted", within=300)
    created = await configmap(env, f"{name}-settings")
    assert created is not None and created["data"] == {"tier": "allowed"}, created
    update = await ended_update(env, name, stack)
    listed = [(v["policy"], v["enforcementLevel"]) for v in update["status"]["policyViolations"]]
    assert (
        listed == [("configmaps-name-a-team", "advisory")] and update["status"]["policyViolationCount"] == 1
    )
    assert any("advisory, reported" in m for m in await warnings(env, name, "configmaps-name-a-team"))


async def test_a_mandatory_violation_stalls_the_stack_until_the_program_is_fixed(env: Env) -> None:
    await stalled_until_fixed(env, "policed", env.kubelet.pulumi.pack, "pko-configmaps")  # type: ignore[attr-defined]


async def test_a_python_packs_mandatory_violation_stalls_the_stack_until_the_program_is_fixed(
    env: Env,
) -> None:
    pack = env.kubelet.pulumi.python_pack  # type: ignore[attr-defined]
    await stalled_until_fixed(env, "policed-py", pack, "pko-configmaps-py")
