"""Policy packs (issue 43) on the real Pulumi engine: the real operator, apiserver and
kube-controller-manager, and the play-kubelet running real agents with the CLI, the YAML and Node.js
language hosts and pulumi-kubernetes (as test_real_engine.py), and a JavaScript pack
(pko.devtools.policypacks) with a mandatory and an advisory policy over ConfigMaps.

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
from realpulumi import RealPulumi, make_real_pulumi

from pko.devtools.policypacks import built, engine_dirs, policy_sdk, write_pack
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


@dataclass(frozen=True)
class PolicyEngine(RealPulumi):
    """The real engine, with what a JavaScript pack needs outside the image (the Node.js host and
    Node.js on PATH, the image's SDK set on NODE_PATH) and the pack itself in ``pack``."""

    node_dirs: tuple[Path, ...] = ()
    node_path: str = ""
    pack: Path = Path()

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
    fields = {f.name: getattr(real, f.name) for f in dataclasses.fields(real)}
    return PolicyEngine(
        **fields,
        node_dirs=tuple(engine_dirs(runtimes)),
        node_path=str(runtimes / "node_modules"),
        pack=pack,
    )


KUBELET_OPTIONS = {"engine": make_policy_engine}
env = operator_env(Env, prepare=_let_programs_manage_objects)


def program(env: Env, tier: str) -> Obj:
    return {"resources": {"settings": config_map(env, "policed-settings", {"tier": tier})}}


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


async def test_a_mandatory_violation_stalls_the_stack_until_the_program_is_fixed(env: Env) -> None:
    pack = env.kubelet.pulumi.pack  # type: ignore[attr-defined]
    urn = "urn:pulumi:dev::policed::kubernetes:core/v1:ConfigMap::settings"
    await env.create_program("policed", program(env, "forbidden"))
    await env.create_stack(
        "policed",
        {"programRef": {"name": "policed"}, "policyPacks": [{"name": "configmaps", "path": str(pack)}]},
    )
    stack = await env.condition("policed", "Stalled", "PolicyViolation", within=300)
    stalled = next(c for c in stack["status"]["conditions"] if c["type"] == "Stalled")
    for said in ("pko-configmaps@0.1.0", "no-forbidden-tier", urn, "this ConfigMap's tier is forbidden"):
        assert said in stalled["message"], stalled
    assert stack["status"]["lastFailure"]["reason"] == "PolicyViolation", stack["status"]
    assert await configmap(env, "policed-settings") is None, "created although a mandatory policy refused it"
    update = await ended_update(env, "policed", stack)
    listed = [(v["policy"], v["enforcementLevel"], v["urn"]) for v in update["status"]["policyViolations"]]
    assert listed == [("no-forbidden-tier", "mandatory", urn), ("configmaps-name-a-team", "advisory", urn)]
    (refused,) = await warnings(env, "policed", "no-forbidden-tier")
    assert "mandatory, the update was refused" in refused and urn in refused

    await env.programs.patch("policed", {"program": program(env, "allowed")})
    stack = await env.condition("policed", "Ready", "ProcessingCompleted", within=300)
    created = await configmap(env, "policed-settings")
    assert created is not None and created["data"] == {"tier": "allowed"}, created
    update = await ended_update(env, "policed", stack)
    listed = [(v["policy"], v["enforcementLevel"]) for v in update["status"]["policyViolations"]]
    assert (
        listed == [("configmaps-name-a-team", "advisory")] and update["status"]["policyViolationCount"] == 1
    )
    assert any("advisory, reported" in m for m in await warnings(env, "policed", "configmaps-name-a-team"))
