"""The command line: kubectl's flags before or after the command, and usage errors exit 2."""

from __future__ import annotations

import pytest

from pko.kubectl.__main__ import main
from pko.kubectl.args import COMMANDS, Options, parse
from pko.kubectl.commands import RUNNERS


def test_flags_after_the_command() -> None:
    assert parse(["status", "web", "-n", "prod", "--context", "c", "-o", "json"]) == Options(
        command="status", name="web", namespace="prod", context="c", output="json"
    )


def test_flags_before_the_command_are_kept() -> None:
    # A command's own default must not overwrite the same flag given before the command name.
    assert parse(["-n", "prod", "--kubeconfig", "/k", "why", "web"]) == Options(
        command="why", name="web", namespace="prod", kubeconfig="/k"
    )
    assert parse(["--namespace=a", "retry", "web", "-n", "b"]).namespace == "b"


def test_status_lists_without_a_name_and_across_namespaces() -> None:
    assert parse(["status"]) == Options(command="status")
    assert parse(["status", "-A", "-o", "yaml"]) == Options(
        command="status", all_namespaces=True, output="yaml"
    )
    assert parse(["logs", "web", "--update", "web-1"]).update == "web-1"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nope"],
        ["why"],  # NAME is required
        ["status", "web", "-A"],  # a name cannot be looked up across namespaces
        ["status", "-o", "wide"],
        ["retry", "web", "-A"],  # -A is only for status
        ["retry", "web", "-o", "json"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage: kubectl pko" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "exit codes:" in capsys.readouterr().out


def test_every_command_has_a_runner() -> None:
    assert {c.name for c in COMMANDS} == set(RUNNERS)
