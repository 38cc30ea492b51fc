"""The examples users apply (examples/): each builds with kubectl's kustomize, as written and with the
local-node component, the apiserver accepts every object (a server-side dry run with the real CRDs), and
docs/examples.md lists exactly the folders there are. The e2e suite deploys every one of them for real
(docs/examples.md says where); this catches one breaking before that, a CRD change that refuses one, a
folder added without its docs row."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pko.devtools.examples import EXAMPLES, local_example
from pko.devtools.gitssh import fixed_host_key, known_hosts_line
from pko.devtools.kubectl import kubectl

REPO = Path(__file__).resolve().parent.parent
NOT_EXAMPLES = {"components", "programs"}  # what the examples share, not examples themselves
FOLDERS = sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir() and p.name not in NOT_EXAMPLES)
# Flux's kinds are served by Flux's source-controller, which the test apiserver does not have.
NOT_SERVED_HERE = {"source.toolkit.fluxcd.io"}


def _build(path: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize <path>` as objects (kustomize needs no cluster)."""
    proc = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def test_every_example_says_how_to_apply_it_and_has_a_docs_row() -> None:
    assert len(FOLDERS) >= 11, FOLDERS
    rows = set(re.findall(r"^\| `([a-z0-9-]+)` \|", (REPO / "docs" / "examples.md").read_text(), re.M))
    assert rows == set(FOLDERS), f"docs/examples.md rows {sorted(rows)} != folders {FOLDERS}"
    for name in FOLDERS:
        header = (EXAMPLES / name / "kustomization.yaml").read_text()
        assert f"-k examples/{name}" in header, f"examples/{name}: its header does not say how to apply it"


@pytest.mark.parametrize("name", FOLDERS)
def test_each_example_builds_with_a_stack_that_runs_as_the_workspace_account(name: str) -> None:
    objs = _build(EXAMPLES / name)
    stacks = [o for o in objs if o["kind"] == "Stack"]
    assert stacks, f"examples/{name} has no Stack"
    for s in stacks:
        assert s["apiVersion"] == "pulumi.com/v1", s
        assert s["spec"].get("serviceAccountName"), f"{name}: the Stack names no ServiceAccount"
        assert "OWNER" not in str(s["spec"].get("workspaceTemplate", "")), s
    # The program a git Stack names is in this repository, where the repository component says.
    for s in stacks:
        if s["spec"].get("projectRepo"):
            assert (EXAMPLES.parent / s["spec"]["repoDir"]).is_dir(), s["spec"]


# What examples/components/local-node puts in each example it changes, and in which kind: the node's
# own images, the bucket config/samples/s3 serves in the cluster, the host key of the e2e suite's git
# server over SSH. Found there with the component, not without.
LOCAL_NODE = {
    "nginx": ("Stack", "localhost/pko-base-python:bookworm"),
    "custom-workspace": ("Stack", "pko-workspace:dev"),
    "s3-backend": ("Stack", "seaweedfs.default.svc.cluster.local:8333"),
    "git-ssh": ("ConfigMap", "10.87.0.1 ssh-ed25519 "),
}


@pytest.mark.parametrize("name", sorted(LOCAL_NODE))
def test_the_local_node_component_changes_one_object(name: str, tmp_path: Path) -> None:
    kind, text = LOCAL_NODE[name]
    overlay = local_example(name, tmp_path / name)
    as_written, local = _build(EXAMPLES / name), _build(overlay)
    assert [(o["kind"], o["metadata"]["name"]) for o in local] == [
        (o["kind"], o["metadata"]["name"]) for o in as_written
    ]
    changed = [o for o, w in zip(local, as_written, strict=True) if o != w]
    assert [o["kind"] for o in changed] == [kind], f"examples/{name}: the component changed {changed}"
    assert text in str(changed) and text not in str(as_written), changed


def test_the_git_ssh_host_key_in_the_component_is_the_e2e_servers(tmp_path: Path) -> None:
    """The known_hosts line the component writes is the one e2e's git server over SSH presents."""
    (known,) = [o for o in _build(local_example("git-ssh", tmp_path)) if o["kind"] == "ConfigMap"]
    line = known_hosts_line("10.87.0.1", 22, fixed_host_key("e2e git-ssh"))
    assert known["data"]["known_hosts"].strip() == line.strip()


@pytest.mark.cluster
def test_the_apiserver_accepts_every_example(cluster: Any, crds: list[str], namespace: str) -> None:
    for name in FOLDERS:
        objs = [o for o in _build(EXAMPLES / name) if o["apiVersion"].split("/")[0] not in NOT_SERVED_HERE]
        text = yaml.safe_dump_all(objs)
        kubectl(cluster, "apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-", input=text)
