"""The Go build and module caches on the workspace pod's ``cache`` volume (issue 44), as pure functions:
an emptyDir by default (the caches last as long as the pod), a claim the pod template names keeps them
across pods; the agent clears them when over their bound (agent/gocache.py, test/agent/test_gocache.py)."""

from __future__ import annotations

from typing import Any

from .builders import by_name, env_of, pod_spec, workspace

Obj = dict[str, Any]
CLAIM = {"name": "cache", "persistentVolumeClaim": {"claimName": "my-stack-go-cache"}}


def pulumi_of(spec: Obj) -> Obj:
    return by_name(spec["containers"], "pulumi")


def test_the_go_caches_are_on_the_cache_volume_an_empty_dir_by_default() -> None:
    spec = pod_spec(workspace({}))
    assert by_name(spec["volumes"], "cache") == {"name": "cache", "emptyDir": {}}
    pulumi = pulumi_of(spec)
    assert {"name": "cache", "mountPath": "/cache"} in pulumi["volumeMounts"]
    env = env_of(pulumi)
    assert env["GOCACHE"] == {"name": "GOCACHE", "value": "/cache/go-build"}
    assert env["GOMODCACHE"] == {"name": "GOMODCACHE", "value": "/cache/go-mod"}
    # Only the pulumi container builds: the agent's init containers do not mount it.
    assert all(m["name"] != "cache" for c in spec["initContainers"] for m in c["volumeMounts"])


def test_a_claim_in_the_pod_template_replaces_the_empty_dir() -> None:
    spec = pod_spec(workspace({"podTemplate": {"spec": {"volumes": [CLAIM]}}}))
    assert by_name(spec["volumes"], "cache") == CLAIM  # one source: a pod with two is refused
    assert {"name": "cache", "mountPath": "/cache"} in pulumi_of(spec)["volumeMounts"]
    # Other volumes keep the template merge's rule (fields merge; the share stays an emptyDir).
    assert by_name(spec["volumes"], "share") == {"name": "share", "emptyDir": {}}


def test_a_template_that_only_sizes_the_empty_dir_keeps_it() -> None:
    sized = {"name": "cache", "emptyDir": {"sizeLimit": "2Gi"}}
    spec = pod_spec(workspace({"podTemplate": {"spec": {"volumes": [sized]}}}))
    assert by_name(spec["volumes"], "cache") == sized


def test_the_users_own_cache_variables_win() -> None:
    spec = pod_spec(workspace({"env": [{"name": "GOCACHE", "value": "/elsewhere"}]}))
    env = env_of(pulumi_of(spec))
    assert env["GOCACHE"]["value"] == "/elsewhere" and env["GOMODCACHE"]["value"] == "/cache/go-mod"
    assert [e["name"] for e in pulumi_of(spec)["env"]].count("GOCACHE") == 1
