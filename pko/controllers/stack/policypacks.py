"""The policy packs an Update runs: the Stack's own and those its WorkspaceTemplates enforce (pure;
issue 43).

A platform team enforces packs with ``spec.policyPacks`` of a WorkspaceTemplate: the operator's
default template (``--default-workspace-template``: every Stack the operator reconciles) or the one
a Stack references. The Update runs the merged list: the enforced packs first (the default
template's, then the referenced one's), then the Stack's own. Invariants: a Stack cannot remove or
weaken an enforced pack (a pack of the same name on the Stack is dropped and named in
:attr:`Merged.overridden`; a Stack's ``updateTemplate`` cannot remove one either, the packs are set
after it is merged), and names are unique in the result (a name in two templates: the default
template's wins, a referenced template being the namespace's to write).

:attr:`Merged.digest` covers the enforced packs only; :func:`packs_digest` adds the commit each pack
from git runs at, or the digest of each Flux source's artifact (its own or an enforced one: a branch
moves without a new generation). The Stack
records that with each Update, and a new digest is a reason to run again (a change of the Stack's
own packs' spec is a new generation).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from pko.api.stack import Stack
from pko.api.stackpolicypacks import PolicyPack
from pko.api.validation import format_errors, policy_pack_errors

__all__ = ["Enforced", "Merged", "enforced_packs", "git_packs", "merge_policy_packs", "packs_digest"]


@dataclass(frozen=True, slots=True)
class Enforced:
    """A pack a WorkspaceTemplate enforces; ``source`` names the template (``namespace/name``)."""

    pack: PolicyPack
    source: str


@dataclass(frozen=True, slots=True)
class Merged:
    """The packs to run, in order; which came from which template; the Stack's packs dropped
    because a template enforces one of the same name; the digest of the enforced ones."""

    packs: tuple[PolicyPack, ...]
    sources: Mapping[str, str]
    overridden: tuple[str, ...]
    digest: str


def enforced_packs(source: str, spec: Mapping[str, Any]) -> tuple[Enforced, ...]:
    """The packs the template ``source`` (its spec as read) enforces. Raises ValueError naming the
    template when one is not a valid pack (the CRD's schema of a template requires no field)."""
    found: list[Enforced] = []
    for index, raw in enumerate(spec.get("policyPacks") or []):
        try:
            pack = PolicyPack.model_validate(raw)
        except ValidationError as err:
            problem = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
            raise ValueError(
                f'WorkspaceTemplate "{source}" spec.policyPacks[{index}] is not a policy pack: {problem}'
            ) from None
        errors = policy_pack_errors(pack, f"spec.policyPacks[{index}]")
        if errors:
            raise ValueError(f'WorkspaceTemplate "{source}" {format_errors(errors)}')
        found.append(Enforced(pack, source))
    return tuple(found)


def merge_policy_packs(enforced: Sequence[Enforced], own: Sequence[PolicyPack] | None) -> Merged:
    """The packs an Update runs: ``enforced`` (highest precedence first) then the Stack's ``own``."""
    packs: list[PolicyPack] = []
    sources: dict[str, str] = {}
    for item in enforced:
        if item.pack.name not in sources:
            packs.append(item.pack)
            sources[item.pack.name] = item.source
    overridden = tuple(pack.name for pack in own or () if pack.name in sources)
    packs += [pack for pack in own or () if pack.name not in sources]
    return Merged(tuple(packs), sources, overridden, _digest([p for p in packs if p.name in sources]))


def git_packs(enforced: Sequence[Enforced], stack: Stack) -> tuple[PolicyPack, ...]:
    """The packs the Stack's previews and ups run that come from a source of their own, git or a Flux
    source (the enforced ones and its own: its ``updateTemplate``'s when that names some, as the Update
    runs them): what the Stack resolves and its workspace pod fetches. Packs the template names that
    are no packs are left to the Update to refuse."""
    templated = ((stack.spec.update_template or {}).get("spec") or {}).get("policyPacks")
    own = stack.spec.policy_packs
    if templated is not None:
        try:
            own = [PolicyPack.model_validate(raw) for raw in templated]
        except ValidationError:
            own = []
    packs = merge_policy_packs(enforced, own).packs
    return tuple(pack for pack in packs if pack.git is not None or pack.flux_source is not None)


def packs_digest(enforced: Sequence[Enforced], commits: Mapping[str, str]) -> str:
    """What the Stack records with a preview or up and compares: the enforced packs' digest and, when
    packs come from git, the commit of each (``commits``, by pack name); "" for neither (so a Stack
    without packs from git keeps the digest it had)."""
    base = merge_policy_packs(enforced, ()).digest
    if not commits:
        return base
    text = json.dumps({"enforced": base, "commits": dict(commits)}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def _digest(packs: Sequence[PolicyPack]) -> str:
    if not packs:
        return ""
    text = json.dumps([p.wire() for p in packs], sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]
