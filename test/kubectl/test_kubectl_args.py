"""The command line: kubectl's flags before or after the command, and usage errors exit 2."""

from __future__ import annotations

import pytest

from pko.kubectl.__main__ import main
from pko.kubectl.args import COMMANDS, DEFAULT_TIMEOUT, Options, duration, parse
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
        ["retry", "web", "--wait"],  # only refresh and cancel wait
        ["approve", "web", "--wait"],
        ["refresh", "web", "--digest", "d"],
        ["refresh", "web", "--timeout", "5m"],  # --timeout without --wait
        ["cancel", "web", "--wait", "--timeout", "soon"],
        ["cancel", "web", "--wait", "--timeout", "0s"],
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


def test_approve_refresh_and_cancel_flags() -> None:
    assert parse(["approve", "web", "--digest", "sha256:ab"]) == Options(
        command="approve", name="web", digest="sha256:ab"
    )
    assert parse(["refresh", "web"]) == Options(command="refresh", name="web")
    assert parse(["refresh", "web", "--wait"]).timeout == DEFAULT_TIMEOUT == 600
    waiting = parse(["cancel", "web", "--wait", "--timeout", "90s"])
    assert (waiting.wait, waiting.timeout) == (True, 90)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("5m", 300), ("1h30m", 5400), ("2.5m", 150), ("45", 45), ("500ms", 0.5)],
)
def test_durations_as_kubectl_writes_them(text: str, seconds: float) -> None:
    assert duration(text) == seconds
