"""The one builder of Stack objects (``pulumi.com/v1``) for the tests and the tools: the object's shape
is written here once; what a Stack holds is what the caller passes.

:func:`stack` is the object; :func:`claimed_stack` the manifest the e2e suite and the node benchmarks apply
(the Stack with its state on a claim of its own).

A module whose Stacks share defaults binds them once (``functools.partial(stack, stack="org/project/dev")``)
or wraps :func:`stack` in its own signature, rather than writing the object out again.
"""

from __future__ import annotations

import json
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


# The Stack the e2e suite and the node benchmarks (hack/bench/peer.py, languages.py) deploy, with its
# state on a claim of its own (the file backend at /state) and the passphrase as a literal: YAML text,
# since the tests edit it as users edit a manifest (a field added after ``destroyOnFinalize``, ...).
CLAIMED_STACK = """\
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}-state
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
apiVersion: pulumi.com/v1
kind: Stack
metadata:
  name: {name}
spec:
  serviceAccountName: pulumi
  stack: dev
  {source}
  backend: file:///state
  destroyOnFinalize: true
{config}  envRefs:
    PULUMI_CONFIG_PASSPHRASE:
      type: Literal
      literal:
        value: {passphrase}
{env}  workspaceTemplate:
    spec:
{workspace}      podTemplate:
        spec:
          containers:
            - name: pulumi
              volumeMounts:
                - name: state
                  mountPath: /state
          volumes:
            - name: state
              persistentVolumeClaim:
                claimName: {name}-state
"""


def claimed_stack(
    name: str,
    source: str,
    *,
    passphrase: str = "e2e-passphrase",
    config: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    workspace: dict[str, str] | None = None,
) -> str:
    """The PersistentVolumeClaim ``<name>-state`` and the Stack ``name`` keeping its state there, as YAML
    text (two documents): the Stack's ``source`` lines as a user writes them under ``spec`` (the first
    unindented, the others by two: ``"programRef:\\n    name: app"``), its ``config``, ``env``
    (more Literal variables of its workspace pod) and ``workspace`` (more fields of its
    ``workspaceTemplate.spec``: ``image``, ``imagePullPolicy``)."""

    def lines(indent: str, values: dict[str, str] | None) -> str:
        return "".join(f"{indent}{key}: {json.dumps(value)}\n" for key, value in (values or {}).items())

    return CLAIMED_STACK.format(
        name=name,
        source=source,
        passphrase=passphrase,
        config=f"  config:\n{lines('    ', config)}" if config else "",
        env="".join(
            f"    {key}:\n      type: Literal\n      literal:\n        value: {json.dumps(value)}\n"
            for key, value in (env or {}).items()
        ),
        workspace=lines("      ", workspace),
    )
