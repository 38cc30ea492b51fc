"""The names the plugin spells itself (to stay light at start-up) are the operator's. The Stack API's
vocabulary it reads from pko.api.stackterms instead (test_kubectl_layers)."""

from __future__ import annotations

import tomllib
from dataclasses import astuple
from pathlib import Path

from pko.controllers import resources
from pko.controllers.workspace.workloads import PULUMI_CONTAINER, pod_name
from pko.kubectl import cluster, logs
from pko.machinery.resource import PODS, Resource

from .stacks import update


def test_resources_annotation_and_workspace_names_agree() -> None:
    pairs = [
        (cluster.STACKS, resources.STACKS),
        (cluster.UPDATES, resources.UPDATES),
        (cluster.WORKSPACES, resources.WORKSPACES),
        (cluster.PODS, PODS),
        (cluster.DEPLOYMENTS, Resource("apps", "v1", "deployments", "Deployment")),
    ]
    for ours, operators in pairs:
        # The plugin's Resource (pko.kubectl.apiserver, without aiohttp) spells paths as the operator's.
        assert astuple(ours) == astuple(operators)
        assert (ours.api_version, ours.name) == (operators.api_version, operators.name)
        for namespace in (None, "team a/b"):
            assert ours.collection_path(namespace) == operators.collection_path(namespace)
        assert ours.object_path("ns", "n/ame?") == operators.object_path("ns", "n/ame?")
    assert logs.PULUMI_CONTAINER == PULUMI_CONTAINER
    assert logs.workspace_pod(update(), "web")[1] == pod_name("web")


def test_the_plugin_is_a_console_script() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["kubectl-pko"] == "pko.kubectl.__main__:main"
