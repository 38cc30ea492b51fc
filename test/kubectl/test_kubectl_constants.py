"""The names the plugin spells itself (to stay light at start-up) are the operator's."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pko.api.stack import (
    APPROVED_PLAN_ANNOTATION,
    CANCEL_REQUEST_ANNOTATION,
    RECONCILE_REQUEST_ANNOTATION,
    REFRESH_REQUEST_ANNOTATION,
)

from pko.controllers import resources
from pko.controllers.stack.approval import AWAITING_APPROVAL
from pko.controllers.workspace.workloads import PULUMI_CONTAINER, pod_name
from pko.kubectl import actions, approval, cluster, logs, stackview

from .stacks import update


def test_resources_annotation_and_workspace_names_agree() -> None:
    assert (cluster.STACKS, cluster.UPDATES, cluster.WORKSPACES) == (
        resources.STACKS,
        resources.UPDATES,
        resources.WORKSPACES,
    )
    assert actions.RECONCILE_REQUEST_ANNOTATION == RECONCILE_REQUEST_ANNOTATION
    assert actions.REFRESH_REQUEST_ANNOTATION == REFRESH_REQUEST_ANNOTATION
    assert actions.CANCEL_REQUEST_ANNOTATION == CANCEL_REQUEST_ANNOTATION
    assert approval.APPROVED_PLAN_ANNOTATION == APPROVED_PLAN_ANNOTATION
    assert stackview.AWAITING_APPROVAL == AWAITING_APPROVAL
    assert logs.PULUMI_CONTAINER == PULUMI_CONTAINER
    assert logs.workspace_pod(update(), "web")[1] == pod_name("web")


def test_the_plugin_is_a_console_script() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["kubectl-pko"] == "pko.kubectl.__main__:main"
