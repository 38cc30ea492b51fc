"""charts/pko, the Helm chart generated from config/ (hack/gen_helm.py), checked with the real helm.

helm is built from its Go module at the pinned version (hack/build-helm.sh, cached in the pko cache).
These tests render the chart with `helm template` and compare it object by object with what
`kubectl kustomize config/default` renders: with the default values they are the same objects (Helm's
`app.kubernetes.io/managed-by: Helm` in place of kustomize's, and the Namespace only with
namespace.create, since `helm install` needs the release namespace to exist first). The committed
chart is what the generator writes, byte for byte, and the generator refuses a config/ it would
misrepresent. Where each value lands: test_helm_operator_values.py; `helm install` on a cluster:
test_helm_install.py.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmtest import (
    CHART,
    REPO,
    as_helm_installs,
    by_key,
    config_default,
    config_namespace,
    key,
    manager,
    template,
)

from pko.devtools import gen_helm

# The first test that needs helm builds it when the cache has none (about 2 min cold on 2 cores, with an
# empty Go module cache): more than the suite's 300 s default leaves for a slow machine.
pytestmark = pytest.mark.timeout(900)


# ---------------------------------------------------------------- the default values are config/default


def test_default_values_render_config_default_object_for_object(helm_home: Path) -> None:
    rendered = by_key(template(helm_home))
    expected = by_key([as_helm_installs(o) for o in config_default()])
    namespace_key = ("Namespace", config_namespace(), None)
    # The release namespace exists before `helm install` creates anything: the chart renders it only
    # with namespace.create (next test); every other object is config/default's, field for field.
    assert set(expected) - set(rendered) == {namespace_key}
    assert set(rendered) - set(expected) == set()
    for k, obj in rendered.items():
        assert obj == expected[k], f"{k} differs from config/default's"


def test_namespace_create_renders_config_defaults_namespace_too(helm_home: Path) -> None:
    rendered = by_key(template(helm_home, "--set", "namespace.create=true"))
    expected = by_key([as_helm_installs(o) for o in config_default()])
    assert rendered == expected


def test_another_release_namespace_replaces_config_defaults_everywhere(helm_home: Path) -> None:
    old = config_namespace()
    objs = template(helm_home, "--set", "namespace.create=true", namespace="team-infra")
    for obj in objs:
        if obj["kind"] == "CustomResourceDefinition":
            continue
        if "namespace" in obj["metadata"]:
            assert obj["metadata"]["namespace"] == "team-infra", key(obj)
        for subject in obj.get("subjects", []):
            if subject["kind"] == "ServiceAccount":
                assert subject["namespace"] == "team-infra", key(obj)
        assert f"system:serviceaccount:{old}:" not in json.dumps(obj), key(obj)
    ns = next(o for o in objs if o["kind"] == "Namespace")
    assert ns["metadata"]["name"] == "team-infra"
    assert ns["metadata"]["labels"]["kubernetes.io/metadata.name"] == "team-infra"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    namespaced = {o["kind"] for o in objs if "namespace" in o["metadata"]}
    assert {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"} <= namespaced


# ---------------------------------------------------------------- the committed chart and its generator


def test_the_committed_chart_is_what_the_generator_writes() -> None:
    expected = gen_helm.expected_files("kubectl")
    stale = gen_helm.stale_files(expected)
    assert not stale, f"run hack/gen_helm.py: out of date: {[str(p.relative_to(REPO)) for p in stale]}"
    for path, text in expected.items():
        assert path.read_bytes() == text.encode(), path


@pytest.mark.parametrize(
    ("ref", "split"),
    [
        ("pko:latest", ("", "pko", "latest", "")),
        ("pko", ("", "pko", "", "")),
        ("registry.example:5000/platform/pko:v1", ("registry.example:5000", "platform/pko", "v1", "")),
        ("localhost/pko-agent@sha256:" + "0" * 64, ("localhost", "pko-agent", "", "sha256:" + "0" * 64)),
        (
            "registry.example/pko:0.1.0@sha256:" + "0" * 64,
            ("registry.example", "pko", "0.1.0", "sha256:" + "0" * 64),
        ),
        ("pulumi/pulumi-kubernetes-operator:v2.9.0", ("", "pulumi/pulumi-kubernetes-operator", "v2.9.0", "")),
    ],
)
def test_image_references_split_into_the_values_the_chart_joins(ref: str, split: tuple[str, ...]) -> None:
    image = gen_helm.parse_image(ref)
    assert (image["registry"], image["repository"], image["tag"], image["digest"]) == split
    assert gen_helm.join_image(image) == ref


@functools.cache
def config_renders() -> str:
    """gen_helm.render_config's two renders of config/default, as JSON text."""
    return json.dumps(gen_helm.render_config("kubectl"))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda c: c["args"].remove("--leader-elect"), "no --leader-elect"),
        (lambda c: c["env"].append({"name": "WATCH_NAMESPACE", "value": "x"}), "sets ['WATCH_NAMESPACE']"),
        (lambda c: c.pop("resources"), "lacks terminationGracePeriodSeconds, resources"),
        (lambda c: c.pop("livenessProbe"), "securityContext or a probe"),
        (lambda c: c["env"].append({"name": "WORKSPACE_IMAGE", "value": "x"}), "sets ['WORKSPACE_IMAGE']"),
        # Workspaces fetch artifacts through the Service this names: the chart renames it with the release.
        (
            lambda c: c["args"].__setitem__(
                [a.split("=")[0] for a in c["args"]].index("--program-fs-adv-addr"),
                "--program-fs-adv-addr=elsewhere.$(POD_NAMESPACE):80",
            ),
            "does not name a Service of config/",
        ),
    ],
)
def test_the_generator_refuses_a_config_it_would_misrepresent(change: Any, reason: str) -> None:
    objs, moved = json.loads(config_renders())  # a copy for each case to change
    for render in (objs, moved):  # as a change under config/ would show in both
        change(manager(render)[1])
    with pytest.raises(SystemExit, match=re.escape(reason)):
        gen_helm.build_chart(objs, moved, "0.0.0")


def test_chart_version_is_the_projects() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    from pko.version import VERSION

    assert chart["version"] == chart["appVersion"] == VERSION
