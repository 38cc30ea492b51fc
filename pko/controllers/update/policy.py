"""Policy packs on an Update (pure): the packs its spec names as the agent's request carries them, and
the violations the agent reported as its status records them (bounded, :mod:`pko.api.limits`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pko.api.generated.pko.agent import v1 as pb
from pko.api.stackpolicypacks import ENFORCEMENT_LEVELS
from pko.controllers.bounds import bounded_list
from pko.machinery.resource import Obj

__all__ = ["request_packs", "violation_fields"]


def request_packs(spec: Mapping[str, Any]) -> list[pb.PolicyPack]:
    """``spec.policyPacks`` as the agent's PreviewRequest/UpRequest take them (config as JSON text); a
    pack from git or a Flux source is ``fetched``: the workspace pod put it in a directory of its own,
    ``path`` (a Flux source's ``dir``) inside."""
    packs = []
    for pack in spec.get("policyPacks") or []:
        config = pack.get("config")
        flux = pack.get("fluxSource")
        path = (flux or {}).get("dir") if flux is not None else pack.get("path")
        packs.append(
            pb.PolicyPack(
                name=str(pack.get("name") or ""),
                path=str(path or ""),
                config=json.dumps(config, sort_keys=True) if config is not None else "",
                fetched=pack.get("git") is not None or flux is not None,
            )
        )
    return packs


def _rank(violation: pb.PolicyViolation) -> int:
    level = violation.enforcement_level
    return ENFORCEMENT_LEVELS.index(level) if level in ENFORCEMENT_LEVELS else len(ENFORCEMENT_LEVELS)


def violation_fields(violations: Sequence[pb.PolicyViolation]) -> Obj:
    """``policyViolations`` (mandatory ones first, then in the engine's order; bounded as ``changes``
    are) and ``policyViolationCount``; nothing when the packs reported none."""
    if not violations:
        return {}
    entries = []
    for v in sorted(violations, key=_rank):
        entry: Obj = {
            "policyPack": v.policy_pack,
            "policy": v.policy,
            "enforcementLevel": v.enforcement_level,
            "message": v.message,
        }
        if v.policy_pack_version:
            entry["policyPackVersion"] = v.policy_pack_version
        if v.urn:
            entry["urn"] = v.urn
        entries.append(entry)
    listed = bounded_list(entries)
    return {"policyViolations": listed.entries, "policyViolationCount": listed.total}
