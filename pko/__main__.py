"""The operator process: ``pko`` (console script) or ``python -m pko``.

Its settings (flags and environment variables, each declared once) are :mod:`pko.settings`'; this
module wires the process: the API client, the manager and the reconcilers, the signals.

Exit status: 0 after a clean shutdown on SIGTERM/SIGINT; 1 when leadership was lost (the pod is
restarted and campaigns again, as a controller-runtime operator does) or the manager failed; a
second SIGTERM/SIGINT during shutdown exits 1 at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import uuid
from collections.abc import Sequence
from typing import Literal, cast

import structlog

from pko.logging import configure_logging
from pko.machinery.kubeclient import ClientConfig, KubeClient
from pko.machinery.kubeconfig import load_client_config
from pko.machinery.manager import LeaderElectionLost, Manager
from pko.machinery.serving import parse_bind_address
from pko.machinery.servingcert import start_self_signed
from pko.settings import Settings, parse_duration, parse_settings

__all__ = ["Settings", "load_client_configuration", "main", "parse_duration", "parse_settings"]


async def load_client_configuration(kubeconfig: str | None) -> ClientConfig:
    """controller-runtime's order: ``--kubeconfig``/``$KUBECONFIG``, in-cluster, ``~/.kube/config``
    (:mod:`pko.machinery.kubeconfig`, which says when kubernetes-asyncio's loader is used instead)."""
    return await load_client_config(kubeconfig)


def _identity() -> str:
    """Unique per process (hostname_uuid, as controller-runtime): two processes never share a term."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


async def _serve(settings: Settings) -> int:
    """Run managers until a signal: one that loses its lease (the apiserver away past the renew
    deadline, the process frozen, another replica taking over) has stopped every reconcile when
    ``run`` raises, so a new manager campaigns again in this process. Exiting instead (as
    controller-runtime does) makes the kubelet restart the container with its crash-loop backoff,
    which grows to 5 minutes when an apiserver restarts several times within 10 minutes (an upgrade):
    the operator would sit out that backoff after the apiserver is back."""
    log = structlog.get_logger("pko")
    from pko.controllers import register  # after logging is configured: reconcilers may log at import

    cfg = await load_client_configuration(settings.kubeconfig)
    async with KubeClient(cfg) as api:
        loop = asyncio.get_running_loop()
        signals_seen = 0
        current: Manager | None = None

        def on_signal(signum: int) -> None:
            nonlocal signals_seen
            signals_seen += 1
            if signals_seen > 1:
                log.warning("second signal during shutdown; exiting now", signal=signal.Signals(signum).name)
                os._exit(1)
            log.info(
                "signal received; shutting down",
                signal=signal.Signals(signum).name,
                grace_period=settings.shutdown_grace_period,
            )
            if current is not None:
                current.stop()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        log.info(
            "starting",
            server=cfg.host,
            leader_elect=settings.leader_elect,
            watch_namespace=settings.watch_namespace or "*",
            watch_namespaces=list(settings.watch_namespaces) or None,
            watch_label_selector=settings.watch_label_selector,
            workspace_address_mode=settings.workspace_address_mode,
            program_fs_addr=settings.program_fs_addr,
        )
        try:
            while not signals_seen:
                current = Manager(api, settings.manager_options(_identity()))
                register(current, settings.controller_options())
                try:
                    await current.run()
                except LeaderElectionLost as exc:
                    if signals_seen:
                        break
                    log.warning("leader election lost; campaigning again", error=str(exc))
                    continue
                break
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
    return 0


def _start_certificate(settings: Settings) -> None:
    """When ``/metrics`` is to be served over HTTPS with a self-signed certificate, start making it
    (:func:`pko.machinery.servingcert.start_self_signed`): its child process then runs beside the
    reconcilers' imports, where it was between them and the campaign for the Lease. The manager
    takes the pair when it starts serving (and reports a bad address, as before)."""
    try:
        serving = parse_bind_address(settings.metrics_bind_address) is not None
    except ValueError:
        return
    if serving and settings.metrics_secure and not settings.metrics_cert_dir:
        start_self_signed()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``pko`` console script."""
    settings = parse_settings(argv)
    _start_certificate(settings)
    configure_logging(settings.log_level, cast(Literal["json", "console"], settings.log_format))
    try:
        code = asyncio.run(_serve(settings))
    except Exception:
        structlog.get_logger("pko").exception("manager failed")
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
