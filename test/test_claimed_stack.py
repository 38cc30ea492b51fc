"""The Stack manifest the e2e suite and the node benchmarks apply (pko.devtools.stacks.claimed_stack):
a claim and a Stack that keeps its state there, valid against the Stack API, with each option where
the API reads it."""

from __future__ import annotations

import yaml
from pko.api.stack import StackSpec

from pko.devtools.stacks import claimed_stack


def test_the_stack_keeps_its_state_on_its_own_claim_and_is_a_valid_stack() -> None:
    claim, stack = yaml.safe_load_all(claimed_stack("app", "programRef:\n    name: app-program"))
    assert (claim["kind"], stack["kind"]) == ("PersistentVolumeClaim", "Stack")
    spec = stack["spec"]
    StackSpec.model_validate(spec)
    assert spec["programRef"] == {"name": "app-program"}
    assert spec["backend"] == "file:///state"
    pod = spec["workspaceTemplate"]["spec"]["podTemplate"]["spec"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"] == "app-state"
    assert pod["containers"][0]["volumeMounts"] == [{"name": "state", "mountPath": "/state"}]
    passphrase = {"type": "Literal", "literal": {"value": "e2e-passphrase"}}
    assert spec["envRefs"] == {"PULUMI_CONFIG_PASSPHRASE": passphrase}
    assert "config" not in spec and set(spec["workspaceTemplate"]["spec"]) == {"podTemplate"}


def test_config_env_and_workspace_fields_land_where_the_stack_reads_them() -> None:
    manifest = claimed_stack(
        "lang",
        "projectRepo: http://git.example/repo.git\n  branch: main\n  repoDir: go",
        passphrase="bench",
        config={"greeting": "hello: world"},
        env={"GOSUMDB": "off", "GOPROXY": "http://10.0.0.1:8080"},
        workspace={"image": "pko-workspace:dev", "imagePullPolicy": "IfNotPresent"},
    )
    _claim, stack = yaml.safe_load_all(manifest)
    spec = stack["spec"]
    StackSpec.model_validate(spec)
    source = (spec["projectRepo"], spec["branch"], spec["repoDir"])
    assert source == ("http://git.example/repo.git", "main", "go")
    assert spec["config"] == {"greeting": "hello: world"}
    assert {k: v["literal"]["value"] for k, v in spec["envRefs"].items()} == {
        "PULUMI_CONFIG_PASSPHRASE": "bench",
        "GOSUMDB": "off",
        "GOPROXY": "http://10.0.0.1:8080",
    }
    workspace = spec["workspaceTemplate"]["spec"]
    assert (workspace["image"], workspace["imagePullPolicy"]) == ("pko-workspace:dev", "IfNotPresent")
    volume = workspace["podTemplate"]["spec"]["volumes"][0]
    assert volume["persistentVolumeClaim"]["claimName"] == "lang-state"
