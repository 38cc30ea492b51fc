"""Which kubeconfig files, context and namespace: kubectl's rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from pko.kubectl.exitcodes import ExitCode, PluginError
from pko.kubectl.kubeconfig import Selection, kubeconfig_files, select_context


def _config(current: str | None, *contexts: tuple[str, str | None]) -> dict[str, object]:
    config: dict[str, object] = {
        "contexts": [
            {"name": name, "context": {"cluster": "c", "user": "u", **({"namespace": ns} if ns else {})}}
            for name, ns in contexts
        ]
    }
    if current is not None:
        config["current-context"] = current
    return config


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


def test_first_current_context_and_first_context_of_a_name_win() -> None:
    first = _config("one", ("one", "team-a"))
    second = _config("two", ("two", None), ("one", "ignored"))
    assert select_context([first, second], None) == Selection("one", "team-a")
    assert select_context([_config(None, ("one", "x")), second], None) == Selection("two", "default")
    assert select_context([first, second], "two") == Selection("two", "default")


def test_unknown_or_missing_context() -> None:
    with pytest.raises(PluginError) as raised:
        select_context([_config("one", ("one", None))], "nope")
    assert raised.value.code == ExitCode.USAGE
    with pytest.raises(PluginError) as raised:
        select_context([_config(None, ("one", None))], None)
    assert raised.value.code == ExitCode.API_ERROR
