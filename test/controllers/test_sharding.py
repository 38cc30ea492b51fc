"""Shards' decisions without a cluster: the selectors their informers use, the labels a Stack's
objects carry, the Lease each holds, and when an Update another shard runs is read again."""

from __future__ import annotations

from typing import Any

import pytest
from pko.api.stack import Stack

from pko.controllers.options import ControllerOptions
from pko.controllers.sharding import (
    FOREIGN_UPDATE_RECHECK,
    SHARD_LABEL,
    child_selectors,
    lease_name,
    own_program_url,
    recheck_foreign_update,
    shard_labels,
    shard_requirements,
    split_selector,
)
from pko.controllers.stack.updateobject import build_update
from pko.controllers.stack.workspaceobject import build_workspace
from pko.controllers.workspace.workloads import desired_service, desired_statefulset, parse_spec
from pko.settings.cli import parse_settings


def test_a_selector_splits_at_top_level_commas_only() -> None:
    assert split_selector("a=1, b in (x,y),!c") == ["a=1", "b in (x,y)", "!c"]
    assert split_selector("") == []


@pytest.mark.parametrize(
    ("selector", "kept"),
    [
        (f"{SHARD_LABEL}=a", f"{SHARD_LABEL}=a"),
        (f"!{SHARD_LABEL}", f"!{SHARD_LABEL}"),
        (f"team=x, {SHARD_LABEL} in (a,b)", f"{SHARD_LABEL} in (a,b)"),
        (f"{SHARD_LABEL}!=a,team", f"{SHARD_LABEL}!=a"),
        ("team=x", None),
        (f"{SHARD_LABEL}-old=a", None),  # another key that starts alike
        (None, None),
    ],
)
def test_the_children_are_watched_with_the_shard_requirements_alone(
    selector: str | None, kept: str | None
) -> None:
    assert shard_requirements(selector) == kept


def test_a_shard_scopes_workspaces_updates_and_their_objects_but_not_pods_or_programs() -> None:
    scoped = child_selectors(f"!{SHARD_LABEL}")
    assert set(scoped) == {
        "workspaces.auto.pulumi.com",
        "updates.auto.pulumi.com",
        "statefulsets.apps",
        "services",
    }
    assert set(scoped.values()) == {f"!{SHARD_LABEL}"}
    assert child_selectors("team=x") == {}


def test_each_selector_has_its_own_lease_and_no_selector_keeps_the_name() -> None:
    a, b, default = (
        lease_name("pko", s) for s in (f"{SHARD_LABEL}=a", f"{SHARD_LABEL}=b", f"!{SHARD_LABEL}")
    )
    assert len({a, b, default}) == 3 and all(n.startswith("pko-") for n in (a, b, default))
    assert lease_name("pko", f" {SHARD_LABEL}=a ") == a  # replicas of one shard share it
    assert lease_name("pko", None) == lease_name("pko", "") == "pko"


def test_the_settings_give_each_shard_its_lease_and_scoped_informers() -> None:
    settings = parse_settings(
        ["--leader-elect", "--leader-election-id", "pko", "--watch-label-selector", f"{SHARD_LABEL}=a"], {}
    )
    options = settings.manager_options("me")
    assert options.leader_election is not None
    assert options.leader_election.lease_name == lease_name("pko", f"{SHARD_LABEL}=a") != "pko"
    assert options.label_selectors["stacks.pulumi.com"] == f"{SHARD_LABEL}=a"
    assert options.label_selectors["updates.auto.pulumi.com"] == f"{SHARD_LABEL}=a"
    assert "pods" not in options.label_selectors and "programs.pulumi.com" not in options.label_selectors
    plain = parse_settings(["--leader-elect", "--leader-election-id", "pko"], {}).manager_options("me")
    assert plain.leader_election is not None and plain.leader_election.lease_name == "pko"
    assert plain.label_selectors == {}


def _stack(labels: dict[str, str] | None) -> Stack:
    return Stack.model_validate(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": "s", "namespace": "ns", "uid": "u1", "labels": labels},
            "spec": {"stack": "dev", "projectRepo": "https://example.com/r.git", "commit": "a" * 40},
        }
    )


def test_a_stacks_workspace_and_updates_carry_its_shard_label_and_no_other_of_its_labels() -> None:
    stack = _stack({SHARD_LABEL: "a", "team": "x"})
    workspace = build_workspace(stack, None)
    applied = {**workspace, "metadata": {**workspace["metadata"], "uid": "u3"}}
    update = build_update(stack, applied, "up", "m")
    for obj in (workspace, update):
        labels = obj["metadata"]["labels"]
        assert labels[SHARD_LABEL] == "a" and "team" not in labels
    assert SHARD_LABEL not in build_workspace(_stack(None), None)["metadata"]["labels"]


def test_a_workspaces_statefulset_and_service_carry_its_shard_but_its_pod_does_not() -> None:
    workspace: dict[str, Any] = {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": "s", "namespace": "ns", "uid": "u2", "labels": {SHARD_LABEL: "b"}},
        "spec": {"image": "pulumi/pulumi:latest"},
    }
    spec = parse_spec(workspace)
    statefulset = desired_statefulset(workspace, spec, ControllerOptions())
    assert statefulset["metadata"]["labels"][SHARD_LABEL] == "b"
    # A move relabels the StatefulSet, never its selector or pod template: the pod is not restarted.
    assert SHARD_LABEL not in statefulset["spec"]["selector"]["matchLabels"]
    assert SHARD_LABEL not in statefulset["spec"]["template"]["metadata"]["labels"]
    assert desired_service(workspace, spec)["metadata"]["labels"][SHARD_LABEL] == "b"
    assert shard_labels(workspace) == {SHARD_LABEL: "b"} and shard_labels(None) == {}


def test_only_an_update_in_flight_that_the_cache_lacks_is_read_again_on_a_timer() -> None:
    update = {"metadata": {"name": "u"}}
    assert recheck_foreign_update(update, cached=False, complete=False) == FOREIGN_UPDATE_RECHECK
    assert recheck_foreign_update(update, cached=True, complete=False) is None  # its watch wakes us
    assert recheck_foreign_update(update, cached=False, complete=True) is None  # recorded now
    assert recheck_foreign_update(None, cached=False, complete=False) is None  # gone: moved on


def test_a_programs_artifact_is_fetched_from_the_shards_own_server_when_its_address_is_set() -> None:
    url = "http://pko-b.pko-system:80/programs/ns/p/3"
    assert own_program_url(url, "pko-a.pko-system:80") == "http://pko-a.pko-system:80/programs/ns/p/3"
    assert own_program_url(url, "https://pko-a/") == "https://pko-a/programs/ns/p/3"
    assert own_program_url(url, "") == url  # the address the server bound: the status's as it is
    assert own_program_url("http://source-controller/gitrepository/x.tar.gz", "pko-a:80").endswith("x.tar.gz")
