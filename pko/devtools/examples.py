"""The examples users apply (examples/, docs/examples.md), as tests apply them on pko's local node:
test/test_examples.py builds them, the e2e suite deploys them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def local_example(name: str, folder: Path, stack_ops: list[dict[str, Any]] | None = None) -> Path:
    """An overlay in ``folder`` of ``examples/<name>`` as written, with ``examples/components/local-node``
    and ``stack_ops`` (JSON patch operations on its Stacks: the addresses of the servers a test runs);
    ``kubectl kustomize`` it. Kustomize takes only relative paths to a base, so they are made relative."""
    folder.mkdir(parents=True, exist_ok=True)
    up = Path(os.path.relpath(EXAMPLES, folder))
    overlay: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [str(up / name)],
        "components": [str(up / "components" / "local-node")],
    }
    if stack_ops:
        overlay["patches"] = [{"target": {"kind": "Stack"}, "patch": yaml.safe_dump(stack_ops)}]
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return folder
