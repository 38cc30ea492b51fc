"""``--target`` URN sets, as pkg/resource/deploy's UrnTargets, and the dependency edges they follow.

A target containing ``*`` is a glob (``*`` matches within a URN segment, ``**`` anything); only
literal targets are checked for existence, as in checkTargets. The error texts are the engine's
(sdk/go/common/diag/errors.go, codes 2010, 2011, 2013 and 2014).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


class UrnTargets:
    """A mutable copy of the user's targets; dependents may be added as literals while an operation runs."""

    def __init__(self, urns_or_globs: Iterable[str]) -> None:
        self.literals: list[str] = []
        self._globs: dict[str, re.Pattern[str]] = {}
        for item in urns_or_globs:
            if "*" in item:
                self._globs[item] = _glob_pattern(item)
            else:
                self.literals.append(item)

    @property
    def constrained(self) -> bool:
        """Whether any target was given (an unconstrained set contains every URN)."""
        return bool(self.literals or self._globs)

    def contains(self, urn: str) -> bool:
        if not self.constrained or urn in self.literals:
            return True
        return any(pattern.match(urn) for pattern in self._globs.values())

    def add(self, urn: str) -> None:
        """Record a discovered dependent (``--target-dependents``); a no-op for an unconstrained set."""
        if self.constrained and urn not in self.literals:
            self.literals.append(urn)

    def copy(self) -> UrnTargets:
        clone = UrnTargets([])
        clone.literals = list(self.literals)
        clone._globs = dict(self._globs)
        return clone


def _glob_pattern(glob: str) -> re.Pattern[str]:
    segments = ["[^:]*".join(re.escape(part) for part in chunk.split("*")) for chunk in glob.split("**")]
    return re.compile("^" + ".*".join(segments) + "$")


def not_found_message(target: str) -> str:
    """checkTargets' diagnostic; the shell hint appears when the URN has no ``$`` (it may have been eaten)."""
    message = f"Target '{target}' could not be found in the stack."
    if "$" not in target:
        message += " Did you forget to escape $ in your shell?"
    return message


def untargeted_create_message(urn: str, dependency: str) -> str:
    return f"Resource '{urn}' depends on '{dependency}' which was was not specified in --target list."


def untargeted_delete_message(urn: str) -> str:
    return (
        f"Resource '{urn}' will be destroyed but was not specified in --target list.\n"
        "Either include resource in --target list or pass --target-dependents to proceed."
    )


def provider_urn(reference: str) -> str:
    """The URN part of a provider reference ``<urn>::<id>``."""
    return reference.rsplit("::", 1)[0] if reference else ""


def dependencies(res: dict[str, Any], with_provider: bool = False) -> list[str]:
    """GetAllDependencies of a state: parent, dependencies, deletedWith (and the provider, when asked)."""
    deps = [res["parent"]] if res.get("parent") else []
    deps += list(res.get("dependencies") or [])
    if res.get("deletedWith"):
        deps.append(res["deletedWith"])
    if with_provider and res.get("provider"):
        deps.append(provider_urn(res["provider"]))
    return deps


def dependents_closure(resources: list[dict[str, Any]], targets: UrnTargets) -> set[str]:
    """The targets and everything depending on them, transitively (getTargetDependents)."""
    selected = {res["urn"] for res in resources if targets.contains(res["urn"])}
    changed = True
    while changed:
        changed = False
        for res in resources:
            if res["urn"] not in selected and any(d in selected for d in dependencies(res, True)):
                selected.add(res["urn"])
                changed = True
    return selected
