"""The command line: ``kubectl pko [flags] COMMAND [NAME] [flags]``, parsed into :class:`Options`.

kubectl passes a plugin its arguments untouched, so the plugin parses kubectl's own conventions
itself: ``-n``/``--namespace``, ``-A``/``--all-namespaces``, ``--context``, ``--kubeconfig``,
``-o json|yaml``, accepted before or after the command name (as kubectl accepts flags anywhere).
This module imports only ``argparse`` (and the version): ``--help`` and usage errors answer before
the kubeconfig is read.

A command is one :class:`CommandSpec` here and one runner in :mod:`pko.kubectl.commands`, with its
decisions in a pure module of its own.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from pko.version import VERSION

__all__ = ["COMMANDS", "DEFAULT_TIMEOUT", "CommandSpec", "Options", "build_parser", "duration", "parse"]

Output = Literal["", "json", "yaml"]
NameArg = Literal["required", "optional", "none"]


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """A subcommand: whether it takes a Stack name, ``-A``, ``-o``, and its own flags."""

    name: str
    help: str
    stack_name: NameArg = "required"
    all_namespaces: bool = False
    output: bool = False
    update_flag: bool = False
    digest_flag: bool = False
    wait_flag: bool = False
    version_flags: bool = False


COMMANDS: Final[tuple[CommandSpec, ...]] = (
    CommandSpec(
        "status",
        "a Stack's conditions, last and current Update, outputs (secrets masked), plan and drift; "
        "without NAME a table of the namespace's Stacks",
        stack_name="optional",
        all_namespaces=True,
        output=True,
    ),
    CommandSpec("why", "why a Stack is not Ready, in one paragraph, with what to do about it", output=True),
    CommandSpec(
        "logs",
        "the engine output of the Stack's running Update, else its last one (from the workspace pod's "
        "log; the Update's message when the log no longer holds it)",
        update_flag=True,
    ),
    CommandSpec("retry", "run the Stack again now: a new reconciliation request, which resets the backoff"),
    CommandSpec(
        "refresh",
        "run one pulumi refresh of the Stack (a new pulumi.com/refresh-request); --wait until it ran",
        wait_flag=True,
    ),
    CommandSpec(
        "cancel",
        "cancel the Stack's running Update (a new pulumi.com/cancel-request); --wait until it ended",
        wait_flag=True,
    ),
    CommandSpec(
        "approve",
        "show the plan the Stack awaits approval for and approve it (pulumi.com/approved-plan set to "
        "its digest; needs the verb approve on stacks.pulumi.com)",
        digest_flag=True,
    ),
    CommandSpec(
        "version",
        "the plugin's version and, when the cluster answers, the operator's (its Deployment's "
        "app.kubernetes.io/version label and image)",
        stack_name="none",
        output=True,
        version_flags=True,
    ),
)

DEFAULT_TIMEOUT: Final = 600.0
"""``--wait``'s default limit, in seconds (a refresh of a large stack takes minutes)."""

EXIT_CODES: Final = """exit codes:
  0  done; status/why: every Stack shown is Ready
  1  status/why: a Stack shown is not Ready; refresh --wait: the refresh failed
  2  usage error (bad arguments, unknown context)
  3  not found (the Stack, the Update, any engine output)
  4  refused, nothing written: approve without a plan awaiting approval, or --digest not the recorded one
  5  no usable kubeconfig, the apiserver unreachable, or the request failed (401, 5xx)
  6  forbidden (403) by RBAC or an admission policy, e.g. approve without the verb approve
  7  --wait: not done within --timeout
version exits 0 when the cluster cannot be asked; with --server it exits 5 then, and 3 when no
operator is found."""


@dataclass(frozen=True, slots=True)
class Options:
    """What to do: the command, the Stack, and where (``namespace`` None: the context's)."""

    command: str
    name: str | None = None
    namespace: str | None = None
    all_namespaces: bool = False
    context: str | None = None
    kubeconfig: str | None = None
    output: Output = ""
    update: str | None = None
    digest: str | None = None
    wait: bool = False
    timeout: float = DEFAULT_TIMEOUT
    client_only: bool = False
    server_required: bool = False


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_UNIT_SECONDS: Final = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def duration(text: str) -> float:
    """A kubectl (Go) duration in seconds: ``90s``, ``5m``, ``1h30m``, ``2.5m``; a bare number is
    seconds. Positive only."""
    text = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        seconds = float(text)
    else:
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise argparse.ArgumentTypeError(f"invalid duration {text!r} (e.g. 90s, 5m, 1h30m)")
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be positive")
    return seconds


def _add_connection_flags(parser: argparse.ArgumentParser, *, on_command: bool) -> None:
    """kubectl's flags; on a command their default is SUPPRESS, so the same flag given before the
    command name is not overwritten by the command's default."""
    default = argparse.SUPPRESS if on_command else None
    parser.add_argument("-n", "--namespace", default=default, help="the namespace (default: the context's)")
    parser.add_argument("--context", default=default, help="the kubeconfig context to use")
    parser.add_argument(
        "--kubeconfig", default=default, help="the kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl pko",
        description="Inspect and drive pko Stacks (pulumi.com/v1).",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_connection_flags(parser, on_command=False)
    parser.add_argument("--version", action="version", version=f"kubectl-pko {VERSION}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for spec in COMMANDS:
        sub = commands.add_parser(
            spec.name,
            help=spec.help,
            description=spec.help,
            epilog=EXIT_CODES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if spec.stack_name != "none":
            nargs = "?" if spec.stack_name == "optional" else None
            sub.add_argument("name", metavar="NAME", nargs=nargs, help="the Stack's name")
        _add_connection_flags(sub, on_command=True)
        if spec.all_namespaces:
            sub.add_argument(
                "-A", "--all-namespaces", action="store_true", help="the Stacks of every namespace"
            )
        if spec.output:
            sub.add_argument("-o", "--output", choices=["json", "yaml"], help="machine-readable output")
        if spec.update_flag:
            sub.add_argument("--update", metavar="UPDATE", help="this Update of the Stack instead")
        if spec.digest_flag:
            sub.add_argument(
                "--digest",
                metavar="DIGEST",
                help="approve only if this is the recorded plan's digest (the one you reviewed)",
            )
        if spec.wait_flag:
            sub.add_argument(
                "--wait", action="store_true", help="wait until the operator has carried out the request"
            )
            sub.add_argument(
                "--timeout",
                type=duration,
                metavar="DURATION",
                help="how long --wait waits (default 10m; e.g. 90s, 5m, 1h)",
            )
        if spec.version_flags:
            which = sub.add_mutually_exclusive_group()
            which.add_argument("--client", action="store_true", help="the plugin's version only")
            which.add_argument(
                "--server", action="store_true", help="fail (exit 5, or 3) when the operator's is unknown"
            )
    return parser


def parse(argv: Sequence[str]) -> Options:
    """The options of ``argv``; a usage error exits 2 (argparse's, and ours)."""
    parser = build_parser()
    ns = parser.parse_args(list(argv))
    options = Options(
        command=ns.command,
        name=getattr(ns, "name", None),
        namespace=getattr(ns, "namespace", None),
        all_namespaces=bool(getattr(ns, "all_namespaces", False)),
        context=getattr(ns, "context", None),
        kubeconfig=getattr(ns, "kubeconfig", None),
        output=getattr(ns, "output", None) or "",
        update=getattr(ns, "update", None),
        digest=getattr(ns, "digest", None),
        wait=bool(getattr(ns, "wait", False)),
        timeout=getattr(ns, "timeout", None) or DEFAULT_TIMEOUT,
        client_only=bool(getattr(ns, "client", False)),
        server_required=bool(getattr(ns, "server", False)),
    )
    if getattr(ns, "timeout", None) is not None and not options.wait:
        parser.error("--timeout is how long --wait waits: add --wait")
    if options.all_namespaces and options.name:
        parser.error("a Stack cannot be named across all namespaces: drop -A or NAME")
    return options
