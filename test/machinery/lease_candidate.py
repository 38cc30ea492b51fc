"""A leader-election candidate in its own process, so a test can SIGKILL it (no release).

Usage: python lease_candidate.py KUBECONFIG NAMESPACE LEASE IDENTITY LEASE_S RENEW_S RETRY_S
Prints ``LEADING`` (flushed) once it holds the Lease, then leads until killed.
"""

from __future__ import annotations

import asyncio
import sys

from kubernetes_asyncio import client, config

from pko.devtools.apiclient import stock_api_client
from pko.machinery.leaderelection import LeaderElectionConfig, LeaderElector


async def main(argv: list[str]) -> None:
    kubeconfig, namespace, lease, identity, lease_s, renew_s, retry_s = argv
    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    async with stock_api_client(cfg) as api:

        async def lead() -> None:
            print("LEADING", flush=True)
            await asyncio.Event().wait()

        elector = LeaderElector(
            api,
            LeaderElectionConfig(
                lease_name=lease,
                lease_namespace=namespace,
                identity=identity,
                lease_duration=float(lease_s),
                renew_deadline=float(renew_s),
                retry_period=float(retry_s),
            ),
            on_started_leading=lead,
        )
        await elector.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
