"""The one builder of Stack objects (``pulumi.com/v1``) for the tests and the tools: the object's shape
is written here once; what a Stack holds is what the caller passes.

A module whose Stacks share defaults binds them once (``functools.partial(stack, stack="org/project/dev")``)
or wraps :func:`stack` in its own signature, rather than writing the object out again.
"""

from __future__ import annotations

import uuid
from typing import Any

Obj = dict[str, Any]

API_VERSION = "pulumi.com/v1"


def stack(
    name: str = "my-stack",
    namespace: str = "ns",
    *,
    status: Obj | None = None,
    meta: Obj | None = None,
    **spec: Any,
) -> Obj:
    """A Stack ``namespace/name`` with ``spec`` (nothing added), ``meta`` on top of its name and namespace
    (labels, generation, finalizers, ...), and a ``status`` only if given."""
    obj: Obj = {
        "apiVersion": API_VERSION,
        "kind": "Stack",
        "metadata": {"name": name, "namespace": namespace, **(meta or {})},
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def unique_name(prefix: str) -> str:
    """``prefix-<8 hex>``: a name of a test's own, for Stacks created in a namespace tests share."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
