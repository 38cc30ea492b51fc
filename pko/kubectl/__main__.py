"""``kubectl-pko``: the kubectl plugin's entry point (``kubectl pko ...``; also ``python -m pko.kubectl``).

Parses the arguments before anything else is imported (``--help`` and usage errors answer at
once), then connects as kubectl would and runs the command. Every failure ends as an exit code of
:class:`~pko.kubectl.exitcodes.ExitCode` and one ``error: ...`` line on stderr, never a traceback:
a script reads the code, a person the line. ``version`` is the exception: it prints the plugin's
version whatever happens, the operator's as unknown when the cluster cannot be asked, and fails
only when ``--server`` asked for the operator's.
"""

from __future__ import annotations

import http.client
import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TextIO

from pko.kubectl.args import Options, parse
from pko.kubectl.exitcodes import ExitCode, PluginError

__all__ = ["failure", "main", "run"]


def _now() -> datetime:
    return datetime.now(UTC)


def run(options: Options, out: TextIO, err: TextIO, *, now: Callable[[], datetime] = _now) -> int:
    """Connect, run ``options.command``, and turn every failure into its exit code."""
    from pko.kubectl import kubeconfig
    from pko.kubectl.apiserver import ApiError, ApiServer
    from pko.kubectl.cluster import REQUEST_TIMEOUT, USER_AGENT, Cluster
    from pko.kubectl.commands import RUNNERS, Context, print_version

    if options.command == "version" and options.client_only:
        print_version(options, out, None)
        return int(ExitCode.OK)
    try:
        connection = kubeconfig.load(options.kubeconfig, options.context)
        try:
            api = ApiServer(connection.endpoint, USER_AGENT, REQUEST_TIMEOUT)
        except ValueError as exc:
            raise PluginError(ExitCode.API_ERROR, f"kubeconfig: {exc}") from None
        ctx = Context(Cluster(api), options.namespace or connection.namespace, out, err, now)
        return int(RUNNERS[options.command](options, ctx))
    except (PluginError, ApiError, OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
        code, message = failure(exc)
        if options.command == "version":
            print_version(options, out, None, message)
            if not options.server_required:
                return int(ExitCode.OK)
        err.write(f"error: {message}\n")
        return int(code)


def failure(exc: Exception) -> tuple[ExitCode, str]:
    """The exit code and message of a command's failure."""
    from pko.kubectl.apiserver import ApiError

    if isinstance(exc, PluginError):
        return exc.code, exc.message
    if isinstance(exc, ApiError):
        if exc.status == 403:
            # RBAC's or an admission policy's refusal: its message says what is missing.
            return ExitCode.FORBIDDEN, f"forbidden: {exc.message}"
        return ExitCode.API_ERROR, f"the apiserver refused the request: {exc.status} {exc.reason}"
    if isinstance(exc, json.JSONDecodeError):
        return ExitCode.API_ERROR, f"the apiserver's answer is not JSON: {exc}"
    return ExitCode.API_ERROR, f"cannot reach the apiserver: {exc or type(exc).__name__}"


def main(
    argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """The console script: ``sys.exit(main())``."""
    try:
        options = parse(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), argparse has printed it
        return exc.code if isinstance(exc.code, int) else int(ExitCode.USAGE)
    try:
        return run(options, stdout or sys.stdout, stderr or sys.stderr)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
