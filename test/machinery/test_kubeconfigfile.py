"""Kubeconfig files as both of pko's clients read them (pko.machinery.kubeconfigfile): merged as client-go
merges a ``:``-separated list, the current context's cluster and user with the directory of the file
each came from, another context when asked (the kubectl plugin's ``--context``) with its namespace,
and a broken file refused with what is wrong. What each client makes of the entries: test_kubeconfig.py
(the operator's), test/agent/test_kubeapi_config.py (the agent's) and
test/kubectl/test_kubectl_kubeconfig.py (the plugin's flags)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pko.machinery.kubeconfigfile import (
    ConfigError,
    ContextError,
    in_cluster_server,
    kubeconfig_paths,
    read_kubeconfig,
)

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, doc: Any) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def config(name: str, cluster: dict[str, Any], user: dict[str, Any] | None) -> dict[str, Any]:
    context: dict[str, Any] = {"cluster": name}
    doc: dict[str, Any] = {
        "current-context": name,
        "clusters": [{"name": name, "cluster": cluster}],
        "contexts": [{"name": name, "context": context}],
    }
    if user is not None:
        context["user"] = name
        doc["users"] = [{"name": name, "user": user}]
    return doc


def test_the_first_file_to_name_an_entry_or_the_current_context_wins(tmp_path: Path) -> None:
    first = write(tmp_path / "first", config("a", {"server": "https://first:6443"}, {"token": "one"}))
    second = write(
        tmp_path / "second",
        {
            "current-context": "b",
            "clusters": [
                {"name": "a", "cluster": {"server": "https://shadowed:6443"}},
                {"name": "b", "cluster": {"server": "https://second:6443"}},
            ],
            "users": [{"name": "b", "user": {"token": "two"}}],
            "contexts": [{"name": "b", "context": {"cluster": "b", "user": "b"}}],
        },
    )
    read = read_kubeconfig(kubeconfig_paths(f"{first}:{tmp_path / 'missing'}:{second}"))
    assert (read.context, read.cluster["server"], read.user) == ("a", "https://first:6443", {"token": "one"})
    read = read_kubeconfig([second, first])
    assert (read.context, read.cluster["server"], read.user) == ("b", "https://second:6443", {"token": "two"})


def test_files_are_relative_to_the_file_that_names_them_and_data_is_base64(tmp_path: Path) -> None:
    (tmp_path / "users").mkdir()
    clusters = write(
        tmp_path / "clusters",
        {
            "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"certificate-authority": "pki/ca.crt"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        },
    )
    cert = base64.b64encode(b"PEM").decode()
    user = {"tokenFile": "token", "client-key": "~/k", "client-certificate-data": cert}
    users = write(tmp_path / "users" / "config", {"users": [{"name": "u", "user": user}]})
    read = read_kubeconfig([clusters, users])
    assert read.cluster_path("certificate-authority") == tmp_path / "pki" / "ca.crt"
    assert read.user_path("tokenFile") == tmp_path / "users" / "token"
    assert read.user_path("client-key") == Path.home() / "k"
    assert read.user_data("client-certificate-data") == b"PEM"
    assert read.cluster_path("missing") is None and read.user_data("client-key-data") is None


def test_a_context_with_no_user_or_an_undefined_one_reads_as_none(tmp_path: Path) -> None:
    anonymous = read_kubeconfig([write(tmp_path / "a", config("a", {"server": "https://a:1"}, None))])
    assert (anonymous.user_name, anonymous.user) == ("", None)
    doc = config("b", {"server": "https://b:1"}, {"token": "t"})
    doc["users"][0]["name"] = "someone-else"
    undefined = read_kubeconfig([write(tmp_path / "b", doc)])
    assert (undefined.user_name, undefined.user) == ("b", None)


def contexts(current: str | None, *named: tuple[str, str | None]) -> dict[str, Any]:
    """A kubeconfig whose contexts ``named`` (name, namespace) each have a cluster of their name."""
    doc: dict[str, Any] = {
        "clusters": [{"name": n, "cluster": {"server": f"https://{n}:6443"}} for n, _ in named],
        "contexts": [
            {"name": n, "context": {"cluster": n, **({"namespace": ns} if ns else {})}} for n, ns in named
        ],
    }
    if current is not None:
        doc["current-context"] = current
    return doc


def test_a_context_asked_for_replaces_the_current_one_and_each_has_its_namespace(tmp_path: Path) -> None:
    first = write(tmp_path / "first", contexts("one", ("one", "team-a")))
    second = write(tmp_path / "second", contexts("two", ("two", None), ("one", "ignored")))
    read = read_kubeconfig([first, second])
    assert (read.context, read.cluster["server"], read.namespace) == ("one", "https://one:6443", "team-a")
    read = read_kubeconfig([first, second], "two")
    assert (read.context, read.cluster["server"], read.namespace) == ("two", "https://two:6443", "")
    no_current = write(tmp_path / "none", contexts(None, ("one", "x")))
    assert read_kubeconfig([no_current, second]).context == "two"  # the first current-context set
    assert read_kubeconfig([no_current], "one").namespace == "x"
    with pytest.raises(ContextError, match="has no current-context"):
        read_kubeconfig([no_current])
    with pytest.raises(ContextError, match="the context 'nope' does not exist"):
        read_kubeconfig([first, second], "nope")
    listed = contexts("one", ("one", None))
    listed["contexts"][0]["context"]["namespace"] = ["a"]
    with pytest.raises(ConfigError, match="the namespace of context 'one' is not a name"):
        read_kubeconfig([write(tmp_path / "bad", listed)])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read kubeconfig .*absent: No such file"),
        ("clusters: [\n", "not valid YAML"),
        ("{not json", "not valid JSON"),
        ("- a list\n", "is not a mapping"),
        ({"current-context": ""}, "has no current-context"),
        ({"current-context": "x", "contexts": []}, "the current context 'x' does not exist"),
        (
            {"current-context": "x", "contexts": [{"name": "x", "context": {"cluster": "c"}}]},
            "cluster 'c' of context 'x' not found",
        ),
        ({"current-context": "x", "clusters": [{"cluster": {}}]}, "every entry of clusters needs a name"),
        ({"current-context": "x", "users": [{"name": "u", "user": "me"}]}, "users 'u': user is not a"),
        (
            config("c", {"certificate-authority-data": "not base64!"}, None),
            "cluster 'c': certificate-authority-data is not base64",
        ),
    ],
)
def test_a_kubeconfig_that_cannot_be_used_says_why(tmp_path: Path, content: Any, message: str) -> None:
    path = tmp_path / "absent" if content is None else write(tmp_path / "config", content)
    with pytest.raises(ConfigError, match=message):
        read_kubeconfig([path]).cluster_data("certificate-authority-data")


def test_a_list_of_files_none_of_which_exist_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="none of the kubeconfig files exist"):
        read_kubeconfig([tmp_path / "a", tmp_path / "b"])


def test_in_cluster_the_server_is_the_service_environments() -> None:
    assert in_cluster_server({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}) == (
        "https://10.96.0.1:443"
    )
    assert in_cluster_server({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}) == (
        "https://[fd00::1]:6443"
    )
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_PORT must be set"):
        in_cluster_server({"KUBERNETES_SERVICE_HOST": "10.96.0.1"})


def test_the_agent_reads_kubeconfigs_without_the_operators_http_stack_or_yaml() -> None:
    """The agent imports this module (pko.agent.kubeapi): it must stay free of aiohttp (the operator's
    client) and, for the JSON kubeconfigs our tools write and in-cluster, of PyYAML."""
    script = "import sys, pko.agent.kubeapi\nprint(sorted({m.split('.')[0] for m in sys.modules}))\n"
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout.replace("'", '"')))
    assert not loaded & {"aiohttp", "yaml", "kubernetes_asyncio"}
