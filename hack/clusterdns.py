#!/usr/bin/env python3
"""Cluster DNS records for a local node: Services and Endpoints from the API, as a hosts file dnsmasq reads.

No CoreDNS package exists here, so ``hack/localnode.py`` runs dnsmasq (``--hostsdir``, which re-reads
changed files by itself, ``--no-resolv``: it never forwards a query) and this watcher, which writes:

* ``<svc>.<ns>.svc.cluster.local``: the ClusterIP, or for a headless Service its ready endpoints
  (also the not-ready ones when ``publishNotReadyAddresses`` is set), as CoreDNS answers;
* ``<hostname>.<svc>.<ns>.svc.cluster.local``: an endpoint that has a hostname (StatefulSet pods).

It lists Services and Endpoints every second and rewrites the file (atomically) only when the records
change. Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import ssl
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

DOMAIN = "cluster.local"


def _client(kubeconfig: Path) -> tuple[str, str, ssl.SSLContext]:
    cfg = json.loads(kubeconfig.read_text())
    cluster = cfg["clusters"][0]["cluster"]
    ctx = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    return cluster["server"], cfg["users"][0]["user"]["token"], ctx


def _get(server: str, token: str, ctx: ssl.SSLContext, path: str) -> dict[str, Any]:
    req = urllib.request.Request(server + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
        data: dict[str, Any] = json.load(r)
        return data


def records(services: list[dict[str, Any]], endpoints: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(ip, name) pairs for the hosts file, sorted."""
    by_key = {(e["metadata"]["namespace"], e["metadata"]["name"]): e for e in endpoints}
    out: set[tuple[str, str]] = set()
    for svc in services:
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        fqdn = f"{name}.{ns}.svc.{DOMAIN}"
        spec = svc.get("spec") or {}
        cluster_ip = spec.get("clusterIP")
        if cluster_ip and cluster_ip != "None":
            out.add((cluster_ip, fqdn))
            continue
        publish_all = bool(spec.get("publishNotReadyAddresses"))
        for subset in (by_key.get((ns, name)) or {}).get("subsets") or []:
            addresses = list(subset.get("addresses") or [])
            if publish_all:
                addresses += subset.get("notReadyAddresses") or []
            for address in addresses:
                out.add((address["ip"], fqdn))
                if address.get("hostname"):
                    out.add((address["ip"], f"{address['hostname']}.{fqdn}"))
    return sorted(out)


def write_if_changed(path: Path, lines: list[tuple[str, str]]) -> bool:
    text = "".join(f"{ip} {name}\n" for ip, name in lines)
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".hosts.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--hosts-dir", type=Path, required=True)
    p.add_argument("--interval", type=float, default=1.0)
    args = p.parse_args(argv)
    server, token, ctx = _client(args.kubeconfig)
    target = args.hosts_dir / "cluster.hosts"
    while True:
        try:
            services = _get(server, token, ctx, "/api/v1/services")["items"]
            endpoints = _get(server, token, ctx, "/api/v1/endpoints")["items"]
            if write_if_changed(target, records(services, endpoints)):
                print(f"clusterdns: {len(services)} services written", flush=True)
        except Exception as exc:
            print(f"clusterdns: {exc}", file=sys.stderr, flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
