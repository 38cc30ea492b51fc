"""Which ref a name means: the one rule, git's own, for the operator and the agent alike.

The rule (``git help revisions``, git's rev-parse; go-git's ``ResolveRevision`` uses the same
``RefRevParseRules``): a name is looked up as each of these in turn, and the first that exists wins

1. ``<name>`` itself, when it is a full ref name (starts with ``refs/``) or ``HEAD``;
2. ``refs/<name>``;
3. ``refs/tags/<name>``;
4. ``refs/heads/<name>``;
5. ``refs/remotes/<name>``;
6. ``refs/remotes/<name>/HEAD``.

So tags come before branches: where a tag and a branch share a name, ``v1`` is the tag and the
branch is ``refs/heads/v1``. A Stack's ``spec.branch`` always means a branch, so the operator looks
it up by its full name (:func:`branch_ref`) and the rule's order never comes into play for it; the
workspace agent applies the rule to a Workspace's ``git.ref`` as ``git checkout`` would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar, cast

__all__ = ["branch_ref", "ref_candidates", "resolve_ref"]

K = TypeVar("K", bound=bytes)
V = TypeVar("V", bound=bytes)


def ref_candidates(name: str) -> list[str]:
    """The full ref names `name` may mean, in the order the rule (module docstring) tries them."""
    if not name:
        return []
    exact = [name] if name.startswith("refs/") or name == "HEAD" else []
    return [
        *exact,
        f"refs/{name}",
        f"refs/tags/{name}",
        f"refs/heads/{name}",
        f"refs/remotes/{name}",
        f"refs/remotes/{name}/HEAD",
    ]


def resolve_ref(refs: Mapping[K, V | None], name: str, *, peel: bool = False) -> tuple[K, V] | None:
    """The first of `name`'s candidates present in `refs` (full name to object id, as a remote
    advertises them), with its full name; None when the name means none of them. Empty values count
    as absent. With `peel`, an annotated tag's id is replaced by the commit it tags when the remote
    advertised it (``<ref>^{}``)."""
    for candidate in ref_candidates(name):
        key = cast(K, candidate.encode())
        value = refs.get(key)
        if value:
            peeled = refs.get(cast(K, key + b"^{}")) if peel else None
            return key, peeled or value
    return None


def branch_ref(branch: str) -> str:
    """The full name of branch `branch`: ``refs/heads/<branch>``, unless already a ``refs/`` name."""
    return branch if branch.startswith("refs/") else f"refs/heads/{branch}"
