"""Which kubeconfig files, context and namespace: kubectl's rules, through the plugin's flags
(``--kubeconfig``, ``--context``; ``$KUBECONFIG`` lists). How the files are read and merged:
test/machinery/test_kubeconfigfile.py (pko.machinery.kubeconfigfile, shared with the operator and the
agent)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pko.kubectl.exitcodes import ExitCode, PluginError
from pko.kubectl.kubeconfig import kubeconfig_files, load


def _config(current: str | None, *contexts: tuple[str, str | None]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "clusters": [{"name": name, "cluster": {"server": f"https://{name}:6443"}} for name, _ in contexts],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": "u", **({"namespace": ns} if ns else {})}}
            for name, ns in contexts
        ],
    }
    if current is not None:
        config["current-context"] = current
    return config


def _write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_files_flag_then_env_then_home(tmp_path: Path) -> None:
    a, b, home_cfg = tmp_path / "a", tmp_path / "b", tmp_path / ".kube" / "config"
    for path in (a, b, home_cfg):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    env = {"KUBECONFIG": f"{a}:{tmp_path / 'missing'}:{b}:{a}"}
    assert kubeconfig_files(str(b), env, tmp_path) == [b]
    assert kubeconfig_files(None, env, tmp_path) == [a, b]  # missing skipped, duplicates once
    assert kubeconfig_files(None, {}, tmp_path) == [home_cfg]
    assert kubeconfig_files(None, {"KUBECONFIG": str(tmp_path / "missing")}, tmp_path) == []


def test_an_explicit_kubeconfig_must_exist(tmp_path: Path) -> None:
    with pytest.raises(PluginError) as raised:
        kubeconfig_files(str(tmp_path / "nope"), {}, tmp_path)
    assert raised.value.code == ExitCode.USAGE


def test_first_current_context_and_first_context_of_a_name_win(tmp_path: Path) -> None:
    first = _write(tmp_path / "first", _config("one", ("one", "team-a")))
    second = _write(tmp_path / "second", _config("two", ("two", None), ("one", "ignored")))
    env = {"KUBECONFIG": f"{first}:{second}"}
    connection = load(None, None, env, tmp_path)
    assert (connection.endpoint.server, connection.namespace) == ("https://one:6443", "team-a")
    assert dict(connection.endpoint.headers)["Authorization"] == "Bearer t"
    connection = load(None, "two", env, tmp_path)  # --context
    assert (connection.endpoint.server, connection.namespace) == ("https://two:6443", "default")
    unset = _write(tmp_path / "unset", _config(None, ("one", "x")))
    connection = load(None, None, {"KUBECONFIG": f"{unset}:{second}"}, tmp_path)
    assert (connection.endpoint.server, connection.namespace) == ("https://two:6443", "default")
    connection = load(str(second), "one", env, tmp_path)  # --kubeconfig: that file alone
    assert (connection.endpoint.server, connection.namespace) == ("https://one:6443", "ignored")


def test_unknown_or_missing_context(tmp_path: Path) -> None:
    path = str(_write(tmp_path / "config", _config("one", ("one", None))))
    with pytest.raises(PluginError) as raised:
        load(path, "nope", {}, tmp_path)
    assert raised.value.code == ExitCode.USAGE
    assert "the context 'nope' does not exist" in str(raised.value)
    path = str(_write(tmp_path / "unset", _config(None, ("one", None))))
    with pytest.raises(PluginError) as raised:
        load(path, None, {}, tmp_path)
    assert raised.value.code == ExitCode.API_ERROR
    assert str(raised.value).endswith("has no current-context: pass --context")


def test_a_context_whose_user_no_file_defines_is_refused(tmp_path: Path) -> None:
    doc = _config("one", ("one", None))
    doc["users"] = []
    with pytest.raises(PluginError) as raised:
        load(str(_write(tmp_path / "config", doc)), None, {}, tmp_path)
    assert raised.value.code == ExitCode.API_ERROR
    assert "the kubeconfig has no user 'u'" in str(raised.value)


def test_no_kubeconfig_outside_a_pod_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PluginError) as raised:
        load(None, None, {"KUBECONFIG": str(tmp_path / "missing")}, tmp_path)
    assert raised.value.code == ExitCode.API_ERROR and "no kubeconfig" in str(raised.value)
