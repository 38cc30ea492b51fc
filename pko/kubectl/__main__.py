"""``kubectl-pko``: the kubectl plugin's entry point (``kubectl pko ...``; also ``python -m pko.kubectl``).

Parses the arguments before anything heavy is imported (``--help`` and usage errors answer at
once), then connects as kubectl would and runs the command on one event loop. Every failure ends
as an exit code of :class:`~pko.kubectl.exitcodes.ExitCode` and one ``error: ...`` line on stderr,
never a traceback: a script reads the code, a person the line.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TextIO

from pko.kubectl.args import Options, parse
from pko.kubectl.exitcodes import ExitCode, PluginError

__all__ = ["main", "run"]


def _now() -> datetime:
    return datetime.now(UTC)


async def run(options: Options, out: TextIO, err: TextIO, *, now: Callable[[], datetime] = _now) -> int:
    """Connect, run ``options.command``, and turn every failure into its exit code."""
    import aiohttp
    from kubernetes_asyncio.client import ApiException

    from pko.kubectl import kubeconfig
    from pko.kubectl.cluster import Cluster, open_api_client
    from pko.kubectl.commands import RUNNERS, Context

    try:
        connection = await kubeconfig.load(options.kubeconfig, options.context)
        async with open_api_client(connection.configuration) as api:
            ctx = Context(Cluster(api), options.namespace or connection.namespace, out, err, now)
            return int(await RUNNERS[options.command](options, ctx))
    except PluginError as exc:
        err.write(f"error: {exc.message}\n")
        return int(exc.code)
    except ApiException as exc:
        if exc.status == 403:
            # RBAC's or an admission policy's refusal: its message says what is missing.
            err.write(f"error: forbidden: {_status_message(exc)}\n")
            return int(ExitCode.FORBIDDEN)
        err.write(f"error: the apiserver refused the request: {exc.status} {exc.reason}\n")
        return int(ExitCode.API_ERROR)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        err.write(f"error: cannot reach the apiserver: {exc or type(exc).__name__}\n")
        return int(ExitCode.API_ERROR)


def _status_message(exc: Exception) -> str:
    """The message of the apiserver's Status body (else the exception's reason)."""
    import json

    body = getattr(exc, "body", None)
    try:
        data = json.loads(body) if isinstance(body, str | bytes) else None
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("message"):
        return str(data["message"])
    return str(getattr(exc, "reason", "") or exc)


def main(
    argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """The console script: ``sys.exit(main())``."""
    try:
        options = parse(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), argparse has printed it
        return exc.code if isinstance(exc.code, int) else int(ExitCode.USAGE)
    try:
        return asyncio.run(run(options, stdout or sys.stdout, stderr or sys.stderr))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
