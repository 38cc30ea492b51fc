"""The agent's command line: ``agent init`` (fetch the program) and ``agent serve`` (the gRPC server).

Flags follow the Go agent so a workspace pod spec reads the same::

    agent serve --workspace /share/workspace --skip-install --env-file /share/.env \\
        --auth-mode kube --kube-audience <ws>.<ns> \\
        --kube-workspace-namespace <ns> --kube-workspace-name <ws> [--pulumi-log-level N]

A leading ``--`` (as tini passes it: ``tini /share/agent -- serve ...``) is ignored.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pko.agent.kubeapi import KubeAPI

AUTH_MODE_NONE = "none"
AUTH_MODE_KUBE = "kube"


def read_env_file(path: Path) -> dict[str, str]:
    """Parse a dotenv file (``KEY=value``, ``export KEY=value``, ``#`` comments, quoted values)."""
    out: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"{path}:{number}: expected KEY=value")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            quote, value = value[0], value[1:-1]
            if quote == '"':
                value = value.encode().decode("unicode_escape")
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        out[key] = value
    return out


def _add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-w", "--workspace", required=True, type=Path, help="the workspace (program) directory")
    p.add_argument("--skip-install", action="store_true", help="do not install project dependencies at start")
    p.add_argument("-s", "--stack", help="select (or create) this stack at start")
    p.add_argument("--secrets-provider", help="secrets provider for stacks the agent creates")
    p.add_argument("--backend-url", help="Pulumi backend URL (otherwise PULUMI_BACKEND_URL or Pulumi.yaml)")
    p.add_argument("--env-file", type=Path, help="environment file for Pulumi (a missing file is ignored)")
    p.add_argument("--host", default="0.0.0.0", help="bind address (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=50051, help="port (default 50051)")
    p.add_argument("--auth-mode", choices=[AUTH_MODE_NONE, AUTH_MODE_KUBE], default=AUTH_MODE_NONE)
    p.add_argument(
        "--kube-audience", action="append", default=[], help="token audience to require (repeatable)"
    )
    p.add_argument("--kube-workspace-namespace", default=os.environ.get("WORKSPACE_NAMESPACE", ""))
    p.add_argument("--kube-workspace-name", default=os.environ.get("WORKSPACE_NAME", ""))
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig for auth (default: $KUBECONFIG or in-cluster)")
    p.add_argument("--pulumi-log-level", type=int, default=0, help="Pulumi CLI verbosity (0: off)")
    p.add_argument("--pulumi-root", type=Path, help="directory holding bin/pulumi (default: pulumi on PATH)")
    p.add_argument(
        "--journal-dir",
        type=Path,
        help="where operations are journaled (default: .agent/operations beside the workspace, i.e. /share)",
    )
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=570.0,
        help="seconds a running operation gets to stop after SIGTERM (default 570; the pod allows 600)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        help="close a connection with no open call that sent nothing for this long, e.g. one that "
        "never sends the HTTP/2 preface (seconds, default 120)",
    )
    p.add_argument(
        "--keepalive-time",
        type=float,
        help="PING connections with open calls this often; close them when a PING goes unanswered "
        "for 20s (seconds, default 60)",
    )
    p.add_argument(
        "--metrics-bind-address",
        default="0",
        help="serve the agent's /metrics at host:port (default 0: not served)",
    )
    p.add_argument(
        "--metrics-secure",
        choices=["true", "false"],
        default="true",
        help="HTTPS to scrapers whose token may get /metrics (needs --auth-mode kube; default true); "
        "false: plain HTTP to anyone",
    )
    p.add_argument(
        "--metrics-cert-dir", type=Path, help="tls.crt and tls.key for /metrics (default: self-signed)"
    )
    p.add_argument("--log-level", default=os.environ.get("AGENT_LOG_LEVEL", "info"))
    p.add_argument("--log-format", choices=["json", "console"], default="json")


def build_parser() -> argparse.ArgumentParser:
    from pko.version import VERSION

    parser = argparse.ArgumentParser(prog="agent", description="Pulumi Kubernetes Operator workspace agent")
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="fetch the program source into the workspace")
    from pko.agent.init import add_init_arguments

    add_init_arguments(init)
    _add_serve_arguments(sub.add_parser("serve", help="serve the agent's gRPC API"))
    return parser


def _validate_serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.auth_mode == AUTH_MODE_KUBE:
        if not args.kube_audience:
            parser.error("--kube-audience is required when --auth-mode is kube")
        if not args.kube_workspace_namespace:
            parser.error("--kube-workspace-namespace is required when --auth-mode is kube")
        if not args.kube_workspace_name:
            parser.error("--kube-workspace-name is required when --auth-mode is kube")
    if args.metrics_bind_address not in ("", "0") and args.metrics_secure == "true":
        if args.auth_mode != AUTH_MODE_KUBE:
            parser.error(
                "a secure /metrics reviews tokens: it needs --auth-mode kube (or --metrics-secure=false)"
            )
    if not 0 < args.port < 65536:
        parser.error("--port must be between 1 and 65535")


async def run_serve(args: argparse.Namespace) -> int:
    # Start-up order is chosen for speed: the workspace is opened (a `pulumi version` process, on the
    # other core) as soon as the runner's module is loaded, and the rest (the server, the apiserver
    # client for auth: pko.agent.kubeapi, a few stdlib modules) is imported while it runs.
    from pko.agent.pulumirunner import PulumiRunner, RunnerError, RunnerSettings

    try:
        work_dir = args.workspace.resolve(strict=True)
    except OSError:
        print(f"agent: workspace {args.workspace} does not exist", file=sys.stderr)
        return 2
    env: dict[str, str] = {}
    if args.env_file is not None and args.env_file.exists():
        env = read_env_file(args.env_file)
    settings = RunnerSettings(
        work_dir=work_dir,
        policy_dir=args.workspace.parent / "policy",
        env_vars=env,
        pulumi_root=args.pulumi_root,
        pulumi_log_level=args.pulumi_log_level,
        backend_url=args.backend_url,
        secrets_provider=args.secrets_provider,
        stack_name=args.stack,
    )
    opening = asyncio.create_task(PulumiRunner.open(settings))
    await asyncio.sleep(0)  # let it start its process before the imports below hold the interpreter

    import structlog
    from pko.agent.journal import agent_state_dir
    from pko.agent.kubeapi import KubeConfigError, connect
    from pko.agent.server import ServeOptions, serve

    log = structlog.get_logger("pko.agent")
    api: KubeAPI | None = None
    authorizer = None
    try:
        if args.auth_mode == AUTH_MODE_KUBE:
            from pko.agent.auth import KubeAuthorizer

            api = connect(args.kubeconfig)
            authorizer = KubeAuthorizer(
                api=api,
                audiences=list(args.kube_audience),
                workspace_namespace=args.kube_workspace_namespace,
                workspace_name=args.kube_workspace_name,
            )
            log.info(
                "kubernetes authorization enabled",
                audiences=args.kube_audience,
                namespace=args.kube_workspace_namespace,
                workspace=args.kube_workspace_name,
            )
        limits = {
            name: value
            for name, value in (("idle_timeout", args.idle_timeout), ("keepalive_time", args.keepalive_time))
            if value
        }
        options = ServeOptions(
            runner=settings,
            host=args.host,
            port=args.port,
            journal_dir=args.journal_dir or agent_state_dir(work_dir) / "operations",
            shutdown_grace=args.shutdown_grace,
            skip_install=args.skip_install,
            authorizer=authorizer,
            metrics_address=args.metrics_bind_address,
            metrics_secure=args.metrics_secure == "true",
            metrics_cert_dir=args.metrics_cert_dir,
            **limits,
        )
        return await serve(options, runner=await opening)
    except RunnerError as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 1
    except KubeConfigError as exc:
        print(f"agent: --auth-mode kube: {exc}", file=sys.stderr)
        return 2
    finally:
        if not opening.done():
            opening.cancel()
        elif not opening.cancelled():
            opening.exception()  # retrieved: reported above, or moot after an earlier error
        if api is not None:
            await api.close()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    from pko.logging import configure_logging

    configure_logging(getattr(args, "log_level", "info"), getattr(args, "log_format", "json"))
    if args.command == "serve":
        _validate_serve(parser, args)
        return asyncio.run(run_serve(args))
    from pko.agent.init import run_init

    return run_init(args)
